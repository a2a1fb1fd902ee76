"""How each layer of ``step.backward='mlp'`` runs under ``precision='bf16'``: in bf16 or in fp32,
whichever its own matmuls ran faster at the run's batch size, timed on this machine at setup (off
the clock). On a CPU, oneDNN's bf16 kernels win on wide layers and lose on narrow ones (per-call
overhead), so autocast's all-or-nothing choice costs time either way (see fastpath/mlp.py)."""

from __future__ import annotations

import statistics
import time
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from looptune.fastpath.mlp_plan import Layer

__all__ = ["choose_bf16"]

WIN = 0.05  # a layer runs in bf16 only when its matmuls are >= 5% faster that way
ROUNDS, ROUND_S = 5, 0.004


def choose_bf16(layers: list[Layer], batch_size: int, input_dtype: torch.dtype) -> str:
    """Set each layer's ``bf16`` by timing its own matmuls both ways at ``batch_size`` (forward,
    weight gradient and, past the first layer, input gradient, with bf16's casts); return the
    figures, for the run's decisions."""
    parts = []
    for i, layer in enumerate(layers):
        out_f, in_f = layer.weight.shape
        if i == 0 and input_dtype == torch.bfloat16:  # stored in bf16 (loader.store='autocast')
            layer.bf16 = True  # as the store's check ran it: autocast's bf16 first layer
            parts.append(f"{layer.name} {in_f}->{out_f}: bf16 (its input is stored in bf16)")
            continue
        gen, device = torch.Generator().manual_seed(i), layer.weight.device
        a = torch.randn(batch_size, in_f, generator=gen).to(
            device, input_dtype if i == 0 else torch.float32)
        g = torch.randn(batch_size, out_f, generator=gen).to(device)
        fp32, bf16 = _layer_costs(layer, a, g, backward_input=i > 0)
        layer.bf16 = bf16 <= (1 - WIN) * fp32
        parts.append(f"{layer.name} {in_f}->{out_f}: fp32 {fp32 * 1e6:.0f} us, bf16 "
                     f"{bf16 * 1e6:.0f} us -> {'bf16' if layer.bf16 else 'fp32'}")
    return "; ".join(parts)


def _layer_costs(layer: Layer, a: torch.Tensor, g: torch.Tensor, *, backward_input: bool):
    w, b = layer.weight, layer.bias
    bias = b if b is not None else torch.zeros(w.shape[0], device=w.device)

    def sync() -> None:
        if w.device.type == "cuda":
            torch.cuda.synchronize(w.device)  # sync: the timed kernels must have finished

    def fp32() -> None:
        a32 = a.float()
        torch.addmm(bias, a32, w.t())
        g.t().mm(a32)
        if backward_input:
            g.mm(w)

    def bf16() -> None:
        wb, gb, ab = w.to(torch.bfloat16), g.to(torch.bfloat16), a.to(torch.bfloat16)
        torch.addmm(bias.to(torch.bfloat16), ab, wb.t())
        gb.t().mm(ab).float()
        if backward_input:
            gb.mm(wb)

    times: dict[str, list[float]] = {"fp32": [], "bf16": []}
    for round_ in range(ROUNDS + 1):  # round 0 warms both up, untimed
        for name, fn in (("fp32", fp32), ("bf16", bf16)):
            sync()
            t0, n = time.perf_counter(), 0
            while (elapsed := time.perf_counter() - t0) < ROUND_S or n < 2:
                fn()
                n += 1
                if n % 8 == 0:
                    sync()
            sync()
            elapsed = time.perf_counter() - t0
            if round_:
                times[name].append(elapsed / n)
    return statistics.median(times["fp32"]), statistics.median(times["bf16"])
