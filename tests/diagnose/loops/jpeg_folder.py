"""A folder of JPEGs trained as the tutorials write it (our code, in the shape of pytorch/examples
imagenet/main.py without torchvision): an ImageFolder-style dataset over class sub-folders, PIL
decode, RandomResizedCrop + RandomHorizontalFlip + ToTensor + Normalize per sample, a shuffled
DataLoader, a small conv net, ``loss.item()`` every step. The input pipeline starves the step
(issue 33). The folder: ``looptune data images --out DIR``."""
import argparse
import math
import os
import random

import numpy as np
import torch
from PIL import Image
from torch import nn
from torch.utils.data import DataLoader, Dataset

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


class ImageFolder(Dataset):
    def __init__(self, root, transform):
        self.classes = sorted(d for d in os.listdir(root) if os.path.isdir(os.path.join(root, d)))
        self.samples = [(os.path.join(root, c, f), i) for i, c in enumerate(self.classes)
                        for f in sorted(os.listdir(os.path.join(root, c))) if f.endswith(".jpg")]
        self.transform = transform

    def __len__(self):
        return len(self.samples)

    def __getitem__(self, index):
        path, target = self.samples[index]
        with open(path, "rb") as f:
            img = Image.open(f).convert("RGB")
        return self.transform(img), target


class TrainTransform:
    """RandomResizedCrop(size, scale) + RandomHorizontalFlip + ToTensor + Normalize."""

    def __init__(self, size, scale=(0.35, 1.0), ratio=(3 / 4, 4 / 3)):
        self.size, self.scale, self.ratio = size, scale, ratio
        self.mean, self.std = torch.tensor(MEAN).view(3, 1, 1), torch.tensor(STD).view(3, 1, 1)

    def __call__(self, img):
        width, height = img.size
        for _ in range(10):
            area = width * height * random.uniform(*self.scale)
            aspect = math.exp(random.uniform(math.log(self.ratio[0]), math.log(self.ratio[1])))
            w, h = round(math.sqrt(area * aspect)), round(math.sqrt(area / aspect))
            if 0 < w <= width and 0 < h <= height:
                left, top = random.randint(0, width - w), random.randint(0, height - h)
                break
        else:
            left, top, w, h = 0, 0, width, height
        img = img.resize((self.size, self.size), Image.BILINEAR, box=(left, top, left + w, top + h))
        if random.random() < 0.5:
            img = img.transpose(Image.FLIP_LEFT_RIGHT)
        x = torch.from_numpy(np.asarray(img).copy()).permute(2, 0, 1).float().div(255)
        return (x - self.mean) / self.std


def net():
    layers, previous = [], 3
    for c in (16, 32, 64):
        layers += [nn.Conv2d(previous, c, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(c),
                   nn.ReLU()]
        previous = c
    return nn.Sequential(*layers, nn.Flatten(), nn.Linear(previous * 16, 10))


def parse(argv=None):
    p = argparse.ArgumentParser(description="JPEG folder training")
    p.add_argument("folder")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--lr", type=float, default=2e-3)
    return p.parse_args(argv)


def build(args):
    torch.manual_seed(0)
    random.seed(0)
    data = ImageFolder(args.folder, TrainTransform(32))
    loader = DataLoader(data, batch_size=args.batch_size, shuffle=True, num_workers=args.workers)
    model = net()
    return data, loader, model, torch.optim.Adam(model.parameters(), lr=args.lr), nn.CrossEntropyLoss()


def parts(argv=None):
    """The loader and one training step, for timing each alone (tests/loop_checks.py)."""
    _, loader, model, optimizer, criterion = build(parse(argv))

    def step(batch):
        images, target = batch
        loss = criterion(model(images), target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    return loader, step


def main(argv=None):
    args = parse(argv)
    data, loader, model, optimizer, criterion = build(args)
    for epoch in range(args.epochs):
        for i, (images, target) in enumerate(loader):
            loss = criterion(model(images), target)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if i % 20 == 0:
                print(f"epoch {epoch} [{i * len(images)}/{len(data)}] loss {loss.item():.4f}")


if __name__ == "__main__":
    main()


# `looptune tune loader --dataset jpeg_folder:dataset --model jpeg_folder:model`, the folder in
# the environment variable JPEG_FOLDER (the factories take no arguments)
def dataset():
    return ImageFolder(os.environ["JPEG_FOLDER"], TrainTransform(32))


def model():
    return net()
