"""The pytorch/examples VAE loop in its shape (our code, vae/main.py): real MNIST read through a
per-sample PIL decode + ToTensor Dataset (as ``datasets.MNIST(transform=ToTensor())``), batch 128,
an MLP encoder/decoder (784-400-20), BCE + KL loss summed, Adam. Data-bound as written; once
pre-decoded, a small step whose per-step costs a larger batch spreads (issue 32's --plan case)."""
import argparse

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader

from looptune.data import mnist
from looptune.data.loaders import ImageData, PerSampleImages


class VAE(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc21, self.fc22 = nn.Linear(784, 400), nn.Linear(400, 20), nn.Linear(400, 20)
        self.fc3, self.fc4 = nn.Linear(20, 400), nn.Linear(400, 784)

    def encode(self, x):
        h1 = F.relu(self.fc1(x))
        return self.fc21(h1), self.fc22(h1)

    def reparameterize(self, mu, logvar):
        std = torch.exp(0.5 * logvar)
        return mu + torch.randn_like(std) * std

    def decode(self, z):
        return torch.sigmoid(self.fc4(F.relu(self.fc3(z))))

    def forward(self, x):
        mu, logvar = self.encode(x.view(-1, 784))
        return self.decode(self.reparameterize(mu, logvar)), mu, logvar


def loss_function(recon_x, x, mu, logvar):
    bce = F.binary_cross_entropy(recon_x, x.view(-1, 784), reduction="sum")
    return bce - 0.5 * torch.sum(1 + logvar - mu.pow(2) - logvar.exp())


def parse(argv=None):
    p = argparse.ArgumentParser(description="VAE MNIST Example")
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--data", default=None)
    return p.parse_args(argv)


def loader(args):
    images, labels = mnist.load("train", data_dir=args.data)
    data = PerSampleImages(ImageData(images=images, labels=labels, mean=0.0, std=1.0))  # ToTensor
    return DataLoader(data, batch_size=args.batch_size, shuffle=True)


def parts(argv=None):
    """(loader, step(batch)) for the benchmarks: the same objects main() uses."""
    args = parse(argv)
    torch.manual_seed(1)
    model = VAE()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)

    def step(batch):
        data, _ = batch
        optimizer.zero_grad()
        recon_batch, mu, logvar = model(data)
        loss = loss_function(recon_batch, data, mu, logvar)
        loss.backward()
        optimizer.step()
        return loss.item()

    return loader(args), step


def main(argv=None):
    args = parse(argv)
    torch.manual_seed(1)
    model = VAE()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    for epoch in range(1, args.epochs + 1):
        model.train()
        for batch_idx, (data, _) in enumerate(loader(args)):
            optimizer.zero_grad()
            recon_batch, mu, logvar = model(data)
            loss = loss_function(recon_batch, data, mu, logvar)
            loss.backward()
            optimizer.step()


if __name__ == "__main__":
    main()
