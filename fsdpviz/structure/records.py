"""Typed records the analysis hands to the commands and pages: notes and findings.

A **note** says why a number is missing or what it leaves out ("step 4 is not analysed: ...").
It is its words, as a string, and carries a stable ``code`` besides, so the report and compare pages choose notes by
what they mean (:data:`NO_UNIT_LABELS`, ...) rather than by matching their text; the summary's
JSON keeps the words only (``notes``, a list of strings: a contract).

A **finding** is a place where time or memory goes, in words with the numbers behind it: a run's
findings (an exposed all-gather of one unit, a straggler: ``lost_ms_per_step``, ``knob``) and a
comparison's findings (which run is better at one question: ``better``, ``values``) share this
one shape.
"""

from __future__ import annotations

from typing import Any, Final

import msgspec

# Note codes (stable; the words may change).
NO_PROFILER_STEP: Final = "no_profiler_step"  # a rank's trace has no ProfilerStep: analysed whole
STEPS_DROPPED: Final = "steps_dropped"  # steps left out as cut short
SKIPPED_FILES: Final = "skipped_files"  # JSON files in the folders that are no Kineto traces
SKIPPED_EXPORTS: Final = "skipped_exports"  # fsdpviz's own Perfetto exports found in the folders, not read
TORN_TIMERS: Final = "torn_timers"  # timer files whose last line was cut: left out
MISSING_RANKS: Final = "missing_ranks"  # ranks of the world without a trace
SKIPPED_EVENTS: Final = "skipped_events"  # events the loader could not use
UNCONNECTED_RANKS: Final = "unconnected_ranks"  # no collective although the world has several ranks
NO_TRAINING: Final = "no_training"  # no backward pass in any trace: no training step to analyse
DDP: Final = "ddp"  # DistributedDataParallel, not FSDP: no units
NO_FSDP_LABELS: Final = "no_fsdp_labels"  # no FSDP / fsdpviz labels: units is empty
NO_UNITS_FOUND: Final = "no_units_found"  # labels, but no unit in the analysed steps
UNITS_WITHOUT_WORK: Final = "units_without_work"  # units that ran nothing of their own: no entry
NO_COMMUNICATION: Final = "no_communication"  # overlap_pct is null
NO_UNIT_LABELS: Final = "no_unit_labels"  # the per-unit analysis found no unit labels
SHARED_COLLECTIVES: Final = "shared_collectives"  # ZeRO-3 buckets carried several units
UNIT_SIZES_UNKNOWN: Final = "unit_sizes_unknown"  # units whose size neither run.json nor an all-gather gives
CLOCK_MOVED: Final = "clock_moved"  # a rank's times were moved onto the reference clock
PARALLELISM_UNKNOWN: Final = "parallelism_unknown"  # a parallelism size is null
BY_PURPOSE_UNKNOWN: Final = "by_purpose_unknown"  # overlap.by_purpose is null (no FSDP labels)
PROFILER_COST_UNUSED: Final = "profiler_cost_unused"  # the step time is the traced one: the timers do not tell
PROFILED_WINDOW_PACE: Final = "profiled_window_pace"  # the profiled steps ran faster than the clean ones
CLEAN_STEPS_UNIT_TIMED: Final = "clean_steps_unit_timed"  # an older recording timed units in its clean steps
NO_MEMORY: Final = "no_memory"  # the analysed steps hold no memory samples: the peak is null


class Note(str):
    """A remark about a result: its words (the string itself) and its ``code`` (one of this module's
    constants). A string, so that it prints, joins and serialises as its words."""

    __slots__ = ("code",)
    code: str

    def __new__(cls, code: str, text: str) -> Note:  # noqa: PYI034 - Note is final in practice (3.10: no Self)
        note = super().__new__(cls, text)
        note.code = code
        return note

    @property
    def text(self) -> str:
        return str.__str__(self)

    def __repr__(self) -> str:
        return f"Note({self.code!r}, {self.text!r})"


def texts(notes: list[Note]) -> list[str]:
    """The words of ``notes`` as plain strings (what JSON and terminals show)."""
    return [n.text for n in notes]


class Finding(msgspec.Struct, kw_only=True):
    """Where a step loses time (a run's finding) or which run does better (a comparison's)."""

    kind: str
    """Run: ``exposed_all_gather``, ``exposed_reduce_scatter``, ``exposed_all_reduce``, ``straggler``,
    ``exposed_other``, ``profiler``;
    comparison: ``step_time``, ``exposed_comm``, ``memory``, ``prefetch``, ..."""
    message: str
    evidence: str = ""
    """The numbers behind it."""
    knob: str = ""
    """What to try, when the trace shows the cause ("" otherwise)."""
    rank: int = -1
    """The rank concerned; -1: medians over all ranks (and every comparison finding)."""
    unit: str = ""
    phase: str = ""
    lost_ms_per_step: float | None = None
    """Run findings: the time the step loses here."""
    better: str | None = None
    """Comparison findings: the label of the better run (None: within noise, or no better)."""
    values: dict[str, dict[str, Any]] = msgspec.field(default_factory=dict)
    """Comparison findings: the numbers compared, per run label."""
    cause: str = ""
    """Run findings: the cause as a word (analysis/findings.py ``CAUSE_*``); findings of one kind and
    cause are one action (analysis/actions.py)."""
    why_not: str = ""
    """Run findings: why the knob its cause suggests is not, on this run ("" where it is, or none is):
    prefetch where the training thread waits out every collective (analysis/actions.py ``knob_blocked``)."""

    def to_json(self) -> dict[str, Any]:
        """The finding as plain JSON values."""
        out: dict[str, Any] = msgspec.to_builtins(self)
        return out
