"""Adapters that attach looptune's diagnose probes inside training frameworks' own loops:
``looptune.integrations.lightning.DiagnoseCallback`` (PyTorch Lightning). Each needs its
framework installed (``pip install 'looptune[lightning]'``); the core install does not."""

from __future__ import annotations

__all__ = ["missing_extra"]


def missing_extra(package: str, extra: str, err: ImportError) -> ImportError:
    """The ImportError for a missing optional framework, naming the pip command that fixes it."""
    return ImportError(
        f"looptune.integrations.{extra} needs the {package!r} package, which is not installed "
        f"({err}). Install it beside your torch: pip install 'looptune[{extra}]' (it pins "
        "versions that keep the torch you have).")
