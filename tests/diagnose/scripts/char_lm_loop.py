"""A nanoGPT-style byte-level language-model loop, as people write it: a Dataset slicing int64
windows of the token stream (TokenWindowDataset), DataLoader(num_workers=0), a small GPT in fp32
eager, AdamW, loss.item() every step. Slicing a window is cheap next to the transformer's step,
so the time goes to the step itself (compute or per-op overhead), not to the loader."""
import argparse

import numpy as np
import torch
from torch.utils.data import DataLoader

from looptune.models import GPT, GPTConfig, lm_loss
from looptune.data.text import TokenWindowDataset

torch.set_num_threads(1)  # as cnn_augment_loader.py: no OpenMP barrier stalls on a throttled VM
parser = argparse.ArgumentParser()
parser.add_argument("--context", type=int, default=64)
parser.add_argument("--batch-size", type=int, default=16)
args = parser.parse_args()
sentence = b"the quick brown fox jumps over the lazy dog; pack my box with five dozen jugs. "
tokens = np.frombuffer(sentence * 400, dtype=np.uint8)  # ~32 KB of text as byte tokens
torch.manual_seed(0)
model = GPT(GPTConfig(context=args.context, n_layer=2, n_head=4, n_embd=128))
opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.99), weight_decay=0.1)
for epoch in range(100):
    for x, y in DataLoader(TokenWindowDataset(tokens, args.context), batch_size=args.batch_size,
                           shuffle=True, num_workers=0):
        opt.zero_grad(set_to_none=True)
        loss = lm_loss(model(x), y)
        loss.backward()
        opt.step()
        running = loss.item()
