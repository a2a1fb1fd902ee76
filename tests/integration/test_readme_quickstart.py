"""The README's quickstart commands run as a newcomer runs them (issue 34): every `looptune ...`
line of its Quickstart bash blocks, unchanged, in a folder holding what their placeholders name
(a training script `train.py` that takes `--lr`, `mydata.py:make_dataset`,
`mymodel.py:make_model`, an image folder `DIR` with train/ and test/), with MNIST from
$LOOPTUNE_DATA. Each must exit 0 and print what it promises."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

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

FACTORIES = '''
import torch


def make_dataset():
    g = torch.Generator().manual_seed(0)
    return torch.utils.data.TensorDataset(torch.randn(2048, 32, generator=g),
                                          torch.randint(0, 4, (2048,), generator=g))


def make_model():
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
'''

# what each command must print (stdout + stderr), by its first words
PROMISES = {
    ("diagnose",): "bottleneck",
    ("bench", "mnist"): "samples/s",
    ("bench", "images"): "samples/s",
    ("tune", "loader"): "num_workers",
    ("tune", "batch-size"): "batch",
    ("pack", "--dataset"): "packed 2048 samples",
    ("pack", "--bench"): "speedup",
    ("pack", "--images"): "wrote 150 samples",
}


def _quickstart_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Quickstart"):text.index("\n## ", text.index("## Quickstart") + 5)]
    out = []
    for block in re.findall(r"^```bash\n(.*?)^```", section, re.M | re.S):
        for line in block.splitlines():
            command = line.split("  #")[0].strip()
            if command:
                out += [c.strip() for c in command.split("&&")]
    return out


def test_the_quickstart_has_commands():
    commands = _quickstart_commands()
    assert len(commands) >= 10 and all(c.startswith("looptune ") for c in commands)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory, mnist_dir):
    from looptune.data import image_folder

    work = tmp_path_factory.mktemp("newcomer")
    (work / "train.py").write_text(textwrap.dedent(TRAIN))
    (work / "mydata.py").write_text(FACTORIES)
    (work / "mymodel.py").write_text(FACTORIES)
    image_folder.write(work / "DIR" / "train", samples=150, mnist_dir=mnist_dir, min_size=64,
                       max_size=96)
    image_folder.write(work / "DIR" / "test", samples=60, mnist_dir=mnist_dir, split="test",
                       min_size=64, max_size=96)
    return work


@pytest.mark.integration
@pytest.mark.parametrize("command", _quickstart_commands())
def test_every_quickstart_command_runs(workdir, command, mnist_dir):
    argv = shlex.split(command)
    env = {**os.environ, "LOOPTUNE_DATA": str(mnist_dir), "PYTHONPATH": str(workdir)}
    proc = subprocess.run([sys.executable, "-m", "looptune", *argv[1:]], cwd=workdir, env=env,
                          capture_output=True, text=True, timeout=300)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"`{command}` exited {proc.returncode}:\n{output[-3000:]}"
    promise = next((words for key, words in PROMISES.items() if tuple(argv[1:1 + len(key)]) == key),
                   None)
    assert promise is not None, f"no promise for `{command}`: add one to PROMISES"
    assert promise in output, f"`{command}` did not print {promise!r}:\n{output[-2000:]}"
