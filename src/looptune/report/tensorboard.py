"""``looptune diagnose --tensorboard DIR``: the diagnosis as TensorBoard scalars and text, since
that is where users already look. Needs the ``tensorboard`` package (``looptune[tensorboard]``)."""

from __future__ import annotations

import os
from pathlib import Path

from looptune.diagnose.result import Diagnosis
from looptune.report.diagnose_sections import bound_text

__all__ = ["tensorboard_problem", "write_diagnosis"]

_FIX = "pip install 'looptune[tensorboard]'"


def tensorboard_problem(log_dir: str | os.PathLike) -> str | None:
    """Why ``--tensorboard log_dir`` cannot work here (None when it can), before any run."""
    try:
        from torch.utils.tensorboard import SummaryWriter  # needs the `tensorboard` package
    except ImportError as err:
        return (f"--tensorboard {str(log_dir)!r} needs the tensorboard package ({err}); "
                f"install it: {_FIX}, or drop --tensorboard.")
    del SummaryWriter  # imported only to see that it imports
    path = Path(log_dir)
    parent = path if path.exists() else path.parent
    if path.is_file() or not parent.exists() or not os.access(parent, os.W_OK):
        return (f"--tensorboard {str(log_dir)!r} cannot be written (a file is in the way, or its "
                "parent is not a writable folder). Choose another folder.")
    return None


def write_diagnosis(d: Diagnosis, log_dir: str | os.PathLike) -> Path:
    """Write ``d`` as a TensorBoard run in ``log_dir``: per measured step ``looptune/step_ms`` and
    ``looptune/data_wait_ms``, the phase shares ``looptune/share/<phase>``, the median
    ``looptune/phase_ms/<phase>``, the step's parts ``looptune/part_ms/<part>`` and
    ``looptune/part_share/<part>`` (forward, backward, optimizer, optimizer.update, ...), each
    step's loss ``looptune/loss``, and the verdict with its remedies as text."""
    from torch.utils.tensorboard import SummaryWriter

    with SummaryWriter(str(log_dir)) as w:
        for i, s in enumerate(d.step_s):
            w.add_scalar("looptune/step_ms", s * 1e3, i)
        for i, s in enumerate(d.data_wait_step_s or []):
            w.add_scalar("looptune/data_wait_ms", s * 1e3, i)
        for phase, share in d.shares.items():
            w.add_scalar(f"looptune/share/{phase}", share, 0)
            w.add_scalar(f"looptune/phase_ms/{phase}", d.phase_ms.get(phase, 0.0), 0)
        for part, ms in d.part_ms.items():  # forward, backward, optimizer, optimizer.<part>
            w.add_scalar(f"looptune/part_ms/{part}", ms, 0)
            w.add_scalar(f"looptune/part_share/{part}", d.part_shares.get(part, 0.0), 0)
        for i, loss in enumerate(d.losses):
            if loss is not None:
                w.add_scalar("looptune/loss", loss, i)
        w.add_text("looptune/verdict", _verdict_markdown(d), 0)
    return Path(log_dir)


def _verdict_markdown(d: Diagnosis) -> str:
    lines = [f"**bottleneck: {d.bottleneck}** ({d.script}; {d.steps_measured} steps, median "
             f"{d.step_ms:.2f} ms)", "", str(d.evidence.get("reason", "")), ""]
    if d.data_cause:
        lines += [f"**data cause: {d.data_cause}**: {d.input_chain.get('reason', '')}", ""]
    lines += [f"{i}. {r.action} ({bound_text(r)}): {r.reason}"
              for i, r in enumerate(d.remedies, 1)]
    lines += [f"- [{f.severity}] {f.message}" for f in d.findings]
    return "\n".join(lines)
