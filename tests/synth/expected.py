"""The answers a correct analysis must give for a simulated run, derived from the model's truth.

Everything here is computed from :class:`~synth.timeline.Truth` (the intervals the simulation
created and knows the meaning of) with its own small interval code, never with fsdpviz's.

Times are absolute nanoseconds as the loader reports them. ``raw`` tables are on each rank's own
clock (what its trace says); ``aligned`` ones are on the reference rank's clock (rank 0), which is
what the analysis reports once it has corrected clocks that disagree.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from .scenario import ROOT, Scenario
from .timeline import AUTOGRAD, MAIN, Truth

LANE_NAMES = {MAIN: "main", AUTOGRAD: "autograd"}


def lane_name(lane: tuple[str, Any]) -> str:
    """The loader's name for a simulated lane (``main``, ``autograd``, ``stream 24``)."""
    return f"stream {lane[1]}" if lane[0] == "gpu" else LANE_NAMES[lane]


def _at(value: Any, i: int) -> int:
    return int(value[i]) if isinstance(value, np.ndarray) else int(value)


def merge(intervals: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Union of half-open intervals, sorted and disjoint."""
    out: list[list[int]] = []
    for start, end in sorted(i for i in intervals if i[1] > i[0]):
        if out and start <= out[-1][1]:
            out[-1][1] = max(out[-1][1], end)
        else:
            out.append([start, end])
    return [(a, b) for a, b in out]


class Union:
    """A merged set of intervals with prefix sums, to measure coverage in O(log n)."""

    def __init__(self, intervals: list[tuple[int, int]]) -> None:
        merged = merge(intervals)
        self.starts = [a for a, _ in merged]
        self.ends = [b for _, b in merged]
        self.before = [0]
        for a, b in merged:
            self.before.append(self.before[-1] + b - a)

    def covered_until(self, t: int) -> int:
        """Length of the union before ``t``."""
        i = bisect.bisect_right(self.starts, t) - 1
        if i < 0:
            return 0
        return self.before[i] + min(t, self.ends[i]) - self.starts[i]

    def uncovered(self, start: int, end: int) -> int:
        """Length of ``[start, end)`` outside the union."""
        return end - start - (self.covered_until(end) - self.covered_until(start))


@dataclass(kw_only=True, slots=True)
class Expected:
    """Expected analysis results (see module docstring for the clocks)."""

    spans: pd.DataFrame
    """rank, step, micro, unit, phase, kind, lane, start_ns, end_ns, issue_ns, bytes (aligned clock)."""
    unit_steps: pd.DataFrame
    """Per (rank, step, unit, phase): ag_issue_ns, ag_start_ns, ag_end_ns, ag_exposed_ns,
    compute_start_ns, compute_ns, prefetch_lead_ns, issue_depth, rs_exposed_ns, ar_exposed_ns,
    peak_allocated_bytes, n_passes (NaN / -1 where not applicable). With several micro-batches
    per step: durations summed over them, the first start, the last end, the smallest lead and
    depth, the highest window peak."""
    step_peaks: pd.DataFrame
    """Per (rank, step): peak_allocated_bytes, peak_t_ns (aligned), unit, phase."""
    clock_offsets: dict[int, int]
    """rank -> how far its clock runs ahead of the reference rank's (ns)."""
    skew: pd.DataFrame
    """Per (step, unit, phase, kind) collective: start_skew_ns (true), late_rank."""
    steps: pd.DataFrame
    """Per (rank, step): start_ns, end_ns on the rank's own clock."""
    baseline_bytes: int
    """Sharded parameters + gradients + optimizer state, allocated before recording."""
    bound: pd.DataFrame
    """Per (rank, step): what the GPU did inside the step (ns): window_ns, busy_ns, compute_ns (the
    model's kernels: neither a collective nor FSDP's copies), fsdp_kernels_ns (busy with neither an
    exposed collective nor the model's kernels: FSDP's copies alone), fsdp_overhead_ns (those and the
    host wait spent in FSDP's per-unit hooks before the awaited launch), exposed_comm_ns (collectives while no other GPU work ran),
    host_wait_ns (idle ended by work whose start waited for its launch, for the step's last gap the
    next work after it), other_idle_ns (idle ended by work that waited for its stream or an event)."""


def build_expected(sc: Scenario, truth: Truth, ranks: list[int], timeline_of: dict[int, int]) -> Expected:
    """Expected answers for ``ranks``; ``timeline_of`` maps a rank to its simulated timeline."""
    offsets = {r: sc.clock_offset_ns.get(r, 0) for r in ranks}
    ref = offsets[min(ranks)]
    to_aligned = sc.base_time_ns + ref
    spans_rows, unit_rows, peak_rows, step_rows, bound_rows = [], [], [], [], []
    for r in ranks:
        i = timeline_of[r]
        compute = Union([(_at(a, i), _at(b, i)) for a, b in truth.compute_kernels])
        memory = ([_at(t, i) for t, *_ in truth.memory], [level for _, level, *_ in truth.memory])
        for step, (a, b) in truth.steps.items():
            step_rows.append({"rank": r, "step": step, "start_ns": _at(a, i) + sc.base_time_ns + offsets[r],
                              "end_ns": _at(b, i) + sc.base_time_ns + offsets[r]})
        spans = [(s, _at(s.start, i), _at(s.end, i), _at(s.issue, i)) for s in truth.spans]
        for s, a, b, iss in spans:
            spans_rows.append({"rank": r, "step": s.step, "micro": s.micro, "unit": s.unit, "phase": s.phase, "kind": s.kind,
                               "lane": lane_name(s.lane), "start_ns": a + to_aligned, "end_ns": b + to_aligned,
                               "issue_ns": iss + to_aligned, "bytes": s.bytes})
        unit_rows += _unit_steps(r, spans, compute, memory, truth, i, to_aligned)
        peak_rows += _step_peaks(r, truth, i, to_aligned)
        bound_rows += _bound(r, truth, i)
    skew_rows = _skew(truth, ranks, timeline_of) if len(ranks) > 1 else []
    return Expected(
        spans=pd.DataFrame(spans_rows),
        unit_steps=pd.DataFrame(unit_rows),
        step_peaks=pd.DataFrame(peak_rows),
        clock_offsets={r: offsets[r] - ref for r in ranks},
        skew=pd.DataFrame(skew_rows, columns=["step", "unit", "phase", "kind", "start_skew_ns", "late_rank"]),
        steps=pd.DataFrame(step_rows),
        baseline_bytes=truth.baseline_bytes,
        bound=pd.DataFrame(bound_rows),
    )


# The bound's fields (fsdpviz.analysis.bound.RankBound, BoundSummary) beside the ``Expected.bound``
# column each must equal, and how closely (ms): host wait and other idle may trade the launch
# latency's µs (a kernel launched just before a gap began, starting after it).
BOUND_FIELDS: tuple[tuple[str, str, float], ...] = (
    ("step_ms", "window_ns", 0.001), ("compute_ms", "compute_ns", 0.001),
    ("exposed_comm_ms", "exposed_comm_ns", 0.001), ("host_wait_ms", "host_wait_ns", 0.002),
    ("other_idle_ms", "other_idle_ns", 0.002), ("fsdp_kernels_ms", "fsdp_kernels_ns", 0.001),
    ("fsdp_overhead_ms", "fsdp_overhead_ns", 0.002))


def bound_ms(bound: pd.DataFrame, steps: list[int]) -> pd.DataFrame:
    """Per rank (the index), each ``Expected.bound`` column's mean over ``steps``, in ms."""
    mine = bound[bound["step"].isin(steps)]
    return mine.groupby("rank")[[column for _, column, _ in BOUND_FIELDS]].mean() / 1e6


def _length(intervals: list[tuple[int, int]]) -> int:
    return sum(b - a for a, b in intervals)


def _clip(intervals: list[tuple[int, int]], lo: int, hi: int) -> list[tuple[int, int]]:
    return [(max(a, lo), min(b, hi)) for a, b in intervals if min(b, hi) > max(a, lo)]


def _bound(rank: int, truth: Truth, i: int) -> list[dict]:
    """Per step, the split of its window by what the simulation knows of each GPU event: when it ran,
    whether it is a collective or one of FSDP's own copies, what its start waited for and when it was
    launched; and of the CPU, when it ran FSDP's per-unit hooks."""
    work = sorted((_at(a, i), _at(b, i), comm, bool(host[i]) if isinstance(host, np.ndarray) else bool(host),
                   _at(launch, i), fsdp) for a, b, comm, host, launch, fsdp in truth.gpu_work)
    hooks = Union(merge([(_at(a, i), _at(b, i)) for a, b in truth.fsdp_hooks]))
    starts = [w[0] for w in work]
    rows = []
    for step, (a, b) in truth.steps.items():
        lo, hi = _at(a, i), _at(b, i)
        busy = merge(_clip([(s, e) for s, e, *_ in work], lo, hi))
        others = Union(merge(_clip([(s, e) for s, e, comm, *_ in work if not comm], lo, hi)))
        model = merge(_clip([(s, e) for s, e, comm, _, _, fsdp in work if not comm and not fsdp], lo, hi))
        exposed = sum(others.uncovered(s, e) for s, e in merge(_clip([(s, e) for s, e, comm, *_ in work if comm], lo, hi)))
        host = other = fsdp_host = 0
        edges = [lo] + [e for _, e in busy]
        for gap_start, gap_end in zip(edges, [s for s, _ in busy] + [hi]):
            if gap_end <= gap_start:
                continue
            # the work that ends the GPU's idle time (after the step's end for the last gap)
            first = bisect.bisect_left(starts, gap_end)
            enders = work[first:bisect.bisect_right(starts, starts[first])] if first < len(starts) else []
            waited = [w for w in enders if w[3]]
            if waited:
                # of the wait, the host's time inside FSDP's hooks before it launched that work
                until = min(max(w[4] for w in waited), gap_end)
                theirs = max(until - gap_start, 0) - hooks.uncovered(gap_start, max(until, gap_start))
                fsdp_host += theirs
                host += gap_end - gap_start - theirs
            else:
                other += gap_end - gap_start
        kernels = _length(busy) - exposed - _length(model)
        rows.append({"rank": rank, "step": step, "window_ns": hi - lo, "busy_ns": _length(busy),
                     "compute_ns": _length(model), "exposed_comm_ns": exposed, "fsdp_kernels_ns": kernels,
                     "fsdp_overhead_ns": kernels + fsdp_host, "host_wait_ns": host, "other_idle_ns": other})
    return rows


def _unit_steps(rank: int, spans: list, compute: Union, memory: tuple[list[int], list[int]], truth: Truth,
                i: int, to_aligned: int) -> list[dict]:
    """Per (step, micro-batch, unit, phase) from the model's spans, then folded into the step."""
    by_key: dict[tuple[int, int, str, str], dict[str, list]] = {}
    for s, a, b, iss in spans:
        if s.unit == "":
            continue
        by_key.setdefault((s.step, s.micro, s.unit, s.phase), {}).setdefault(s.kind, []).append(
            (a, b, iss, s.bytes))
    # every compute piece of every unit, for the issue depth of gathers
    pieces = [(s.step, s.micro, s.unit, s.phase, a, b) for s, a, b, _ in spans if s.kind == "compute" and s.unit]
    rows = []
    for (step, micro, unit, phase), kinds in by_key.items():
        row: dict[str, Any] = {"rank": rank, "step": step, "unit": unit, "phase": phase}
        comp = sorted(kinds.get("compute", []))
        row["compute_start_ns"] = comp[0][0] + to_aligned if comp else -1
        row["compute_ns"] = sum(b - a for a, b, _, _ in comp)
        ag = kinds.get("all_gather", [])
        assert len(ag) <= 1, "one gather per unit and phase"
        if ag:
            a, b, iss, nbytes = ag[0]
            row.update(ag_issue_ns=iss + to_aligned, ag_start_ns=a + to_aligned, ag_end_ns=b + to_aligned,
                       ag_ns=b - a, ag_bytes=nbytes, ag_exposed_ns=compute.uncovered(a, b))
            row["prefetch_lead_ns"] = comp[0][0] - b if comp else np.nan
            first = comp[0][0] if comp else b
            running = {u for st, mi, u, ph, pa, pb in pieces
                       if st == step and mi == micro and ph == phase and u != unit and pa < first and pb > a}
            # the root encloses every other unit: its own compute counts only when nothing else ran
            others = running - {ROOT}
            row["issue_depth"] = len(others) if others or unit == ROOT else int(ROOT in running)
        else:
            row.update(ag_issue_ns=-1, ag_start_ns=-1, ag_end_ns=-1, ag_ns=0, ag_bytes=-1, ag_exposed_ns=0,
                       prefetch_lead_ns=np.nan, issue_depth=-1)
        for kind, col in (("reduce_scatter", "rs"), ("all_reduce", "ar")):
            items = kinds.get(kind, [])
            row[f"{col}_ns"] = sum(b - a for a, b, _, _ in items)
            row[f"{col}_exposed_ns"] = sum(compute.uncovered(a, b) for a, b, _, _ in items)
        row["peak_allocated_bytes"] = _window_peak(truth, memory, step, micro, unit, phase, i)
        row["n_passes"] = int((step, micro, unit, phase) in truth.windows)
        rows.append(row)
    return _fold_micro_batches(rows)


def _fold_micro_batches(rows: list[dict]) -> list[dict]:
    """One row per (rank, step, unit, phase): what a step of several micro-batches adds up to."""
    folded: dict[tuple, dict] = {}
    for row in rows:
        key = (row["rank"], row["step"], row["unit"], row["phase"])
        if key not in folded:
            folded[key] = dict(row)
            continue
        out = folded[key]
        for col in ("compute_ns", "ag_ns", "ag_exposed_ns", "rs_ns", "rs_exposed_ns", "ar_ns", "ar_exposed_ns",
                    "n_passes"):
            out[col] += row[col]
        for col in ("ag_issue_ns", "ag_start_ns", "compute_start_ns"):
            known = [v for v in (out[col], row[col]) if v >= 0]
            out[col] = min(known) if known else -1
        out["ag_end_ns"] = max(out["ag_end_ns"], row["ag_end_ns"])
        out["ag_bytes"] = out["ag_bytes"] + row["ag_bytes"] if min(out["ag_bytes"], row["ag_bytes"]) >= 0 \
            else max(out["ag_bytes"], row["ag_bytes"])
        leads = [v for v in (out["prefetch_lead_ns"], row["prefetch_lead_ns"]) if not np.isnan(v)]
        out["prefetch_lead_ns"] = min(leads) if leads else np.nan
        depths = [v for v in (out["issue_depth"], row["issue_depth"]) if v >= 0]
        out["issue_depth"] = min(depths) if depths else -1
        out["peak_allocated_bytes"] = max(out["peak_allocated_bytes"], row["peak_allocated_bytes"])
    return list(folded.values())


def _window_peak(truth: Truth, memory: tuple[list[int], list[int]], step: int, micro: int, unit: str,
                 phase: str, i: int) -> int:
    """Highest allocated level in the unit's window: the level it entered with, or any sample in it.
    (Samples are in time order: the simulation allocates in program order.)"""
    window = truth.windows.get((step, micro, unit, phase))
    if window is None:
        return -1
    lo, hi = _at(window[0], i), _at(window[1], i)
    times, levels = memory
    first = bisect.bisect_right(times, lo) - 1  # the level entered with
    first = first if first >= 0 else bisect.bisect_left(times, lo)
    last = bisect.bisect_right(times, hi)
    return max(levels[first:last]) if last > first else -1


def _step_peaks(rank: int, truth: Truth, i: int, to_aligned: int) -> list[dict]:
    """Per step its first highest sample, and what each memory category held there."""
    rows = []
    held = dict(truth.baseline_categories)
    level_before = truth.baseline_bytes
    by_sample = []
    for (_, level, *_), category in zip(truth.memory, truth.memory_categories):
        held[category] = held.get(category, 0) + level - level_before
        level_before = level
        by_sample.append(dict(held))
    for step in truth.steps:
        samples = [(level, _at(t, i), ctx, k) for k, (t, level, _, ctx, st) in enumerate(truth.memory) if st == step]
        if not samples:
            continue
        best = max(level for level, *_ in samples)
        level, t, ctx, k = next(s for s in samples if s[0] == best)  # the first time the peak is reached
        rows.append({"rank": rank, "step": step, "peak_allocated_bytes": level, "peak_t_ns": t + to_aligned,
                     "unit": ctx[0] if ctx else "", "phase": ctx[1] if ctx else "", "categories": by_sample[k]})
    return rows


def _skew(truth: Truth, ranks: list[int], timeline_of: dict[int, int]) -> list[dict]:
    rows = []
    for s in truth.spans:
        if s.kind not in ("all_gather", "reduce_scatter", "all_reduce"):
            continue
        starts = {r: _at(s.start, timeline_of[r]) for r in ranks}
        late = max(starts, key=lambda r: (starts[r], -r))
        rows.append({"step": s.step, "unit": s.unit, "phase": s.phase, "kind": s.kind,
                     "start_skew_ns": starts[late] - min(starts.values()), "late_rank": late})
    return rows
