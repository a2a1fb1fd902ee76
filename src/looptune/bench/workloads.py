"""Workloads: a model, its data, loss and metric. The registry names them for the CLI.

- ``mnist-mlp`` is the reference experiment (../shared/REFERENCE.md): the tutorial's
  ``SimpleFeedForwardNN`` (784-128-64-10), CrossEntropyLoss, Adam lr=1e-3, batch 64, 5 epochs.
- ``mnist-cnn``: a small conv net on MNIST with random affine augmentation of every training
  sample (the input pipeline is the bottleneck when it runs per sample on the CPU).
- ``char-gpt``: a small byte-level GPT on a text corpus (random windows of the token stream,
  x and y shifted by one); scored by validation loss (bits per byte = loss / ln 2).
"""

from __future__ import annotations

import difflib
import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from looptune.bench import image_workload
from looptune.models import GPT, GPTConfig, ImageCNN, SimpleFeedForwardNN, SmallCNN, lm_loss
from looptune.data.loaders import ImageData, normalize_batch
from looptune.errors import ConfigError
from looptune.measure.metric import ACCURACY, VAL_LOSS, MetricSpec

__all__ = ["SimpleFeedForwardNN", "Workload", "WORKLOADS", "get_workload", "evaluate",
           "score_accuracy", "score_lm_loss"]

# Mean and std of MNIST's training pixels scaled to [0, 1]: the tutorial's Normalize((0.1307,), (0.3081,))
MNIST_MEAN, MNIST_STD = 0.1307, 0.3081


Score = Callable[[nn.Module, ImageData, torch.device], tuple[float, int]]  # -> (sum, count)


@dataclass(frozen=True, kw_only=True)
class Workload:
    name: str
    description: str
    build_model: Callable[..., nn.Module]  # build_model(**options), right after manual_seed
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    load: Callable[..., tuple[ImageData, ImageData]]  # load(data_dir=..., **options) -> (train, eval)
    default_epochs: int  # the epoch count `looptune bench WORKLOAD` runs by default
    metric: MetricSpec = ACCURACY  # what `score` measures on the evaluation data
    score: Score = None  # type: ignore[assignment]  # (model, data, device) -> (sum, count)
    options: dict[str, Any] = field(default_factory=dict)  # workload options and their defaults
    unit: str = "samples"  # what samples/s counts (a token window is a sample of `context` tokens)
    data_info: Callable[..., dict[str, Any]] | None = None  # data_info(data_dir=, **options)
    # check_data(data_dir=, **options) -> training samples; raises before any training
    check_data: Callable[..., int] = None  # type: ignore[assignment]
    recipe_set: str = "mnist-mlp"  # whose recipes it runs (looptune.presets.REGISTRIES key)

    def check_options(self, given: dict[str, Any]) -> dict[str, Any]:
        """The workload's options with ``given`` applied; unknown ones raise ConfigError."""
        unknown = sorted(k for k, v in given.items() if k not in self.options and v is not None)
        if unknown:
            allowed = ", ".join(self.options) or "none"
            raise ConfigError(f"workload {self.name} takes no option {', '.join(unknown)}: its "
                              f"options are {allowed}.")
        return {**self.options, **{k: v for k, v in given.items() if v is not None}}


def _load_mnist(*, data_dir: str | None = None) -> tuple[ImageData, ImageData]:
    from looptune.data import mnist

    (train_x, train_y), (test_x, test_y) = (mnist.load(split, data_dir=data_dir)
                                            for split in ("train", "test"))
    return (ImageData(images=train_x, labels=train_y, mean=MNIST_MEAN, std=MNIST_STD),
            ImageData(images=test_x, labels=test_y, mean=MNIST_MEAN, std=MNIST_STD))


def mnist_train() -> torch.utils.data.TensorDataset:
    """MNIST's training split as ``(uint8 28x28 image, int64 label)`` samples, from ``--data``'s
    usual search ($LOOPTUNE_DATA, then the user cache): a ready ``--dataset`` for ``looptune pack``
    (``looptune pack --dataset looptune.bench.workloads:mnist_train mnist-train.pack``)."""
    from looptune.data import mnist

    return torch.utils.data.TensorDataset(*mnist.load("train"))


def _load_mnist_augmented(*, data_dir: str | None = None) -> tuple[ImageData, ImageData]:
    """MNIST whose training images get a random affine each time they are drawn (test: none)."""
    import dataclasses

    from looptune.data.augment import RandomAffine

    train, test = _load_mnist(data_dir=data_dir)
    return dataclasses.replace(train, augment=RandomAffine()), test


def _load_text(*, data_dir: str | None = None, corpus: str = "pystdlib", context: int = 128,
               max_bytes: int = 1 << 20) -> tuple[ImageData, ImageData]:
    """A corpus's bytes as (train, validation) windows of ``context`` tokens, x and y shifted by
    one; the per-sample pipeline slices the stream the way nanoGPT-style code does."""
    from looptune.data import text

    _check_context_option(context)
    found = _corpus(corpus, data_dir, max_bytes)
    train_tokens, val_tokens = text.split_tokens(found)
    for which, tokens in (("train", train_tokens), ("val", val_tokens)):
        text.check_context(context, len(tokens), which)
    per_sample = functools.partial(_token_windows_dataset, train_tokens.numpy(), context)
    (train_x, train_y), (val_x, val_y) = ((x.contiguous(), y.contiguous()) for x, y in (
        text.token_windows(train_tokens, context), text.token_windows(val_tokens, context)))
    return (ImageData(images=train_x, labels=train_y, per_sample=per_sample),
            ImageData(images=val_x, labels=val_y))


@functools.lru_cache(maxsize=4)
def _corpus(spec: str, data_dir: str | None, max_bytes: int):
    from looptune.data import text

    return text.load_corpus(spec, data_dir=data_dir, max_bytes=max_bytes)


def _check_mnist(*, data_dir: str | None = None) -> int:
    from looptune.data import mnist

    mnist.verify(data_dir)  # checksums: the files hold exactly the published counts
    return mnist.COUNTS["train"]


def _check_text(*, data_dir: str | None = None, corpus: str = "pystdlib", context: int = 128,
                max_bytes: int = 1 << 20) -> int:
    """The corpus exists, is text, and both splits hold at least one window of ``context``;
    returns the training windows."""
    from looptune.data import text

    _check_context_option(context)
    if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 1024:
        raise ConfigError(f"max_bytes={max_bytes!r} is invalid: an integer >= 1024 (bytes of "
                          "the pystdlib corpus to use), e.g. --max-bytes 1048576.")
    found = _corpus(corpus, data_dir, max_bytes)
    train_tokens, val_tokens = text.split_tokens(found)
    for which, tokens in (("train", train_tokens), ("val", val_tokens)):
        try:
            text.check_context(context, len(tokens), which)
        except ConfigError as err:  # say which corpus (and which --max-bytes) was too short
            raise ConfigError(f"{err} (corpus {found.name!r}: {found.num_bytes} bytes"
                              + (f", --max-bytes {max_bytes}" if corpus == "pystdlib" else "")
                              + ")") from None
    return (len(train_tokens) - 1) // context  # text.token_windows' count


def _text_info(*, data_dir: str | None = None, corpus: str = "pystdlib", context: int = 128,
               max_bytes: int = 1 << 20) -> dict[str, Any]:
    """What the LM trained on, for the results' provenance (the corpus varies with its source)."""
    found = _corpus(corpus, data_dir, max_bytes)
    return {"corpus": found.name, "corpus_source": found.source, "corpus_sha256": found.sha256,
            "corpus_bytes": found.num_bytes, "context": context}


def _token_windows_dataset(stream, context: int, _data: ImageData, _decoder: str = "pil"):
    from looptune.data.text import TokenWindowDataset

    return TokenWindowDataset(stream, context, which="train")


def _check_context_option(context: Any) -> None:
    if isinstance(context, bool) or not isinstance(context, int) or not 2 <= context <= 4096:
        raise ConfigError(f"context={context!r} is invalid: an integer in [2, 4096] tokens, "
                          "e.g. --context 128.")


def _gpt(*, context: int = 128, **_: Any) -> GPT:
    return GPT(GPTConfig(context=context))


@torch.no_grad()
def score_accuracy(model: nn.Module, data: ImageData, device: torch.device,
                   batch_size: int = 2000) -> tuple[float, int]:
    """(correct top-1 predictions, samples) of ``model`` on ``data``."""
    was_training = model.training
    model.eval()
    images, labels = data.images.to(device), data.labels.to(device)
    correct = torch.zeros((), dtype=torch.int64, device=device)
    for x, y in zip(images.split(batch_size), labels.split(batch_size)):
        logits = model(normalize_batch(x, data.mean, data.std))
        correct += (logits.argmax(dim=1) == y).sum()
    model.train(was_training)
    return float(correct.item()), len(data)  # sync: once, at the end


@torch.no_grad()
def score_lm_loss(model: nn.Module, data: ImageData, device: torch.device,
                  batch_size: int = 64) -> tuple[float, int]:
    """(sum over windows of the mean next-token loss in nats, windows): every window of the
    validation split, in fp32, so recipes are compared on the same numbers."""
    was_training = model.training
    model.eval()
    total = torch.zeros((), dtype=torch.float64, device=device)
    for x, y in zip(data.images.split(batch_size), data.labels.split(batch_size)):
        x, y = x.to(device), y.to(device)
        total += lm_loss(model(x), y).double() * len(x)
    model.train(was_training)
    return float(total.item()), len(data)  # sync: once, at the end


WORKLOADS: dict[str, Workload] = {
    "mnist-mlp": Workload(
        name="mnist-mlp",
        description="MNIST, MLP 784-128-64-10, CrossEntropyLoss, Adam lr=1e-3, batch 64",
        build_model=SimpleFeedForwardNN, loss_fn=nn.CrossEntropyLoss(), load=_load_mnist,
        default_epochs=5, score=score_accuracy, check_data=_check_mnist),
    "mnist-cnn": Workload(
        name="mnist-cnn",
        description="MNIST with random affine augmentation (10 deg, 10% shift, 0.9-1.1 scale), "
                    "conv net 2x(conv3x3 stride 2 + BN + ReLU) + linear, Adam, batch 64",
        build_model=SmallCNN, loss_fn=nn.CrossEntropyLoss(), load=_load_mnist_augmented,
        default_epochs=3, score=score_accuracy, check_data=_check_mnist, recipe_set="mnist-cnn"),
    "char-gpt": Workload(
        name="char-gpt",
        description="byte-level GPT (4 layers, 4 heads, 128 wide) on a text corpus, windows of "
                    "`context` bytes, AdamW; scored by validation loss (bits/byte = loss / ln 2)",
        build_model=_gpt, loss_fn=lm_loss, load=_load_text, default_epochs=1, metric=VAL_LOSS,
        score=score_lm_loss, unit="windows", data_info=_text_info, check_data=_check_text,
        recipe_set="char-gpt",
        options={"corpus": "pystdlib", "context": 128, "max_bytes": 1 << 20}),
    "jpeg-folder": Workload(
        name="jpeg-folder",
        description="a folder of JPEGs (DIR/train, DIR/test) read from disk, per-sample decode + "
                    "RandomResizedCrop + flip + Normalize, ImageCNN at 32 x 32, Adam one-cycle",
        build_model=ImageCNN, loss_fn=nn.CrossEntropyLoss(), load=image_workload.load_folders,
        default_epochs=6, score=image_workload.score_folder, check_data=image_workload.check_folders,
        data_info=image_workload.folder_info, recipe_set="jpeg-folder"),
}
# CLI aliases: `looptune bench mnist` names the dataset; the workload is the reference one.
ALIASES = {"mnist": "mnist-mlp", "cnn": "mnist-cnn", "gpt": "char-gpt", "lm": "char-gpt",
           "images": "jpeg-folder", "jpeg": "jpeg-folder"}


def get_workload(name: str) -> Workload:
    """Look up a workload by name or alias; the error lists what exists and the closest name."""
    name = ALIASES.get(name, name)
    if name in WORKLOADS:
        return WORKLOADS[name]
    names = [*WORKLOADS, *ALIASES]
    close = difflib.get_close_matches(name, names, n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    raise ConfigError(f"unknown workload {name!r}: valid names are {', '.join(names)}.{hint}")


def evaluate(model: nn.Module, data: ImageData, device: torch.device, batch_size: int = 2000) -> float:
    """Top-1 accuracy of ``model`` on ``data`` (a fraction in [0, 1])."""
    correct, count = score_accuracy(model, data, device, batch_size)
    return correct / count
