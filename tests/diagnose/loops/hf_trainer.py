"""A Hugging Face ``transformers.Trainer`` run, in its shape (our code): a tiny GPT-2 built from
a ``GPT2Config`` (no download), ``TrainingArguments(max_steps=..., use_cpu=True,
report_to="none")``, a Dataset that tokenizes a line of text per sample into ``input_ids`` and
``labels`` dicts, the Trainer's default collator. With ``--callback`` the run carries looptune's
``DiagnoseCallback`` instead of being run under ``looptune diagnose``."""
import argparse
import tempfile
import time

import torch
from torch.utils.data import DataLoader, Dataset
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

from looptune.data.text import load_corpus


class Lines(Dataset):
    def __init__(self, n: int, length: int) -> None:
        text = load_corpus("pystdlib", max_bytes=1 << 18).data.decode("utf-8", "replace")
        self.lines = [ln for ln in text.splitlines() if ln.strip()][:n]
        self.length = length

    def __len__(self) -> int:
        return len(self.lines)

    def __getitem__(self, i: int):
        ids = [min(b, 255) for b in self.lines[i].encode("utf-8")][: self.length]  # "tokenize"
        ids += [0] * (self.length - len(ids))
        ids = torch.tensor(ids)
        return {"input_ids": ids, "labels": ids.clone()}


def parse(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--samples", type=int, default=4096)
    p.add_argument("--length", type=int, default=64)
    p.add_argument("--max-steps", type=int, default=200)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--callback", action="store_true")
    return p.parse_args(argv)


def model():
    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(vocab_size=256, n_positions=128, n_embd=64, n_layer=2,
                                      n_head=2))


def trainer(args, out_dir, dataset, callbacks=()):
    targs = TrainingArguments(output_dir=out_dir, max_steps=args.max_steps,
                              per_device_train_batch_size=args.batch_size, learning_rate=1e-3,
                              use_cpu=True, report_to="none", save_strategy="no",
                              logging_steps=50, disable_tqdm=True, seed=0)
    return Trainer(model=model(), args=targs, train_dataset=dataset, callbacks=list(callbacks))


def parts(argv=None):
    """(loader, step(batch)) for benchmarks/diagnose_fidelity.py: the Trainer's own DataLoader."""
    args = parse(argv)
    t = trainer(args, tempfile.mkdtemp(), Lines(args.samples, args.length))
    return t.get_train_dataloader(), None


def framework_step_ms(argv, batch, steps):
    """ms per step of ``Trainer.train()`` itself fed one fixed batch from memory: the Trainer's
    per-step machinery (callbacks, loss tracking, Accelerate's wrappers) is part of the step."""
    args = parse(argv)
    args.max_steps = steps + 4

    class Fixed(Dataset):  # the batch's rows, so the Trainer's loader re-makes the same batch
        def __len__(self):
            return args.max_steps * args.batch_size

        def __getitem__(self, i):
            return {k: v[i % len(v)] for k, v in batch.items()}

    ends = []

    class Clock(TrainerCallback):
        def on_step_end(self, *_args, **_kwargs):
            ends.append(time.perf_counter())

    with tempfile.TemporaryDirectory() as out_dir:
        t = trainer(args, out_dir, Fixed(), [Clock()])
        cached = [b for b in DataLoader(Fixed(), batch_size=args.batch_size,
                                        collate_fn=t.data_collator)]
        t.get_train_dataloader = lambda: t.accelerator.prepare(DataLoader(cached, batch_size=None))
        t.train()
    return [(b - a) * 1e3 for a, b in zip(ends[3:], ends[4:])]  # 3 warm-up steps left out


def main(argv=None):
    args = parse(argv)
    callbacks = []
    if args.callback:
        from looptune.integrations.transformers import DiagnoseCallback

        callbacks.append(DiagnoseCallback(warmup=3, steps=20))
    with tempfile.TemporaryDirectory() as out_dir:
        trainer(args, out_dir, Lines(args.samples, args.length), callbacks).train()
    return callbacks


if __name__ == "__main__":
    main()
