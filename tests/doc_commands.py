"""The `looptune ...` commands that README.md and docs/ show, and a folder holding what their
placeholders name, for the tests that parse them (tests/test_docs.py) and run them
(tests/integration/test_readme_quickstart.py, tests/integration/test_docs_commands.py).

Placeholders: `train.py` (a training script taking `--lr`), `train_ddp.py` (a DDP script taking
`--epochs`, run under torchrun), `-m mypackage.train`, `mydata:make_dataset` and
`mymodel:make_model`, and `DIR`: the MNIST files with an image folder's train/ and test/ beside
them (so every page's `--data DIR` finds what it needs)."""

from __future__ import annotations

import re
import shlex
import shutil
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
FENCE = re.compile(r"^```(\w*)\s*\n(.*?)^```", re.M | re.S)

TRAIN = '''
import argparse
import torch
from torch import nn

p = argparse.ArgumentParser()
p.add_argument("--lr", type=float, default=1e-3)
args = p.parse_args()


class Noisy(torch.utils.data.Dataset):  # per-sample work in __getitem__, as people write it
    def __init__(self):
        g = torch.Generator().manual_seed(0)
        self.x, self.y = torch.randn(4096, 64, generator=g), torch.randint(0, 4, (4096,), generator=g)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        x = self.x[i]
        for _ in range(20):
            x = torch.tanh(x * 1.01)
        return x, self.y[i]


model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4))
opt = torch.optim.Adam(model.parameters(), lr=args.lr)
for epoch in range(3):
    for x, y in torch.utils.data.DataLoader(Noisy(), batch_size=64, shuffle=True):
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        print(loss.item())
'''

# the shape of pytorch/examples' DDP tutorial: env:// from torchrun, DistributedSampler, DDP
TRAIN_DDP = '''
import argparse
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

p = argparse.ArgumentParser()
p.add_argument("--epochs", type=int, default=3)
args = p.parse_args()
dist.init_process_group("gloo")
g = torch.Generator().manual_seed(0)
data = TensorDataset(torch.randn(4096, 64, generator=g), torch.randint(0, 4, (4096,), generator=g))
sampler = DistributedSampler(data)
model = DDP(nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4)))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
for epoch in range(args.epochs):
    sampler.set_epoch(epoch)
    for x, y in DataLoader(data, batch_size=32, sampler=sampler):
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
dist.destroy_process_group()
'''

FACTORIES = '''
import torch


def make_dataset():
    g = torch.Generator().manual_seed(0)
    return torch.utils.data.TensorDataset(torch.randn(2048, 32, generator=g),
                                          torch.randint(0, 4, (2048,), generator=g))


def make_model():
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
'''

# What each command must print (stdout + stderr; a regular expression), by its first words: the
# output words the pages quote, so a renamed column or message fails as a renamed flag does.
PROMISES = {
    ("diagnose",): "bottleneck",
    ("bench",): "samples/s",
    ("tune", "loader"): "num_workers",
    ("tune", "batch-size"): "batch",
    ("pack", "--dataset"): "packed 2048 samples",
    ("pack", "--bench"): "speedup",
    ("pack", "--images"): r"packed \d+ samples",
    ("pack", "--verify"): "match their SHA-256",
    ("data", "mnist"): "MNIST",
    ("data", "images"): "in 10 class",
    ("report",): "report.html",
}


def promise(argv: list[str]) -> str | None:
    """The pattern `looptune ARGV`'s output must match: the longest matching key of PROMISES."""
    keys = [key for key in PROMISES if tuple(argv[:len(key)]) == key]
    return PROMISES[max(keys, key=len)] if keys else None


def blocks(page: Path, languages: tuple[str, ...]):
    """(first line, text) of each fenced block of the page in one of ``languages``."""
    text = page.read_text()
    for m in FENCE.finditer(text):
        if m.group(1) in languages:
            yield text[:m.start()].count("\n") + 2, m.group(2)


def commands(page: Path):
    """(line, argv) of every looptune command in the page's shell blocks (continuations joined,
    comments dropped, `&&` chains split, `VAR=value` prefixes and `python -m looptune` allowed)."""
    for first, block in blocks(page, ("bash", "sh", "console", "")):
        joined = re.sub(r"\\\n", " ", block)
        for offset, line in enumerate(joined.splitlines()):
            code = line.split(" #")[0].strip()
            for part in code.split("&&"):
                try:
                    words = shlex.split(part, comments=True)
                except ValueError:  # not shell (an output line with a quote in it)
                    continue
                while words and re.fullmatch(r"[A-Z_]+=\S*", words[0]):
                    words = words[1:]
                if words[:3] == ["python", "-m", "looptune"]:
                    words = ["looptune", *words[3:]]
                if words[:1] == ["looptune"] and words[1:] != ["..."]:  # "..." : any command
                    yield first + offset, words[1:]


def newcomer_folder(work: Path, mnist_dir: Path) -> Path:
    """Fill ``work`` with what the pages' placeholders name (see the module's docstring)."""
    from looptune.data import image_folder

    (work / "train.py").write_text(textwrap.dedent(TRAIN))
    (work / "train_ddp.py").write_text(textwrap.dedent(TRAIN_DDP))
    (work / "mypackage").mkdir()
    (work / "mypackage" / "__init__.py").write_text("")
    (work / "mypackage" / "train.py").write_text(textwrap.dedent(TRAIN))
    (work / "mydata.py").write_text(FACTORIES)
    (work / "mymodel.py").write_text(FACTORIES)
    shutil.copytree(ROOT / "examples", work / "examples")
    data = work / "DIR"
    image_folder.write(data / "train", samples=150, mnist_dir=mnist_dir, min_size=64, max_size=96)
    image_folder.write(data / "test", samples=60, mnist_dir=mnist_dir, split="test", min_size=64,
                       max_size=96)
    for name in mnist_dir.iterdir():
        if "ubyte" in name.name:
            (data / name.name).symlink_to(name.resolve())
    return work
