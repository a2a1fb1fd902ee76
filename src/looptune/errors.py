"""Exception hierarchy.

Every error looptune raises on purpose derives from :class:`LooptuneError`, so a CLI can turn it
into a clean message and exit code 2 while real bugs still show a traceback.
"""

from __future__ import annotations

__all__ = ["LooptuneError", "ConfigError", "DataError", "MeasurementError"]


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
