"""A DCGAN loop in the shape of pytorch/examples/dcgan/main.py (written here, shrunk for a CPU):
a generator and a discriminator, two optimizers, three forwards and two backwards an iteration
(D on real, D on fake.detach(), D on fake for G's loss), a DataLoader of images."""
import argparse

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

p = argparse.ArgumentParser()
p.add_argument("--batchSize", type=int, default=16)
p.add_argument("--niter", type=int, default=1)
p.add_argument("--samples", type=int, default=4096)
opt = p.parse_args([] if __name__ != "__main__" else None)
torch.manual_seed(0)
nz, ngf, ndf = 64, 32, 32


class Generator(nn.Module):
    def __init__(self):
        super().__init__()
        self.main = nn.Sequential(  # nz x 1 x 1 -> 3 x 16 x 16
            nn.ConvTranspose2d(nz, ngf * 4, 4, 1, 0, bias=False), nn.BatchNorm2d(ngf * 4), nn.ReLU(True),
            nn.ConvTranspose2d(ngf * 4, ngf * 2, 4, 2, 1, bias=False), nn.BatchNorm2d(ngf * 2), nn.ReLU(True),
            nn.ConvTranspose2d(ngf * 2, 3, 4, 2, 1, bias=False), nn.Tanh())

    def forward(self, z):
        return self.main(z)


class Discriminator(nn.Module):
    def __init__(self):
        super().__init__()
        self.main = nn.Sequential(  # 3 x 16 x 16 -> 1
            nn.Conv2d(3, ndf, 4, 2, 1, bias=False), nn.LeakyReLU(0.2, inplace=True),
            nn.Conv2d(ndf, ndf * 2, 4, 2, 1, bias=False), nn.BatchNorm2d(ndf * 2),
            nn.LeakyReLU(0.2, inplace=True), nn.Conv2d(ndf * 2, 1, 4, 1, 0, bias=False), nn.Sigmoid())

    def forward(self, x):
        return self.main(x).view(-1, 1).squeeze(1)


def build(o):
    images = torch.rand(o.samples, 3, 16, 16) * 2 - 1
    loader = DataLoader(TensorDataset(images), batch_size=o.batchSize, shuffle=True)
    netG, netD = Generator(), Discriminator()
    criterion = nn.BCELoss()
    optimizerD = torch.optim.Adam(netD.parameters(), lr=2e-4, betas=(0.5, 0.999))
    optimizerG = torch.optim.Adam(netG.parameters(), lr=2e-4, betas=(0.5, 0.999))

    def iteration(real):
        # (1) update D: maximize log(D(x)) + log(1 - D(G(z)))
        netD.zero_grad()
        b = real.size(0)
        label = torch.full((b,), 1.0)
        errD_real = criterion(netD(real), label)
        errD_real.backward()
        noise = torch.randn(b, nz, 1, 1)
        fake = netG(noise)
        label.fill_(0.0)
        errD_fake = criterion(netD(fake.detach()), label)
        errD_fake.backward()
        optimizerD.step()
        # (2) update G: maximize log(D(G(z)))
        netG.zero_grad()
        label.fill_(1.0)
        errG = criterion(netD(fake), label)
        errG.backward()
        optimizerG.step()

    return loader, iteration


def parts(argv):
    """The loader and one iteration, for a test's independent timing (tests/loop_checks.py)."""
    loader, iteration = build(p.parse_args(argv))
    return loader, lambda batch: iteration(*batch)


if __name__ == "__main__":
    loader, iteration = build(opt)
    for epoch in range(opt.niter):
        for i, (real,) in enumerate(loader):
            iteration(real)
