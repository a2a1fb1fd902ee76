"""``loader.store='autocast'``: a dataset normalized once, kept in the step's autocast dtype.

Under bf16/fp16 autocast a model whose first op is a matmul or convolution casts its float32
input to the autocast dtype at every step. Stored in that dtype already, the per-step gather
moves half the bytes and the cast disappears, and the step computes exactly the same numbers,
as long as the model's first op really casts its input (a first op that autocast keeps in
float32, such as a LayerNorm or a scaling of the input, would see different values).

So it is checked, not assumed: at setup, the model's forward under autocast on up to 256 stored
samples, as float32 and as the autocast dtype, in eval mode and without gradients (no dropout, no
BatchNorm statistics updated); the dataset is converted only when the two outputs are equal bit
for bit, and the decision records which, with the reason.
"""

from __future__ import annotations

from typing import Any

import torch

from looptune.recipe import Decision

__all__ = ["CHECK_SAMPLES", "store_in_autocast_dtype"]

CHECK_SAMPLES = 256
_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def store_in_autocast_dtype(source: Any, model: torch.nn.Module, precision: str,
                            device: torch.device) -> Decision:
    """Convert ``source.images`` (normalized float32 rows) to the autocast dtype of
    ``precision`` when the model's forward is bit-identical that way; say which, and why."""
    dtype = _DTYPES.get(precision)
    images = getattr(source, "images", None)
    if dtype is None or not getattr(source, "ready", False) or images is None:
        return Decision("loader.store", "float32", reason=(
            f"kept float32: store='autocast' needs precision bf16/fp16 (got {precision!r}) and "
            "a dataset normalized once on the device (strategy='device', normalize='once')"))
    sample = images[:CHECK_SAMPLES].to(device)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad(), torch.autocast(device.type, dtype=dtype):
            as_float = model(sample)
            as_stored = model(sample.to(dtype))
    finally:
        model.train(was_training)
    name = str(dtype).removeprefix("torch.")
    if not (isinstance(as_float, torch.Tensor) and torch.equal(as_float, as_stored)):
        return Decision("loader.store", "float32", reason=(
            f"kept float32: the model's forward under {precision} autocast gave different "
            f"outputs for {len(sample)} samples stored as {name} (its first op does not cast "
            "its input to the autocast dtype)"))
    source.images = images.to(dtype)
    return Decision("loader.store", name, reason=(
        f"the dataset is kept in {name}: the model's forward under {precision} autocast gave "
        f"bit-identical outputs for {len(sample)} samples stored that way (its first op casts "
        f"its input to {name} anyway), so each step gathers half the bytes and skips that cast"))
