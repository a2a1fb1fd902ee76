"""Packed datasets: write a map-style dataset once into sharded little-endian files, read it back
with vectorized memmap reads. The layout lives in :mod:`looptune.data.pack.format`.

Example:
    >>> from looptune.data.pack import pack, open_packed, verify_packed
    >>> pack(dataset, "train.pack")  # doctest: +SKIP
    >>> ds = open_packed("train.pack"); xb, yb = ds.get_batch([0, 1, 2])  # doctest: +SKIP
"""

from looptune.data.pack.format import FORMAT_VERSION
from looptune.data.pack.reader import PackedDataset, open_packed, verify_packed
from looptune.data.pack.writer import pack

__all__ = ["FORMAT_VERSION", "PackedDataset", "open_packed", "pack", "verify_packed"]
