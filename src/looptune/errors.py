"""Exception hierarchy: every exception class looptune defines, in one place.

Every error looptune raises on purpose derives from :class:`LooptuneError`, so a CLI can turn it
into a clean message and exit code 2 while real bugs still show a traceback. Three are not
errors of the user's and derive from elsewhere on purpose: :class:`SampleError` (carried out of
a DataLoader worker and re-raised with the sample named), :class:`FastPathUnsupported` (the
engine falls back to autograd) and :class:`StopScript` (control flow, a BaseException).
"""

from __future__ import annotations

__all__ = ["LooptuneError", "ConfigError", "DataError", "MeasurementError", "NonFiniteLoss",
           "CheckpointWriteError", "Interrupted", "LaunchFailed", "SampleError", "FastPathUnsupported",
           "ScriptFailed", "StopScript"]


class LooptuneError(Exception):
    """Base class: a problem the user can fix; the message says what was received and the fix."""


class ConfigError(LooptuneError, ValueError):
    """One or more invalid settings. ``problems`` holds every problem found, not only the first."""

    def __init__(self, problems: list[str] | str) -> None:
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        if len(self.problems) == 1:
            message = self.problems[0]
        else:
            message = f"{len(self.problems)} problems:\n" + "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(message)


class DataError(LooptuneError):
    """A data file or folder is missing, truncated, corrupt or could not be fetched."""


class MeasurementError(LooptuneError):
    """A measurement could not be taken or makes no sense (e.g. zero steps measured)."""


class ScriptFailed(MeasurementError):
    """The user's script raised (or exited non-zero) before its first step boundary: nothing was
    measured. The message leads with the script's own exception and where it was raised;
    ``exit_code`` is the status ``python script.py`` would have exited with, ``hint`` the known
    fix (a torch migration) or None, ``record()`` what ``--json`` writes."""

    def __init__(self, message: str, *, error: str | None, where: str | None, hint: str | None,
                 exit_code: int, script: str, seen: str) -> None:
        super().__init__(message)
        self.error, self.where, self.hint, self.exit_code = error, where, hint, exit_code
        self.script, self.seen = script, seen

    def record(self) -> dict:
        return {"kind": "diagnosis-failed", "script": self.script, "error": self.error,
                "where": self.where, "hint": self.hint, "exit_code": self.exit_code,
                "seen": self.seen, "steps_measured": 0, "message": str(self)}


class FastPathUnsupported(Exception):
    """A workload-specific fast step (``looptune.fastpath``) does not compute this model, loss or
    run; the message says why. Not a user error: the Stepper runs autograd and records why."""


class LaunchFailed(LooptuneError):
    """A rank of a launched job failed; the message names each failed rank and why."""

    def __init__(self, message: str, failures: dict[int, str]) -> None:
        super().__init__(message)
        self.failures = failures  # global rank -> reason


class CheckpointWriteError(LooptuneError, OSError):
    """A checkpoint could not be written (disk full, folder gone read-only); the previous
    checkpoint is intact."""


class Interrupted(LooptuneError):
    """SIGINT/SIGTERM stopped the run after a whole step; ``exit_code`` is 128 + the signal."""

    def __init__(self, signum: int, message: str) -> None:
        super().__init__(message)
        self.signum, self.exit_code = signum, 128 + signum


class NonFiniteLoss(MeasurementError):
    """The loss became NaN or infinite; the message names epoch, step and the batch's samples."""


class SampleError(Exception):
    """The dataset raised on one sample; the message names it and the worker. Constructible from
    one string, so torch can carry it out of a worker process."""


class StopScript(BaseException):
    """Raised from a step hook to end the script once enough steps were measured.

    A BaseException, so a script's ``except Exception`` does not swallow it.
    """
