"""``--verify``: rerun the script with the top remedy applied and measure before -> after.

What can be applied to an unmodified script from outside:

* ``loader``: ``DataLoader(num_workers=..., ...)`` - every DataLoader is built with those settings;
* ``batch``: ``batch_size B -> kB`` - every DataLoader gets ``batch_size=kB``, and the
  optimizer's learning rate the scaling rule of its class (x k for SGD, x sqrt(k) for Adam and
  the other adaptive ones: :func:`looptune.diagnose.rules.batch.lr_rule`); compared per sample
  (a step then carries k times the samples);
* ``tensorized``: pre-decode - every map-style dataset is read once into tensors and batches are
  gathered by index (:mod:`looptune.diagnose.predecode`);
* ``precision``: bf16 autocast around each forward of the model (and
  ``sdpa_kernel(SDPBackend.MATH)`` when the remedy says so), or, where the step runs inside a
  training framework, that framework's own bf16 switch (:mod:`looptune.diagnose.apply`);
* ``optimizer``: the optimizer's constructor arguments (``fused=True`` / ``foreach=True``).

The top remedy is rerun when it is one of these (or, with ``prefer``, the highest-ranked of that
kind); otherwise the highest-ranked one that is, and the result says so. A measured gain below
``SHORT`` x its bound is reported as falling short, and the remedy is ranked by what it measured,
not by what it promised.

Every rerun is checked for **loss parity** (:mod:`looptune.measure.parity`): a remedy whose rerun
does not train like the original ("changes the training: loss X vs Y at step N") is never a
speedup. A larger batch changes the training by design: its rerun runs for the same wall time
as the original's measured steps and is judged by the time each took to the original's final
loss; its per-sample throughput is kept as context only.
"""

from __future__ import annotations

import ast
import dataclasses
from collections.abc import Callable, Sequence
from statistics import median
from typing import Any

import torch

from looptune.diagnose import predecode
from looptune.diagnose.apply import FRAMEWORK_SWITCH
from looptune.diagnose.rules.records import Remedy, Verdict
from looptune.measure.parity import loss_parity, time_to_loss
from looptune.diagnose.update_replay import impl_kwargs
from looptune.errors import ConfigError, MeasurementError

__all__ = ["MIN_COMPARABLE_STEPS", "RERUNNABLE", "SHORT", "applied_problems", "apply_measured", "combined",
           "parse_loader_action", "verify_remedy"]

SHORT = 0.7  # a measured gain below this share of the promised bound is reported as short of it
# a rerun that ended before its steps (the script's data ran out at the larger batch, it raised)
# is still compared when at least this many steps were measured: their median, marked partial
MIN_COMPARABLE_STEPS = 5
# remedies that change the training: rerun for the original's wall time, judged by the loss each
# run reached against time (its time to the original's final loss); bf16 must also train like the
# original over the same steps (loss parity)
CHANGES_TRAINING = ("batch", "precision")
RERUNNABLE = ("loader", "batch", "tensorized", "precision", "optimizer", "chain_contention",
              "chain_no_workers")
_IMPL_OF = {"fused=True": "fused", "foreach=True": "foreach", "foreach=False": "for-loop"}


def parse_loader_action(action: str) -> dict[str, Any]:
    """``"DataLoader(num_workers=1, persistent_workers=True)"`` -> the keyword arguments."""
    call = ast.parse(action.strip(), mode="eval").body
    if not isinstance(call, ast.Call):
        raise ConfigError(f"cannot apply remedy {action!r}: not a DataLoader(...) call")
    return {kw.arg: ast.literal_eval(kw.value) for kw in call.keywords if kw.arg}


def _how(remedy: Remedy, batch: int | None, decode_s: float | None = None
         ) -> dict[str, Any] | None:
    """The rerun's keyword arguments that apply ``remedy`` (``loader_overrides``, ``autocast``,
    ``framework``, ``optimizer``); None: not from outside. autocast: ``"bf16"``, or
    ``"bf16+math-sdpa"`` when the remedy pins scaled_dot_product_attention's math kernel too (as
    its bound was measured: the CPU flash kernel's bf16 backward is slow)."""
    if remedy.kind in ("loader", "chain_contention", "chain_no_workers") and \
            remedy.action.startswith("DataLoader("):
        return {"loader_overrides": parse_loader_action(remedy.action)}
    if remedy.kind == "batch" and batch and remedy.action.startswith(f"batch_size {batch} -> "):
        new = int(remedy.action.split("->", 1)[1].split()[0])
        return {"loader_overrides": {"batch_size": new},
                "lr_scale": remedy.lr_scale}  # (optimizer class, factor) or None
    if remedy.kind == "tensorized" and remedy.action.startswith("pre-decode"):
        if decode_s is None or decode_s > predecode.BUDGET_S:
            return None  # a stream (no length), or too long to read once for a rerun
        return {"loader_overrides": {predecode.PREDECODE: True}}  # diagnose/predecode.py
    if remedy.kind == "precision" and remedy.action.startswith("bf16"):
        framework = next((f for f, (_, _, _, text) in FRAMEWORK_SWITCH.items()
                          if text in remedy.action), None)
        if framework is not None:
            return {"framework": framework}
        return {"autocast": "bf16+math-sdpa" if "SDPBackend.MATH" in remedy.action else "bf16"}
    if remedy.kind == "optimizer" and remedy.action.startswith("torch.optim."):
        name = remedy.action[len("torch.optim."):].split("(", 1)[0]
        flag = next((f for f in _IMPL_OF if f in remedy.action), None)
        if flag is not None:
            return {"optimizer": (name, impl_kwargs(_IMPL_OF[flag]))}
    return None


def combined(applied: dict[str, Any], remedy: dict[str, Any]) -> dict[str, Any]:
    """The rerun's switches: those already applied with the remedy's on top (loader settings
    merged, a remedy's own switch replacing an applied one)."""
    out = dict(applied)
    for key, value in remedy.items():
        if key == "loader_overrides" and value is not None:
            out[key] = {**(applied.get(key) or {}), **value}
        elif value is not None or key not in out:
            out[key] = value
    return out


def _why_not(remedy: Remedy, batch: int | None, decode_s: float | None,
             samples: int | None) -> str:
    """Why a remedy of a rerunnable kind could not be applied from outside this script."""
    if remedy.kind == "batch":
        if batch is None:
            return ("no DataLoader feeds the step: the batch size is the script's own tensors, "
                    "change it in the script")
        return f"its action is not a change of the DataLoader's batch_size {batch}"
    if remedy.kind == "tensorized":
        if not remedy.action.startswith("pre-decode"):  # batched augmentation
            return ("its per-sample transform is random (pre-decoding would freeze one draw of "
                    "it): augmenting whole batches is a change to the script's code")
        if decode_s is None:
            return "the dataset has no length (a stream) or no DataLoader: nothing to gather by index"
        return (f"reading its {samples} samples once would take ~{decode_s:.0f} s (more than "
                f"{predecode.BUDGET_S:.0f} s for a rerun)")
    if remedy.kind in ("loader", "chain_contention", "chain_no_workers"):
        return "not a DataLoader(...) setting: a change to the script's code"
    return "not a switch the rerun can set: a change to the script's code"


def verify_remedy(verdict: Verdict, *, before: Any, steps: int, rerun: Callable[..., Any],
                  prefer: str | None = None, skip: Sequence[str] = ()) -> dict[str, Any]:
    """Rerun with the top applicable remedy (with ``prefer``, the highest-ranked applicable one of
    that kind; never one whose action is in ``skip``: --plan's remedies already tried);
    ``rerun(loader_overrides=, autocast=, framework=, optimizer=, lr_scale=, seconds=)`` runs the script
    again and returns its run (step_s, error, measurements, losses)."""
    loaders = before.measurements.loaders
    batch = loaders[0].batch_size if loaders else None
    samples = getattr(loaders[0], "samples", None) if loaders else None
    wait_ms = verdict.phase_ms.get("data_wait", 0.0)
    # pre-decoding reads every sample once, at the rate the script's own data wait shows
    decode_s = wait_ms / 1e3 / batch * samples if batch and samples else None
    chosen = next(((r, how) for r in verdict.remedies
                   if (prefer is None or r.kind == prefer) and r.action not in skip
                   and (how := _how(r, batch, decode_s)) is not None), None)
    if chosen is None:
        which = "no remedy" if prefer is None else f"no remedy of kind {prefer!r}"
        why = [f"{r.kind} ({'tried already' if r.action in skip else _why_not(r, batch, decode_s, samples)})"
               for r in verdict.remedies
               if r.kind in RERUNNABLE and (prefer is None or r.kind == prefer)]
        others = sorted({r.kind for r in verdict.remedies if r.kind not in RERUNNABLE})
        said = "; ".join(why + ([f"{', '.join(others)}: a change to the script's code"]
                                if others else [])) or "no remedies"
        return {"remedy": None, "reason": f"{which} could be applied from outside the script "
                f"({said}): nothing was rerun"}
    remedy, how = chosen
    kw = {"loader_overrides": None, "autocast": None, "framework": None, "optimizer": None,
          "lr_scale": None, "seconds": None, **how}
    overrides = kw["loader_overrides"]
    if remedy.kind in CHANGES_TRAINING:  # the same wall time, judged by the loss reached
        kw["seconds"] = sum(before.step_s)
    out: dict[str, Any] = {
        "remedy": remedy.action, "kind": remedy.kind, "overrides": overrides,
        "autocast": kw["autocast"], "framework": kw["framework"],
        "optimizer": None if kw["optimizer"] is None else {"class": kw["optimizer"][0],
                                                           **kw["optimizer"][1]},
        "lr_scale": None if kw["lr_scale"] is None else {"class": kw["lr_scale"][0],
                                                         "factor": kw["lr_scale"][1]},
        "before_step_ms": verdict.step_ms,
        "expected_speedup": remedy.expected_speedup, "top": remedy is verdict.remedies[0],
        "changes_training": None}  # set when the rerun did not train like the original
    if prefer is not None and not out["top"]:
        out["note"] = f"verified the highest-ranked remedy of kind {prefer!r}, as asked"
    elif not out["top"] and verdict.remedies[0].action in skip:
        out["note"] = (f"the top remedy ({verdict.remedies[0].action}) was tried already; "
                       "verified the highest-ranked one not tried")
    elif not out["top"]:
        top = verdict.remedies[0]
        why = ("it cannot be applied from outside the script" if top.kind not in RERUNNABLE
               else _why_not(top, batch, decode_s, samples))
        out["note"] = (f"the top remedy ({top.action}) was not rerun: {why}; verified the "
                       "highest-ranked one that can be")
    predecode.reset()
    try:
        after = rerun(**kw)
    except MeasurementError as err:  # the rerun never reached a step: keep the first diagnosis
        return {**out, "after_step_ms": None, "speedup": None, "error": str(err)}
    finally:
        predecode.release()  # the rerun is over: its pre-decoded datasets are not kept
    if remedy.kind == "tensorized":
        applied = any(info.dataset == "PreDecoded" for info in after.measurements.loaders)
    elif overrides:
        applied = any(all(getattr(info, k, v) == v for k, v in overrides.items())
                      for info in after.measurements.loaders)
    else:  # autocast, a framework switch, an optimizer's arguments: the patch was used
        applied = getattr(after, "applied", 0) > 0
    # complete: it ran to its step limit or its wall time, or as many steps as the original
    complete = after.error is None and (
        after.stopped in ("steps", "seconds") or len(after.step_s) >= min(steps, len(before.step_s)))
    after_ms = 1000 * median(after.step_s)
    out.update(after_step_ms=after_ms, after_steps_measured=len(after.step_s),
               after_stopped=after.stopped, after_error=after.error, applied=applied)
    per_step = verdict.step_ms / after_ms
    # a larger batch is compared per sample: each step then carries new/old times the samples
    scale = overrides["batch_size"] / batch if remedy.kind == "batch" else 1.0
    comparable = complete or len(after.step_s) >= MIN_COMPARABLE_STEPS
    out["speedup"] = per_step * scale if applied and comparable else None
    if applied and comparable and not complete:
        ended = f"raised {after.error}" if after.error else f"ended ({after.stopped})"
        out["partial"] = (f"measured over the {len(after.step_s)} step(s) the rerun made before "
                          f"it {ended}")
    elif applied and not comparable:
        out["not_comparable"] = (f"the rerun made {len(after.step_s)} step(s) (fewer than "
                                 f"{MIN_COMPARABLE_STEPS}) before it "
                                 + (f"raised {after.error}" if after.error else f"ended ({after.stopped})"))
    if not applied:
        out["loss_parity"] = None  # nothing was applied: nothing to compare
    elif remedy.kind in CHANGES_TRAINING and comparable:
        _judge_by_loss(out, before, after, remedy.kind, scale)
    if applied and comparable and remedy.kind != "batch":  # the same steps must train alike
        _check_parity(out, before, after)
    if not applied and predecode.refused:
        out["reason"] = ("the dataset was not pre-decoded for the rerun: "
                         + "; ".join(dict.fromkeys(predecode.refused)))
    elif not applied and overrides:
        out["reason"] = ("no DataLoader was constructed during the rerun with the remedy's "
                         "settings (created once at import, or reused): nothing to compare")
    elif not applied:
        out["reason"] = ("the remedy's switch was never used in the rerun (no model forward, "
                         "framework or optimizer construction went through it): nothing to "
                         "compare")
    else:
        _against_promise(out, remedy.expected_speedup)
    return out


def _against_promise(out: dict[str, Any], promised: float) -> None:
    """The measured gain as a share of the promise; below ``SHORT`` of it the remedy fell short
    (``measured_gain``: what it is ranked by). Where the gain itself could not be judged (a larger
    batch whose rerun was too short to reach the loss), its throughput bounds it from above: a
    bound below ``SHORT`` of the promise fell short too."""
    gain, how, why = out.get("speedup"), "measured", ""
    if gain is None and out.get("loss_parity") is not False and not out.get("not_comparable"):
        bound = out.get("per_sample_speedup") or out.get("per_step_speedup")
        if bound is not None and bound < SHORT * promised:
            gain, how = bound, "at most"
            why = (" per sample (a larger batch also needs more samples to the same loss)"
                   if out.get("per_sample") else " per step")
    if gain is None:
        return
    out["of_promise"] = gain / promised
    if gain < SHORT * promised:
        out["measured_gain"] = gain
        out["short"] = (f"fell short: {how} {gain:.2f}x{why}, {gain / promised:.0%} of the "
                        f"promised {promised:.2f}x (< {SHORT:.0%}): ranked by the measured gain")


def _check_parity(out: dict[str, Any], before: Any, after: Any) -> None:
    """A remedy that keeps the training must train like the original over the same steps."""
    check = loss_parity(list(getattr(before, "losses", []) or []),
                        list(getattr(after, "losses", []) or []))
    out["loss_parity"], out["loss_check"] = check["parity"], check
    if check["parity"] is False:
        out.setdefault("per_step_speedup", out["speedup"])  # context only
        out["speedup"] = None
        out["changes_training"] = (f"changes the training: loss {check['after_loss']:.4g} vs "
                                   f"{check['before_loss']:.4g} at step {check['at_step']} "
                                   f"({check['reason']}): not a speedup")


# a loss summed over the batch (reduction="sum", as the pytorch/examples VAE) grows with it: the
# rerun's first loss at k x the batch, over the original's, within this of k says "summed", and
# the rerun's losses are compared per sample (/ k). Assumed: at the start both runs' per-sample
# losses are those of the same initial weights (seen: 4.0x at k = 4 for the VAE)
SUMMED_WITHIN = 0.25


def _per_sample_losses(before: list, after: list, scale: float) -> tuple[list, bool]:
    """The rerun's losses on the original's scale: / ``scale`` when they are sums over the batch."""
    first_b = next((x for x in before if x is not None), None)
    first_a = next((x for x in after if x is not None), None)
    if scale <= 1 or not first_b or not first_a:
        return after, False
    if abs(first_a / first_b / scale - 1) > SUMMED_WITHIN:
        return after, False
    return [None if x is None else x / scale for x in after], True


def _judge_by_loss(out: dict[str, Any], before: Any, after: Any, kind: str,
                   scale: float = 1.0) -> None:
    """A remedy that changes the training (a larger batch, bf16): the loss each run reached
    against wall-clock time, the same time budget; its throughput is context only."""
    if kind == "batch":
        out["per_sample"] = True
        out["per_sample_speedup"] = out["speedup"]  # context only, never the promised gain
    else:
        out["per_step_speedup"] = out["speedup"]
    runs = [(list(getattr(r, "losses", []) or []), list(getattr(r, "all_step_s", []) or []),
             getattr(r, "measured_from", 0)) for r in (before, after)]
    losses, summed = _per_sample_losses(runs[0][0], runs[1][0], scale)
    if summed:  # compared per sample: the loss is a sum over the batch
        runs[1] = (losses, *runs[1][1:])
        out["loss_summed"] = (f"the loss is summed over the batch (the rerun's first loss "
                              f"{scale:g}x the original's): compared per sample")
    check = time_to_loss(*runs)
    out["time_to_loss"], out["loss_parity"] = check, None
    if check["speedup"] is None and kind != "batch":
        # a plateau, or the same wall time was too short to reach the loss: bf16 is judged per
        # step, the training over the same steps by loss parity
        out["judged_by"] = f"per step: {check['reason']}"
        return
    out["speedup"] = check["speedup"] if out["speedup"] is not None else None
    out["judged_by"] = "time to the original's loss, the same wall time for both runs"
    if check.get("progress") is False:
        out["reason"] = f"not judged: {check['reason']}"
    elif check["speedup"] is None or (kind == "batch" and check["speedup"] < 1):
        out["changes_training"] = f"changes the training: {check['reason']}"


def apply_measured(remedies: list[Remedy], checked: dict[str, Any] | None) -> list[Remedy]:
    """The remedies with the verified one's measured gain recorded; one that fell short of its
    bound is ranked by what it measured (fixes of kind "memory" stay first); one whose rerun
    did not train like the original goes last, with no measured gain."""
    if not checked or not checked.get("remedy"):
        return remedies
    if checked.get("loss_parity") is False:
        hit = [dataclasses.replace(r, loss_parity=False) for r in remedies
               if r.action == checked["remedy"]]
        return [r for r in remedies if r.action != checked["remedy"]] + hit
    if checked.get("speedup") is None and checked.get("short"):  # an upper bound fell short
        out = [dataclasses.replace(r, measured_speedup=round(checked["measured_gain"], 2),
                                   loss_parity=checked.get("loss_parity"))
               if r.action == checked["remedy"] else r for r in remedies]
        return _ranked_by_measurement(out)
    if checked.get("speedup") is None:
        if checked.get("changes_training"):  # a larger batch that never reached the loss
            hit = [r for r in remedies if r.action == checked["remedy"]]
            return [r for r in remedies if r.action != checked["remedy"]] + hit
        return [dataclasses.replace(r, loss_parity=checked.get("loss_parity"))
                if r.action == checked["remedy"] else r for r in remedies]
    parity = checked.get("loss_parity")
    out = [dataclasses.replace(r, measured_speedup=round(checked["speedup"], 2),
                               loss_parity=parity)
           if r.action == checked["remedy"] else r for r in remedies]
    return _ranked_by_measurement(out) if checked.get("short") else out


def _ranked_by_measurement(remedies: list[Remedy]) -> list[Remedy]:
    fixes = [r for r in remedies if r.kind == "memory"]
    rest = [r for r in remedies if r.kind != "memory"]
    return fixes + sorted(rest, key=lambda r: -(r.measured_speedup or r.expected_speedup))


_APPLIED = {"loader_overrides": "a dict of DataLoader keyword arguments",
            "autocast": "'bf16' or 'bf16+math-sdpa'",
            "framework": f"one of {sorted(FRAMEWORK_SWITCH)}",
            "optimizer": "(torch.optim class name, dict of constructor arguments)",
            "lr_scale": "(torch.optim class name, factor > 0)"}


def applied_problems(applied: Any) -> list[str]:
    """What is wrong with ``applied`` (the switches --plan carries between runs), before any run."""
    if applied is None:
        return []
    if not isinstance(applied, dict):
        return [f"applied={applied!r} is invalid: a dict of the rerun's switches ({', '.join(_APPLIED)})"]
    problems = [f"applied[{k!r}] is not a switch: allowed {', '.join(_APPLIED)}"
                for k in applied if k not in _APPLIED]

    def named_pair(v: Any, ok: Any) -> bool:
        return (isinstance(v, (tuple, list)) and len(v) == 2 and isinstance(v[0], str)
                and hasattr(torch.optim, v[0]) and ok(v[1]))

    checks = {"loader_overrides": lambda v: isinstance(v, dict),
              "autocast": lambda v: v in ("bf16", "bf16+math-sdpa"),
              "framework": lambda v: v in FRAMEWORK_SWITCH,
              "optimizer": lambda v: named_pair(v, lambda kw: isinstance(kw, dict)),
              "lr_scale": lambda v: named_pair(v, lambda f: isinstance(f, (int, float))
                                               and not isinstance(f, bool) and f > 0)}
    for key, ok in checks.items():
        value = applied.get(key)
        if value is not None and not ok(value):
            problems.append(f"applied[{key!r}]={value!r} is invalid: {_APPLIED[key]}")
    return problems
