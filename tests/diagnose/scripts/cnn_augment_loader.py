"""Planted bottleneck: data_loading. The usual torchvision-style augmentation pipeline: every
sample goes uint8 -> PIL image -> random affine (rotate, shift, zoom) -> ToTensor -> Normalize in
the Dataset's __getitem__, on one CPU core (num_workers=0), feeding a small conv net whose step
costs less than the batch's augmentation. loss.item() every step, as tutorials print it."""
import argparse

import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset

from looptune.models import SmallCNN
from looptune.data.augment import RandomAffine
from looptune.data.per_sample import reference_transform


class AugmentedDigits(Dataset):
    def __init__(self, n):
        gen = torch.Generator().manual_seed(0)  # synthetic 28x28 "digits": the cost is per pixel
        self.images = torch.randint(0, 256, (n, 28, 28), dtype=torch.uint8, generator=gen)
        self.labels = torch.randint(0, 10, (n,), generator=gen)
        self.augment = RandomAffine().per_sample()  # PIL -> PIL (torchvision's when installed)
        self.to_tensor = reference_transform(0.1307, 0.3081)  # Compose([ToTensor(), Normalize()])

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        img = self.augment(Image.fromarray(self.images[i].numpy()))
        return self.to_tensor(img), int(self.labels[i])


# one intra-op thread: on a VM whose vCPUs the host throttles, 2-thread OpenMP regions stall at
# their barriers for whole scheduler ticks, which would land in the step, not in the data wait
torch.set_num_threads(1)
parser = argparse.ArgumentParser()
parser.add_argument("--samples", type=int, default=4096)
parser.add_argument("--batch-size", type=int, default=64)
args = parser.parse_args()
torch.manual_seed(0)
model = SmallCNN()
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
loss_fn = torch.nn.CrossEntropyLoss()
for epoch in range(100):
    for x, y in DataLoader(AugmentedDigits(args.samples), batch_size=args.batch_size,
                           shuffle=True, num_workers=0):
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        running = loss.item()
