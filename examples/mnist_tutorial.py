"""The reference tutorial's training script, as a user would write it (for `looptune diagnose`).

MNIST through a per-sample Dataset (uint8 -> PIL -> ToTensor -> Normalize in __getitem__), the
784-128-64-10 MLP, Adam lr=1e-3, batch 64, `loss.item()` every step. Reads the MNIST files with
looptune's loader (no torchvision download needed); everything else is plain PyTorch.

    python examples/mnist_tutorial.py --data ../shared/data/mnist                     # baseline
    python examples/mnist_tutorial.py --data ../shared/data/mnist --workers 8 --pin   # pinned
    looptune diagnose examples/mnist_tutorial.py --data ../shared/data/mnist
"""

import argparse

import torch
from torch import nn
from torch.utils.data import DataLoader

from looptune.data import mnist
from looptune.data.loaders import ImageData, PerSampleImages

parser = argparse.ArgumentParser()
parser.add_argument("--data", default=None, help="MNIST folder")
parser.add_argument("--epochs", type=int, default=5)
parser.add_argument("--workers", type=int, default=0)
parser.add_argument("--pin", action="store_true", help="pin_memory=True and non_blocking copies")
args = parser.parse_args()


class SimpleFeedForwardNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2, self.fc3 = nn.Linear(784, 128), nn.Linear(128, 64), nn.Linear(64, 10)

    def forward(self, x):
        x = x.view(-1, 784)
        return self.fc3(torch.relu(self.fc2(torch.relu(self.fc1(x)))))


device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
images, labels = mnist.load("train", data_dir=args.data)
dataset = PerSampleImages(ImageData(images=images, labels=labels, mean=0.1307, std=0.3081))  # like datasets.MNIST
loader = DataLoader(dataset, batch_size=64, shuffle=True, num_workers=args.workers,
                    pin_memory=args.pin)
model = SimpleFeedForwardNN().to(device)
criterion = nn.CrossEntropyLoss()
optimizer = torch.optim.Adam(model.parameters(), lr=0.001)

if __name__ == "__main__":
    for epoch in range(args.epochs):
        loss_value = 0.0
        for data, target in loader:
            data = data.to(device, non_blocking=args.pin)
            target = target.to(device, non_blocking=args.pin)
            optimizer.zero_grad()
            loss = criterion(model(data), target)
            loss.backward()
            optimizer.step()
            loss_value += loss.item()
        print(f"Epoch {epoch + 1}, Loss: {loss_value:.4f}")
