"""The container the loader returns: the whole run's ``TraceSet``.

It holds pandas DataFrames typed by :mod:`fsdpviz.trace.schema` and carries no behaviour beyond
selecting rows, so the analysis stays a set of pure functions on tables. (One rank's tables travel
between processes as numpy columns: ``kineto.RankColumns``.)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from fsdpviz.runfolder import RunInfo
from fsdpviz.trace import schema

if TYPE_CHECKING:
    import pandas as pd

MAX_PLAUSIBLE_WORLD_SIZE = 1 << 20


@dataclass(kw_only=True, slots=True)
class TraceSet:
    """Every rank of one run on one clock.

    Attributes:
        events: one row per usable trace event (schema.EVENTS), all ranks.
        lanes: CPU threads and GPU streams per rank (schema.LANES).
        steps: ``ProfilerStep#N`` ranges per rank (schema.STEPS).
        memory: allocator samples from ``[memory]`` events (schema.MEMORY).
        ranks: one row per source trace file (schema.RANKS).
        timers: per-step timers of a run folder (schema.TIMERS), empty without one.
        units: FSDP units from run.json (schema.UNITS), empty without one.
        run: the run folder's run.json (typed, :class:`fsdpviz.runfolder.RunInfo`), else None.
        run_dir: the run folder, when the input was one.
        sources: the trace files read, in rank order.
        skipped: JSON files found in the given folders that are not Kineto traces.
        skipped_exports: fsdpviz's own Perfetto exports found in the given folders, not read
            (:mod:`fsdpviz.trace.onerun`).
        torn_timers: timer files whose last line could not be read (a rank stopped mid-write, or the
            file was cut) and was left out.
    """

    events: pd.DataFrame
    lanes: pd.DataFrame
    steps: pd.DataFrame
    memory: pd.DataFrame
    ranks: pd.DataFrame
    timers: pd.DataFrame = field(default_factory=lambda: schema.make_empty(schema.TIMERS))
    units: pd.DataFrame = field(default_factory=lambda: schema.make_empty(schema.UNITS))
    run: RunInfo | None = None
    run_dir: str | None = None
    sources: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    skipped_exports: list[str] = field(default_factory=list)
    torn_timers: list[str] = field(default_factory=list)

    @property
    def rank_ids(self) -> list[int]:
        """The ranks present, sorted."""
        return sorted(int(r) for r in self.ranks["rank"])

    @property
    def world_size(self) -> int:
        """World size from the traces' ``distributedInfo`` (or run.json), else the number of ranks."""
        if self.run is not None and self.run.world_size:
            return int(self.run.world_size)
        sizes = [int(s) for s in self.ranks["world_size"] if int(s) > 0]
        return max(sizes) if sizes else len(self.ranks)

    @property
    def missing_ranks(self) -> list[int]:
        """Ranks below ``world_size`` that no trace holds, sorted ([] for an implausible world size,
        which only a damaged header gives)."""
        if self.world_size > MAX_PLAUSIBLE_WORLD_SIZE:
            return []
        present = set(self.rank_ids)
        return [r for r in range(self.world_size) if r not in present]

    @property
    def skipped_events(self) -> dict[int, int]:
        """Events the loader skipped (unknown phase or category, bad times), per rank that had any."""
        return {int(r): int(n) for r, n in zip(self.ranks["rank"], self.ranks["n_skipped"]) if n > 0}

    @property
    def memory_devices(self) -> dict[int, str]:
        """Per rank with memory samples, the device its memory is analysed on (the GPU with most
        samples, else ``cpu``), as the parser counted them on every sample."""
        return {int(r): str(d) for r, d in zip(self.ranks["rank"], self.ranks["memory_device"]) if str(d)}

    def source_of(self, rank: int) -> str:
        """Path of the trace file that holds ``rank`` ("" if unknown)."""
        rows = self.ranks.loc[self.ranks["rank"] == rank, "path"]
        return str(rows.iloc[0]) if len(rows) else ""

    def describe_sources(self) -> str:
        """A short name for the input, for error messages: the run folder or the file(s)."""
        if self.run_dir:
            return self.run_dir
        if len(self.sources) == 1:
            return self.sources[0]
        return ", ".join(self.sources[:3]) + (" ..." if len(self.sources) > 3 else "")

