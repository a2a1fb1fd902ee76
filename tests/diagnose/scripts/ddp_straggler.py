"""DDP on gloo with one straggler: rank --slow-rank sleeps --delay-ms more per step, so every
rank's gradient all-reduce waits for it. Plain DDP boilerplate, launched per rank (torchrun, or
looptune diagnose --nproc 2); --fail-rank R makes rank R raise at step --fail-step."""
import argparse
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

parser = argparse.ArgumentParser()
parser.add_argument("--slow-rank", type=int, default=1)
parser.add_argument("--delay-ms", type=float, default=5.0)
parser.add_argument("--epochs", type=int, default=4)
parser.add_argument("--fail-rank", type=int, default=None)
parser.add_argument("--fail-step", type=int, default=12)
args = parser.parse_args()

torch.set_num_threads(1)  # two ranks on two cores: one intra-op thread each
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
data = TensorDataset(torch.randn(4096, 32), torch.randint(0, 2, (4096,)))
sampler = DistributedSampler(data, shuffle=True, seed=0)
loader = DataLoader(data, batch_size=32, sampler=sampler)  # 64 steps per epoch per rank
model = DistributedDataParallel(torch.nn.Linear(32, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
step = 0
for epoch in range(args.epochs):
    sampler.set_epoch(epoch)
    for x, y in loader:
        if rank == args.slow_rank:
            time.sleep(args.delay_ms / 1000)  # the straggler's extra host work
        if rank == args.fail_rank and step == args.fail_step:
            raise RuntimeError(f"planted failure on rank {rank} at step {step}")
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        step += 1
dist.destroy_process_group()
