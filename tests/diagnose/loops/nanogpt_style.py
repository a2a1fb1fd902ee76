"""A nanoGPT-style train.py, in its shape (our code): no DataLoader at all; ``get_batch()`` draws
random offsets into a ``np.memmap`` of uint8 tokens (re-opened every call, as nanoGPT does, to
avoid a memory leak) and stacks int64 windows; gradient accumulation; a ``torch.autocast``
context (bf16 where asked, else nullcontext); a GradScaler enabled only for fp16;
``clip_grad_norm_``; ``zero_grad(set_to_none=True)``; a warmup + cosine lr set by hand on the
param groups; ``loss.item()`` logged every ``log_interval`` iterations. The tokens are this
Python's standard-library sources (looptune's offline pystdlib corpus), written to a .bin file."""
import argparse
import math
import os
import tempfile
import time
from contextlib import nullcontext

import numpy as np
import torch

from looptune.models import GPT, GPTConfig, lm_loss
from looptune.data.text import load_corpus


def parse(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--batch_size", type=int, default=16)
    p.add_argument("--block_size", type=int, default=64)
    p.add_argument("--gradient_accumulation_steps", type=int, default=2)
    p.add_argument("--max_iters", type=int, default=2000)
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--log_interval", type=int, default=10)
    p.add_argument("--out_dir", default=None)
    return p.parse_args(argv)


def prepare(args):
    out = args.out_dir or tempfile.mkdtemp(prefix="nanogpt-")
    os.makedirs(out, exist_ok=True)  # as nanoGPT does
    path = os.path.join(out, "train.bin")
    if not os.path.exists(path):
        np.frombuffer(load_corpus("pystdlib", max_bytes=1 << 19).data, dtype=np.uint8).tofile(path)
    return path


def batcher(args, path):
    def get_batch():
        data = np.memmap(path, dtype=np.uint8, mode="r")  # nanoGPT: a new memmap every batch
        ix = torch.randint(len(data) - args.block_size, (args.batch_size,))
        x = torch.stack([torch.from_numpy(data[i:i + args.block_size].astype(np.int64)) for i in ix])
        y = torch.stack([torch.from_numpy(data[i + 1:i + 1 + args.block_size].astype(np.int64))
                         for i in ix])
        return x, y

    return get_batch


def get_lr(it, learning_rate=1e-3, warmup_iters=20, lr_decay_iters=2000, min_lr=1e-4):
    if it < warmup_iters:
        return learning_rate * (it + 1) / (warmup_iters + 1)
    ratio = min(1.0, (it - warmup_iters) / (lr_decay_iters - warmup_iters))
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (learning_rate - min_lr)


def build(args):
    torch.manual_seed(1337)
    model = GPT(GPTConfig(context=args.block_size, n_layer=2, n_head=4, n_embd=128))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.99), weight_decay=0.1)
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[args.dtype]
    ctx = nullcontext() if dtype == torch.float32 else torch.autocast("cpu", dtype=dtype)
    scaler = torch.amp.GradScaler("cpu", enabled=args.dtype == "float16")
    return model, optimizer, ctx, scaler


def update(model, optimizer, scaler):
    """The end of an iteration: unscale, clip, step, update the scale, drop the grads."""
    scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)


def parts(argv=None):
    """(batches, step(batch)) for benchmarks/diagnose_fidelity.py: get_batch() and one iteration
    (all micro-steps on the same batch) with the objects main() uses."""
    args = parse(argv)
    get_batch = batcher(args, prepare(args))
    model, optimizer, ctx, scaler = build(args)

    def batches():
        while True:
            yield get_batch()

    def step(batch):
        x, y = batch
        for _ in range(args.gradient_accumulation_steps):
            with ctx:
                loss = lm_loss(model(x), y) / args.gradient_accumulation_steps
            scaler.scale(loss).backward()
        update(model, optimizer, scaler)
        return loss.item()

    return batches(), step, args.gradient_accumulation_steps


def main(argv=None):
    args = parse(argv)
    get_batch = batcher(args, prepare(args))
    model, optimizer, ctx, scaler = build(args)
    X, Y = get_batch()
    t0 = time.time()
    for iter_num in range(args.max_iters):
        for group in optimizer.param_groups:
            group["lr"] = get_lr(iter_num)
        for _ in range(args.gradient_accumulation_steps):
            with ctx:
                loss = lm_loss(model(X), Y) / args.gradient_accumulation_steps
            X, Y = get_batch()  # prefetch the next batch while... (on CPU: simply next)
            scaler.scale(loss).backward()
        update(model, optimizer, scaler)
        if iter_num % args.log_interval == 0:
            t1 = time.time()
            print(f"iter {iter_num}: loss {loss.item() * args.gradient_accumulation_steps:.4f}, "
                  f"time {(t1 - t0) * 1000:.2f}ms")
            t0 = t1


if __name__ == "__main__":
    main()
