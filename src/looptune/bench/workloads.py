"""Workloads: a model, its data, loss and metric. The registry names them for the CLI.

``mnist-mlp`` is the reference experiment (../shared/REFERENCE.md): the tutorial's
``SimpleFeedForwardNN`` (784-128-64-10), CrossEntropyLoss, Adam lr=1e-3, batch 64, 5 epochs.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from looptune.data.loaders import ImageData, normalize_batch
from looptune.errors import ConfigError

__all__ = ["SimpleFeedForwardNN", "Workload", "WORKLOADS", "get_workload", "evaluate"]

# Mean and std of MNIST's training pixels scaled to [0, 1]: the tutorial's Normalize((0.1307,), (0.3081,))
MNIST_MEAN, MNIST_STD = 0.1307, 0.3081


class SimpleFeedForwardNN(nn.Module):
    """The reference model: flatten, Linear(784,128), ReLU, Linear(128,64), ReLU, Linear(64,10)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(784, 128)
        self.fc2 = nn.Linear(128, 64)
        self.fc3 = nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.view(-1, 784)
        x = torch.relu(self.fc1(x))
        x = torch.relu(self.fc2(x))
        return self.fc3(x)


@dataclass(frozen=True, kw_only=True)
class Workload:
    name: str
    description: str
    build_model: Callable[[], nn.Module]  # called right after torch.manual_seed(seed)
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    load: Callable[..., tuple[ImageData, ImageData]]  # load(data_dir=...) -> (train, test)
    default_epochs: int  # the reference's epoch count


def _load_mnist(*, data_dir: str | None = None) -> tuple[ImageData, ImageData]:
    from looptune.data import mnist

    train = ImageData(*mnist.load("train", data_dir=data_dir), MNIST_MEAN, MNIST_STD)
    test = ImageData(*mnist.load("test", data_dir=data_dir), MNIST_MEAN, MNIST_STD)
    return train, test


def mnist_train() -> torch.utils.data.TensorDataset:
    """MNIST's training split as ``(uint8 28x28 image, int64 label)`` samples, from ``--data``'s
    usual search ($LOOPTUNE_DATA, then the user cache): a ready ``--dataset`` for ``looptune pack``
    (``looptune pack --dataset looptune.bench.workloads:mnist_train mnist-train.pack``)."""
    from looptune.data import mnist

    return torch.utils.data.TensorDataset(*mnist.load("train"))


WORKLOADS: dict[str, Workload] = {
    "mnist-mlp": Workload(
        name="mnist-mlp",
        description="MNIST, MLP 784-128-64-10, CrossEntropyLoss, Adam lr=1e-3, batch 64",
        build_model=SimpleFeedForwardNN, loss_fn=nn.CrossEntropyLoss(), load=_load_mnist,
        default_epochs=5),
}
# CLI aliases: `looptune bench mnist` names the dataset; the workload is the reference one.
ALIASES = {"mnist": "mnist-mlp"}


def get_workload(name: str) -> Workload:
    """Look up a workload by name or alias; the error lists what exists and the closest name."""
    name = ALIASES.get(name, name)
    if name in WORKLOADS:
        return WORKLOADS[name]
    names = [*WORKLOADS, *ALIASES]
    close = difflib.get_close_matches(name, names, n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    raise ConfigError(f"unknown workload {name!r}: valid names are {', '.join(names)}.{hint}")


@torch.no_grad()
def evaluate(model: nn.Module, data: ImageData, device: torch.device, batch_size: int = 2000) -> float:
    """Top-1 accuracy of ``model`` on ``data`` (a fraction in [0, 1])."""
    was_training = model.training
    model.eval()
    images, labels = data.images.to(device), data.labels.to(device)
    correct = torch.zeros((), dtype=torch.int64, device=device)
    for x, y in zip(images.split(batch_size), labels.split(batch_size)):
        logits = model(normalize_batch(x, data.mean, data.std))
        correct += (logits.argmax(dim=1) == y).sum()
    model.train(was_training)
    return correct.item() / len(data)  # sync: once, at the end
