"""A nanoGPT-style byte-level language model loop, as people write it (for `looptune diagnose`).

The token stream is a 1-D uint8 array (the pystdlib corpus by default, or --corpus FILE); a
Dataset slices windows of it (x, and y shifted by one) per sample; a DataLoader batches them; the
small GPT of looptune's char-gpt workload trains in fp32 eager with AdamW and `loss.item()`
every step.

    python examples/char_lm.py
    looptune diagnose --verify examples/char_lm.py --corpus tinyshakespeare
"""

import argparse

import torch
from torch.utils.data import DataLoader

from looptune.models import GPT, GPTConfig, lm_loss
from looptune.data import text

parser = argparse.ArgumentParser()
parser.add_argument("--corpus", default="pystdlib")
parser.add_argument("--context", type=int, default=128)
parser.add_argument("--batch-size", type=int, default=32)
parser.add_argument("--epochs", type=int, default=1)
parser.add_argument("--max-bytes", type=int, default=1 << 20)
parser.add_argument("--workers", type=int, default=0)
args = parser.parse_args()

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
train_tokens, _ = text.split_tokens(text.load_corpus(args.corpus, max_bytes=args.max_bytes))
dataset = text.TokenWindowDataset(train_tokens.numpy(), args.context, which="train")
loader = DataLoader(dataset, batch_size=args.batch_size, shuffle=True, num_workers=args.workers)
model = GPT(GPTConfig(context=args.context)).to(device)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.99), weight_decay=0.1)

if __name__ == "__main__":
    for epoch in range(args.epochs):
        total = 0.0
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            loss = lm_loss(model(x), y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            total += loss.item()
        print(f"epoch {epoch + 1}: loss {total / len(loader):.4f}")
