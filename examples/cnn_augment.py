"""A conv net on MNIST with per-sample augmentation, as people write it (for `looptune diagnose`).

A Dataset whose __getitem__ turns each uint8 image into a PIL image, applies RandomAffine
(torchvision's when it imports, else looptune's op-for-op equivalent), then ToTensor + Normalize;
a plain DataLoader; the small conv net of looptune's mnist-cnn workload; Adam, batch 64,
`loss.item()` every step.

    python examples/cnn_augment.py --data ../shared/data/mnist
    looptune diagnose --verify examples/cnn_augment.py --data ../shared/data/mnist
"""

import argparse

import torch
from torch import nn
from torch.utils.data import DataLoader

from looptune.models import SmallCNN
from looptune.data import mnist
from looptune.data.augment import RandomAffine
from looptune.data.loaders import ImageData, PerSampleImages

parser = argparse.ArgumentParser()
parser.add_argument("--data", default=None, help="MNIST folder")
parser.add_argument("--epochs", type=int, default=3)
parser.add_argument("--batch-size", type=int, default=64)
parser.add_argument("--workers", type=int, default=0)
args = parser.parse_args()

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
images, labels = mnist.load("train", data_dir=args.data)
# like datasets.MNIST(transform=Compose([RandomAffine(10, (0.1, 0.1), (0.9, 1.1)), ToTensor(),
# Normalize((0.1307,), (0.3081,))]))
dataset = PerSampleImages(ImageData(images=images, labels=labels, mean=0.1307, std=0.3081, augment=RandomAffine()))
loader = DataLoader(dataset, batch_size=args.batch_size, shuffle=True, num_workers=args.workers)
model = SmallCNN().to(device)
criterion = nn.CrossEntropyLoss()
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)

if __name__ == "__main__":
    for epoch in range(args.epochs):
        total = 0.0
        for data, target in loader:
            data, target = data.to(device), target.to(device)
            optimizer.zero_grad()
            loss = criterion(model(data), target)
            loss.backward()
            optimizer.step()
            total += loss.item()
        print(f"epoch {epoch + 1}: loss {total / len(loader):.4f}")
