"""The pytorch/examples MNIST loop, in its shape (our code): argparse, a conv net with dropout,
``train(args, model, device, train_loader, optimizer, epoch)`` printing ``loss.item()`` every
``log_interval`` batches, ``test()`` after every epoch, Adadelta with StepLR. The data is the real
MNIST through a per-sample ToTensor + Normalize Dataset, as ``datasets.MNIST(transform=...)`` does
(torchvision's transforms when it imports). ``parts()`` gives the benchmark its loader and step."""
import argparse

import torch
import torch.nn.functional as F
from torch import nn
from torch.optim.lr_scheduler import StepLR
from torch.utils.data import DataLoader

from looptune.data import mnist
from looptune.data.loaders import ImageData, PerSampleImages


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, 1)
        self.conv2 = nn.Conv2d(32, 64, 3, 1)
        self.dropout1 = nn.Dropout(0.25)
        self.dropout2 = nn.Dropout(0.5)
        self.fc1 = nn.Linear(9216, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = F.relu(self.conv1(x))
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = torch.flatten(self.dropout1(x), 1)
        x = self.dropout2(F.relu(self.fc1(x)))
        return F.log_softmax(self.fc2(x), dim=1)


def train(args, model, device, train_loader, optimizer, epoch):
    model.train()
    for batch_idx, (data, target) in enumerate(train_loader):
        data, target = data.to(device), target.to(device)
        optimizer.zero_grad()
        loss = F.nll_loss(model(data), target)
        loss.backward()
        optimizer.step()
        if batch_idx % args.log_interval == 0:
            print(f"Train Epoch: {epoch} [{batch_idx * len(data)}/{len(train_loader.dataset)}]"
                  f"\tLoss: {loss.item():.6f}")


def test(model, device, test_loader):
    model.eval()
    correct = 0
    with torch.no_grad():
        for data, target in test_loader:
            output = model(data.to(device))
            correct += output.argmax(dim=1).eq(target.to(device)).sum().item()
    print(f"Test set: Accuracy: {correct}/{len(test_loader.dataset)}")


def parse(argv=None):
    parser = argparse.ArgumentParser(description="PyTorch MNIST Example")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--test-batch-size", type=int, default=1000)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--lr", type=float, default=1.0)
    parser.add_argument("--gamma", type=float, default=0.7)
    parser.add_argument("--log-interval", type=int, default=10)
    parser.add_argument("--data", default=None)
    parser.add_argument("--workers", type=int, default=0)
    return parser.parse_args(argv)


def loaders(args):
    def split(name):
        images, labels = mnist.load(name, data_dir=args.data)
        return PerSampleImages(ImageData(images=images, labels=labels, mean=0.1307, std=0.3081))  # ToTensor+Normalize

    kwargs = {"num_workers": args.workers, "shuffle": True}
    return (DataLoader(split("train"), batch_size=args.batch_size, **kwargs),
            DataLoader(split("test"), batch_size=args.test_batch_size))


def parts(argv=None):
    """(loader, step(batch)) for benchmarks/diagnose_fidelity.py: the same objects main() uses."""
    args = parse(argv)
    torch.manual_seed(1)
    model = Net()
    optimizer = torch.optim.Adadelta(model.parameters(), lr=args.lr)

    def step(batch):
        data, target = batch
        optimizer.zero_grad()
        loss = F.nll_loss(model(data), target)
        loss.backward()
        optimizer.step()
        return loss.item()

    return loaders(args)[0], step


def main(argv=None):
    args = parse(argv)
    torch.manual_seed(1)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    train_loader, test_loader = loaders(args)
    model = Net().to(device)
    optimizer = torch.optim.Adadelta(model.parameters(), lr=args.lr)
    scheduler = StepLR(optimizer, step_size=1, gamma=args.gamma)
    for epoch in range(1, args.epochs + 1):
        train(args, model, device, train_loader, optimizer, epoch)
        test(model, device, test_loader)
        scheduler.step()


if __name__ == "__main__":
    main()
