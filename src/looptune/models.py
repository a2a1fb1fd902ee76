"""The models of the built-in workloads: the reference MLP (the tutorial's SimpleFeedForwardNN), a
small conv net for MNIST with augmentation, and a small GPT-style byte-level language model
(nanoGPT's shape). Plain ``nn.Module`` s that import nothing from looptune: the workloads (bench)
and the presets' per-machine probe both build them."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

__all__ = ["SimpleFeedForwardNN", "SmallCNN", "ImageCNN", "GPTConfig", "GPT", "lm_loss"]


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


class SmallCNN(nn.Module):
    """Two strided 3x3 convolutions with BatchNorm and ReLU, then a linear classifier.

    28x28x1 -> 14x14x8 -> 7x7x16 -> 10 logits. Strided convolutions instead of max-pooling: on a
    CPU the pooling layers' backward cost as much as the convolutions at these sizes. Accepts
    N x 28 x 28 or N x 1 x 28 x 28 inputs.
    """

    def __init__(self, channels: tuple[int, int] = (8, 16), classes: int = 10) -> None:
        super().__init__()
        c1, c2 = channels
        self.features = nn.Sequential(
            nn.Conv2d(1, c1, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(c1), nn.ReLU(),
            nn.Conv2d(c1, c2, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(c2), nn.ReLU())
        self.head = nn.Linear(c2 * 7 * 7, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() == 3:
            x = x.unsqueeze(1)  # N x H x W -> N x 1 x H x W
        return self.head(self.features(x).flatten(1))


class ImageCNN(nn.Module):
    """Three strided 3x3 convolutions with BatchNorm and ReLU, then a linear classifier over the
    flattened features: N x 3 x S x S colour images (S = 32: 32 -> 16 -> 8 -> 4) -> 10 logits.
    Small on purpose: on a folder of JPEGs its step is a fraction of the per-sample decode and
    augmentation, as a GPU's step is (issue 33)."""

    def __init__(self, channels: tuple[int, int, int] = (16, 32, 64), classes: int = 10,
                 size: int = 32) -> None:
        super().__init__()
        if size % 8:
            raise ValueError(f"size={size}: must be a multiple of 8 (three stride-2 layers)")
        layers: list[nn.Module] = []
        previous = 3
        for c in channels:
            layers += [nn.Conv2d(previous, c, 3, stride=2, padding=1, bias=False),
                       nn.BatchNorm2d(c), nn.ReLU()]
            previous = c
        self.features = nn.Sequential(*layers)
        self.head = nn.Linear(previous * (size // 8) ** 2, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).flatten(1))


@dataclass(frozen=True, kw_only=True)
class GPTConfig:
    """nanoGPT's config, sized for a CPU: bytes in, bytes out."""

    vocab_size: int = 256  # byte-level: every byte is a token, no tokenizer file
    context: int = 128  # tokens the model attends over (block_size)
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 128
    dropout: float = 0.0  # off: the benchmark compares speed at equal quality


class _Attention(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.n_head = cfg.n_head
        self.qkv = nn.Linear(cfg.n_embd, 3 * cfg.n_embd)
        self.proj = nn.Linear(cfg.n_embd, cfg.n_embd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.n_head, c // self.n_head).transpose(1, 2) for z in (q, k, v))
        # nanoGPT's "flash" path; which kernel runs is the recipe's choice (StepConfig.attention)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).contiguous().view(b, t, c))


class _Block(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(cfg.n_embd), nn.LayerNorm(cfg.n_embd)
        self.attn = _Attention(cfg)
        self.mlp = nn.Sequential(nn.Linear(cfg.n_embd, 4 * cfg.n_embd), nn.GELU(),
                                 nn.Linear(4 * cfg.n_embd, cfg.n_embd))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """A small decoder-only transformer (pre-LayerNorm, causal attention, tied embeddings).

    ``forward(idx)`` takes N x T token ids (any integer dtype, e.g. the uint8 bytes as stored)
    and returns N x T x vocab logits.
    """

    def __init__(self, cfg: GPTConfig | None = None) -> None:
        super().__init__()
        self.cfg = cfg = cfg or GPTConfig()
        self.tok = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.pos = nn.Embedding(cfg.context, cfg.n_embd)
        self.blocks = nn.ModuleList(_Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.n_embd)
        self.head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        self.head.weight = self.tok.weight  # weight tying, as GPT-2 and nanoGPT
        self.apply(self._init)
        for name, p in self.named_parameters():  # GPT-2: scaled init of the residual projections
            if name.endswith(("attn.proj.weight", "mlp.2.weight")):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * cfg.n_layer))

    @staticmethod
    def _init(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        t = idx.shape[1]
        if t > self.cfg.context:
            raise ValueError(f"sequence of {t} tokens is longer than the model's context "
                             f"{self.cfg.context}")
        idx = idx.long()  # bytes arrive as uint8 (4x-8x fewer bytes moved); embeddings need int64
        x = self.tok(idx) + self.pos(torch.arange(t, device=idx.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy in nats over every position of the batch."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1).long())
