"""Typed errors that the command layer turns into one clear line and an exit code.

Every error a user can cause (a missing path, a corrupt trace, a bad option) is raised as a
subclass of :class:`FsdpvizError`. ``fsdpviz.cli`` catches them, prints ``error: <message>`` on
stderr and exits with :attr:`FsdpvizError.exit_code` (2), never with a traceback. Anything else
that escapes is a bug in fsdpviz and keeps its traceback.
"""

from __future__ import annotations

from pathlib import Path

EXIT_BAD_INPUT = 2


class FsdpvizError(Exception):
    """Base class for errors caused by the user's input or environment."""

    exit_code: int = EXIT_BAD_INPUT


class UsageError(FsdpvizError):
    """Bad command-line arguments or option combinations."""


class TraceError(FsdpvizError):
    """A trace file that cannot be read: missing, empty, truncated, corrupt or not Kineto."""

    def __init__(self, path: str | Path, problem: str) -> None:
        self.path = str(path)
        self.problem = problem
        super().__init__(f"{self.path}: {problem}")


class DuplicateRankError(FsdpvizError):
    """Two trace files claim the same rank."""

    def __init__(self, rank: int, first: str | Path, second: str | Path) -> None:
        self.rank = rank
        super().__init__(f"rank {rank} appears in two files: {first} and {second}")


class RunFolderError(FsdpvizError):
    """A run folder that is missing pieces or cannot be written."""


class NoDataError(FsdpvizError):
    """Input that parses but holds nothing to analyse (e.g. no events in the analysis window)."""
