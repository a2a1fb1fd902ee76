"""Run a user's script as ``python script.py`` / ``python -m module`` would, inside this process.

``sys.argv``, ``sys.path`` and the script's modules are restored after it; a child the script
forks exits with the script's own status when it comes back here (it never reports); the exit
status is the one python would give; ``--verify`` builds every DataLoader with other settings.
"""

from __future__ import annotations

import contextlib
import os
import runpy
import sys
import traceback
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from looptune.diagnose.predecode import PREDECODE, predecoded
from looptune.errors import ScriptFailed
from looptune.measure.probes import StopScript

__all__ = ["KNOWN_FIXES", "Seen", "exit_status", "forget_script_modules", "forked_children_exit_alone",
           "known_fix", "module_exists", "overridden_loaders", "raised_where", "script_env",
           "script_failed", "script_name"]

# errors old scripts hit on a newer torch, exactly when a user first tries a tool on them: a
# pattern of the exception's text -> the known fix
KNOWN_FIXES: tuple[tuple[str, str], ...] = (
    ("Weights only load failed", (
        "torch >= 2.6 loads with weights_only=True by default, which refuses pickled objects "
        "other than tensors and plain containers. For a file you trust: torch.load(path, "
        "weights_only=False), or run with TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1; to keep the safe "
        "load, allow the classes it names with torch.serialization.add_safe_globals([...])")),
    ("torch._six", (
        "torch._six was removed in torch 2.0: use the standard library (math.inf, "
        "collections.abc, str) in its place")),
    ("has no attribute 'get_lr'", (
        "the scheduler's get_lr() is internal since torch 1.4: call scheduler.get_last_lr()")),
)


def module_exists(name: object) -> bool:
    import importlib.util

    if not isinstance(name, str) or not name:
        return False
    sys.path.insert(0, os.getcwd())  # as `python -m` will
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):  # a missing parent package, or a bad name
        return False
    finally:
        sys.path.pop(0)


@contextlib.contextmanager
def script_env(target: str | Callable, args: Sequence[str], module: bool) -> Iterator[Callable]:
    saved_argv, saved_path, threads = sys.argv[:], sys.path[:], torch.get_num_threads()
    modules_before = set(sys.modules)
    home: str | None = None  # the folder the script's own modules are imported from
    try:
        if callable(target):
            sys.argv = [getattr(target, "__name__", "<callable>"), *args]
            yield target
        elif module:
            sys.argv = [target, *args]
            home = os.getcwd()
            sys.path.insert(0, home)  # as `python -m` does
            yield lambda: runpy.run_module(target, run_name="__main__", alter_sys=True)
        else:
            sys.argv = [str(target), *args]
            home = str(Path(target).resolve().parent)
            sys.path.insert(0, home)  # as `python script.py` does
            yield lambda: runpy.run_path(str(target), run_name="__main__")  # argv[0] as given
    finally:
        sys.argv[:] = saved_argv
        sys.path[:] = saved_path
        torch.set_num_threads(threads)  # a script may change it; this process goes on after
        if home is not None:
            forget_script_modules(modules_before, home, saved_path)


def forget_script_modules(before: set[str], home: str, path: Sequence[str] = ()) -> list[str]:
    """Drop the modules the script imported from its own folder (``home``: the script's folder,
    or the working folder for ``-m``), so a rerun (--verify) or the next script imports them afresh,
    as a new process would. Packages it imported from anywhere else (site-packages, PYTHONPATH,
    ``pip --target``, user installs; ``path``: the import path besides ``home``) stay: dropping them
    while other packages kept references to their objects broke a LightningCLI rerun (issue 32:
    ``KeyError: <DocstringStyle.AUTO>``), and python keeps them too when one process runs a script
    twice. A module is the script's when ``home`` is the deepest import-path folder holding it (a
    ``pip --target libs`` inside the script's folder is not). Returns the names dropped."""
    import sysconfig

    def folder(p: str) -> str:
        return os.path.join(os.path.realpath(p or os.getcwd()), "")

    root = folder(home)
    others = [f for f in {folder(p) for p in path} | {folder(sysconfig.get_paths()[k]) for k in
              ("stdlib", "platstdlib", "purelib", "platlib")} if f != root]
    dropped = []
    for name in set(sys.modules) - before:
        file = getattr(sys.modules.get(name), "__file__", None)
        if not file or name.startswith("looptune"):
            continue
        real = os.path.realpath(file)
        if real.startswith(root) and not any(real.startswith(o) and len(o) > len(root)
                                             for o in others):
            del sys.modules[name]
            dropped.append(name)
    return dropped


def known_fix(error: str | None) -> str | None:
    """The known fix for an error old scripts hit on this torch, or None."""
    if not error:
        return None
    return next((fix for pattern, fix in KNOWN_FIXES if pattern in error), None)


def raised_where(exc: BaseException) -> str | None:
    """Where ``exc`` was raised: the deepest frame of the user's code (not looptune, not the
    standard library or installed packages), and the raising frame when it is elsewhere, e.g.
    "train.py:12 in main (raised in torch/serialization.py:1529 in load)"."""
    import sysconfig
    import traceback as tb

    frames = tb.extract_tb(exc.__traceback__)
    if not frames:
        return None
    system = tuple(sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib", "purelib", "platlib"))
    own = str(Path(__file__).resolve().parents[1])

    def shown(f: tb.FrameSummary) -> str:
        name = f.filename
        with contextlib.suppress(ValueError):  # under the working folder: relative to it
            name = rel if not (rel := os.path.relpath(name)).startswith("..") else name
        for root in system:  # an installed package: from its top folder
            if f.filename.startswith(root):
                name = os.path.relpath(f.filename, root)
        return f"{name}:{f.lineno} in {f.name}"

    user = [f for f in frames if not f.filename.startswith(system + (own,))
            and not f.filename.startswith("<")]
    last = frames[-1]
    if not user:
        return shown(last)
    return shown(user[-1]) + ("" if user[-1] is last else f" (raised in {shown(last)})")


@dataclass(frozen=True, kw_only=True)
class Seen:
    """How the script's run went, for the report and for "it never stepped"."""

    elapsed_s: float
    batches: int
    loaders: int
    stopped: str
    exit_code: int

    def summary(self) -> str:
        ended = {"script_ended": "ended normally", "error": "raised",
                 "interrupted": "was interrupted"}.get(self.stopped, f"ended ({self.stopped})")
        return (f"it ran {self.elapsed_s:.1f} s, drew {self.batches} batch(es) from "
                f"{self.loaders} DataLoader(s) and {ended}")


def exit_status(code: object) -> int:
    """The exit status ``sys.exit(code)`` gives a process: None -> 0, an int, anything else -> 1
    (python prints it)."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def forked_children_exit_alone(run: Callable[[], object], pid: int) -> None:
    """Run the script; a child it forked (``os.fork()``) that comes back here exits with the
    script's status instead of going on into diagnose (which would report a second time)."""
    try:
        run()
    except BaseException as exc:
        if os.getpid() == pid:
            raise
        code = 0 if isinstance(exc, StopScript) else (
            exit_status(exc.code) if isinstance(exc, SystemExit) else 1)
        if code == 1 and not isinstance(exc, SystemExit):
            traceback.print_exc()
        _exit_now(code)
    if os.getpid() != pid:
        _exit_now(0)


def _exit_now(code: int) -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


@contextlib.contextmanager
def overridden_loaders(overrides: dict[str, Any] | None) -> Iterator[None]:
    """--verify: construct every DataLoader with these keyword arguments instead."""
    if not overrides:
        yield
        return
    from torch.utils.data import DataLoader

    original = DataLoader.__init__

    def patched(self, *args, **kwargs):
        original(self, **_with_overrides(original, args, kwargs, overrides))

    DataLoader.__init__ = patched
    try:
        yield
    finally:
        DataLoader.__init__ = original


def _with_overrides(init: Any, args: tuple, kwargs: dict, overrides: dict[str, Any]) -> dict:
    """DataLoader's arguments, all by name, with ``overrides`` applied as DataLoader accepts
    them: with a ``batch_sampler`` (Accelerate, Lightning's distributed samplers) a new batch size
    rebuilds a torch BatchSampler, and is left out for any other kind (the rerun then reports that
    the remedy was not applied)."""
    import inspect

    from torch.utils.data import BatchSampler

    bound = inspect.signature(init).bind(None, *args, **kwargs).arguments
    bound.pop(next(iter(bound)))  # self
    named = {**bound.pop("kwargs", {}), **bound}  # a subclass's **kwargs
    overrides = dict(overrides)
    if overrides.pop(PREDECODE, False):  # --verify of the pre-decode remedy
        named = predecoded(named)
    if "batch_size" in overrides:
        size = overrides.pop("batch_size")
        sampler = named.get("batch_sampler")
        if sampler is None:
            named["batch_size"] = size
        elif type(sampler) is BatchSampler:
            named["batch_sampler"] = BatchSampler(sampler.sampler, size, sampler.drop_last)
    named.update(overrides)
    if named.get("num_workers", 0) == 0:  # these need workers; DataLoader would refuse
        named.pop("prefetch_factor", None)
        named["persistent_workers"] = False
    return named


def script_failed(error: str | None, where: str | None, seen: Seen, script: str) -> ScriptFailed:
    """The script's own failure before its first step, leading the message (issue 32)."""
    what = (f"the script raised before its first step: {error}" if error
            else f"the script exited with status {seen.exit_code} before its first step")
    hint = known_fix(error)
    message = (what + (f"\n  at {where}" if where else "")
               + (f"\n  known fix: {hint}" if hint else "")
               + f"\nNothing was measured ({seen.summary()}); diagnose reports once the script "
               "reaches its training loop: fix the error above and rerun.")
    return ScriptFailed(message, error=error, where=where, hint=hint, exit_code=seen.exit_code,
                        script=script, seen=seen.summary())


def script_name(target, args: Sequence[str], module: bool) -> str:
    name = f"-m {target}" if module else getattr(target, "__name__", str(target))
    return " ".join([name, *args])
