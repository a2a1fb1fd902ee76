"""``--verify``: rerun the script with the top remedy applied and measure before -> after.

What can be applied to an unmodified script from outside:

* ``loader``: ``DataLoader(num_workers=..., ...)`` - every DataLoader is built with those settings;
* ``batch``: ``batch_size B -> kB`` - every DataLoader gets ``batch_size=kB``; compared per
  sample (a step then carries k times the samples);
* ``tensorized``: pre-decode - every map-style dataset is read once into tensors and batches are
  gathered by index (:mod:`looptune.diagnose.predecode`);
* ``precision``: bf16 autocast - the whole script runs under ``torch.autocast(dtype=bfloat16)``
  (and ``sdpa_kernel(SDPBackend.MATH)`` when the remedy says so).

The top remedy is rerun when it is one of these; otherwise the highest-ranked one that is, and the
result says so. A measured gain below ``SHORT`` x its bound is reported as falling short, and
the remedy is ranked by what it measured, not by what it promised.
"""

from __future__ import annotations

import ast
import dataclasses
from collections.abc import Callable
from statistics import median
from typing import Any

from looptune.diagnose import predecode
from looptune.diagnose.model import Remedy, Verdict
from looptune.errors import ConfigError, MeasurementError

__all__ = ["SHORT", "apply_measured", "parse_loader_action", "verify_remedy"]

SHORT = 0.7  # a measured gain below this share of the promised bound is reported as short of it
_RERUNNABLE = ("loader", "batch", "tensorized", "precision")


def parse_loader_action(action: str) -> dict[str, Any]:
    """``"DataLoader(num_workers=1, persistent_workers=True)"`` -> the keyword arguments."""
    call = ast.parse(action.strip(), mode="eval").body
    if not isinstance(call, ast.Call):
        raise ConfigError(f"cannot apply remedy {action!r}: not a DataLoader(...) call")
    return {kw.arg: ast.literal_eval(kw.value) for kw in call.keywords if kw.arg}


def _how(remedy: Remedy, batch: int | None, decode_s: float | None = None
         ) -> tuple[dict[str, Any] | None, str | None] | None:
    """(DataLoader overrides, autocast) that apply ``remedy``; None: not from outside. autocast:
    ``"bf16"``, or ``"bf16+math-sdpa"`` when the remedy pins scaled_dot_product_attention's math
    kernel too (as its bound was measured: the CPU flash kernel's bf16 backward is slow)."""
    if remedy.kind == "loader" and remedy.action.startswith("DataLoader("):
        return parse_loader_action(remedy.action), None
    if remedy.kind == "batch" and batch and remedy.action.startswith(f"batch_size {batch} -> "):
        new = int(remedy.action.split("->", 1)[1].split()[0])
        return {"batch_size": new}, None
    if remedy.kind == "tensorized" and remedy.action.startswith("pre-decode"):
        if decode_s is None or decode_s > predecode.BUDGET_S:
            return None  # a stream (no length), or too long to read once for a rerun
        return {predecode.PREDECODE: True}, None  # diagnose/predecode.py
    if remedy.kind == "precision" and remedy.action.startswith("bf16"):
        return None, "bf16+math-sdpa" if "SDPBackend.MATH" in remedy.action else "bf16"
    return None


def verify_remedy(verdict: Verdict, before: Any, steps: int,
                  rerun: Callable[..., Any]) -> dict[str, Any]:
    """Rerun with the top applicable remedy; ``rerun(loader_overrides=, autocast=)`` runs the
    script again and returns its run (step_s, error, measurements)."""
    loaders = before.measurements.loaders
    batch = loaders[0].batch_size if loaders else None
    samples = getattr(loaders[0], "samples", None) if loaders else None
    wait_ms = verdict.phase_ms.get("data_wait", 0.0)
    # pre-decoding reads every sample once, at the rate the script's own data wait shows
    decode_s = wait_ms / 1e3 / batch * samples if batch and samples else None
    chosen = next(((r, how) for r in verdict.remedies
                   if (how := _how(r, batch, decode_s)) is not None), None)
    if chosen is None:
        kinds = ", ".join(sorted({r.kind for r in verdict.remedies})) or "none"
        return {"remedy": None, "reason": f"no remedy that can be applied from outside the script "
                f"(those are {', '.join(_RERUNNABLE)}; this diagnosis has {kinds}): nothing was "
                "rerun"}
    remedy, (overrides, autocast) = chosen
    out: dict[str, Any] = {
        "remedy": remedy.action, "kind": remedy.kind, "overrides": overrides,
        "autocast": autocast, "before_step_ms": verdict.step_ms,
        "expected_speedup": remedy.expected_speedup, "top": remedy is verdict.remedies[0]}
    if not out["top"]:
        top = verdict.remedies[0]
        pre = top.kind == "tensorized" and top.action.startswith("pre-decode")
        why = ("it cannot be applied from outside the script" if not pre else
               "the dataset has no length (a stream): nothing to gather by index"
               if decode_s is None else
               f"reading its {samples} samples once would take ~{decode_s:.0f} s (more than "
               f"{predecode.BUDGET_S:.0f} s for a rerun)")
        out["note"] = (f"the top remedy ({top.action}) was not rerun: {why}; verified the "
                       "highest-ranked one that can be")
    predecode.reset()
    try:
        after = rerun(loader_overrides=overrides, autocast=autocast)
    except MeasurementError as err:  # the rerun never reached a step: keep the first diagnosis
        return {**out, "after_step_ms": None, "speedup": None, "error": str(err)}
    finally:
        predecode.release()  # the rerun is over: its pre-decoded datasets are not kept
    if remedy.kind == "tensorized":
        applied = any(info.dataset == "PreDecoded" for info in after.measurements.loaders)
    else:
        applied = bool(autocast) or any(all(getattr(info, k, v) == v for k, v in overrides.items())
                                        for info in after.measurements.loaders)
    complete = after.error is None and len(after.step_s) >= min(steps, len(before.step_s))
    after_ms = 1000 * median(after.step_s)
    out.update(after_step_ms=after_ms, after_steps_measured=len(after.step_s),
               after_stopped=after.stopped, after_error=after.error, applied=applied)
    per_step = verdict.step_ms / after_ms
    # a larger batch is compared per sample: each step then carries new/old times the samples
    scale = overrides["batch_size"] / batch if remedy.kind == "batch" else 1.0
    out["speedup"] = per_step * scale if applied and complete else None
    if remedy.kind == "batch":
        out["per_sample"] = True
    if not applied and predecode.refused:
        out["reason"] = ("the dataset was not pre-decoded for the rerun: "
                         + "; ".join(dict.fromkeys(predecode.refused)))
    elif not applied:
        out["reason"] = ("no DataLoader was constructed during the rerun with the remedy's "
                         "settings (created once at import, or reused): nothing to compare")
    elif out["speedup"] is not None and out["speedup"] < SHORT * remedy.expected_speedup:
        out["short"] = (f"measured {out['speedup']:.2f}x, short of the {remedy.expected_speedup:.2f}x "
                        f"bound (< {SHORT:.0%} of it): ranked by the measured gain")
    return out


def apply_measured(remedies: list[Remedy], checked: dict[str, Any] | None) -> list[Remedy]:
    """The remedies with the verified one's measured gain recorded; one that fell short of its
    bound is ranked by what it measured (fixes of kind "memory" stay first)."""
    if not checked or checked.get("speedup") is None:
        return remedies
    out = [dataclasses.replace(r, measured_speedup=round(checked["speedup"], 2))
           if r.action == checked["remedy"] else r for r in remedies]
    if not checked.get("short"):
        return out
    fixes = [r for r in out if r.kind == "memory"]
    rest = [r for r in out if r.kind != "memory"]
    return fixes + sorted(rest, key=lambda r: -(r.measured_speedup or r.expected_speedup))
