"""The pytorch/examples mnist_rnn loop in its shape (our code): real MNIST through a per-sample
PIL decode + ToTensor + Normalize Dataset, each 28x28 image read as 28 rows by a batch-first LSTM
(input 28, hidden 64), the last step classified; batch 64, Adam with StepLR (issue 32's second
--plan case)."""
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
        self.rnn = nn.LSTM(input_size=28, hidden_size=64, batch_first=True)
        self.batchnorm = nn.BatchNorm1d(64)
        self.dropout1, self.dropout2 = nn.Dropout2d(0.25), nn.Dropout2d(0.5)
        self.fc1, self.fc2 = nn.Linear(64, 32), nn.Linear(32, 10)

    def forward(self, input):
        input = input.reshape(-1, 28, 28)  # [batch, 1, 28, 28] -> 28 rows of 28
        output, _ = self.rnn(input)
        output = self.batchnorm(output[:, -1, :])  # the last row's output
        output = F.relu(self.fc1(self.dropout1(output)))
        return F.log_softmax(self.fc2(self.dropout2(output)), dim=1)


def parse(argv=None):
    p = argparse.ArgumentParser(description="PyTorch MNIST RNN Example")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--data", default=None)
    return p.parse_args(argv)


def loader(args):
    images, labels = mnist.load("train", data_dir=args.data)
    data = PerSampleImages(ImageData(images=images, labels=labels, mean=0.1307, std=0.3081))
    return DataLoader(data, batch_size=args.batch_size, shuffle=True)


def parts(argv=None):
    """(loader, step(batch)) for the benchmarks: the same objects main() uses."""
    args = parse(argv)
    torch.manual_seed(1)
    model = Net()
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)

    def step(batch):
        data, target = batch
        optimizer.zero_grad()
        loss = F.nll_loss(model(data), target)
        loss.backward()
        optimizer.step()
        return loss.item()

    return loader(args), step


def main(argv=None):
    args = parse(argv)
    torch.manual_seed(1)
    model = Net()
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    scheduler = StepLR(optimizer, step_size=1, gamma=0.1)
    for epoch in range(1, args.epochs + 1):
        model.train()
        for data, target in loader(args):
            optimizer.zero_grad()
            loss = F.nll_loss(model(data), target)
            loss.backward()
            optimizer.step()
        scheduler.step()


if __name__ == "__main__":
    main()
