"""Uses argparse and sys.exit; runs only --steps steps (fewer than diagnose asks)."""
import argparse
import sys

import torch

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, required=True)
parser.add_argument("--out", required=True)
args = parser.parse_args()
model = torch.nn.Linear(8, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(args.steps):
    opt.zero_grad()
    model(torch.randn(16, 8)).sum().backward()
    opt.step()
with open(args.out, "w") as f:
    f.write(" ".join(sys.argv))
sys.exit(0)
