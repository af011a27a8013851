"""What bounds a step: each step's time split into the model's compute, FSDP's per-unit work, exposed
communication, waiting for the host, and other idle.

A step that is slow for lack of GPU work needs other knobs than a step whose communication is
exposed. The split, per rank, over each analysed step's CPU-side span (``ProfilerStep#N``, so the
parts add up to the step time the user sees):

- ``exposed_comm``: communication no compute hid (the overlap's ``|comm| - |comm ∩ compute|``);
- ``compute``: the rest of the time the GPU was busy with the model's work (kernels, copies);
- ``fsdp_overhead``: FSDP's per-unit work (:mod:`fsdpviz.structure.fsdp_work`): the time the GPU ran
  only the copies FSDP's hooks launched (``fsdp_kernels``: copy-in, copy-out, the reduce-scatter
  input), and of each host-wait gap the time the host spent inside FSDP's hooks before the awaited
  launch (the GPU waited for FSDP); a coarser wrap runs fewer hooks;
- ``host_wait``: the rest of the GPU idle gaps that ended with work the host had not yet launched when the gap
  began: the GPU waited for the CPU (a launch-bound step). HTA 0.5's "host wait" is the same test
  (``get_idle_time_breakdown``: the next kernel's runtime call starts after the previous kernel
  ended), applied per stream; fsdpviz applies it to the whole device, so a gap on one stream while
  another computes is not idle;
- ``other_idle``: idle gaps whose next work had been launched before the gap began (the GPU waited on
  an event: a cross-stream dependency, a host-side collective to finish), or ended by work whose
  launch the trace does not hold; and the time the steps ran only work queued before them, beyond
  what their own ran after them (``carried_ns``, :func:`carried_work`: not their compute, and the
  first thing the de-profiler takes out).

On a CPU rank (no GPU stream) the training thread is the device: ``compute`` is its ops outside
collectives, waits and FSDP's ranges (those inside are ``fsdp_overhead``), ``exposed_comm`` the collectives nothing hid, ``host_wait`` does not apply
(null), and ``other_idle`` is the rest of the step (Python between ops, waits the trace does not
name).

The profiler slows the host (:mod:`fsdpviz.structure.profiler_cost`): on a launch-bound GPU step its
cost lands in ``host_wait``, on a CPU rank in every part. Each rank's split is moved to that rank's
clean unprofiled step (:mod:`fsdpviz.structure.deprofile`): on a CPU rank by the factor the replay's
calibration scales it by; on a GPU by the replay's split once the run's model is read
(:mod:`fsdpviz.replay.split`: ``deprofiled_by`` ``replay``), by the rule until then or where the
replay cannot say (``rule``). So the bound is the run's, not the profiler's.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import msgspec
import numpy as np
import pandas as pd

from fsdpviz.formatting import NS_PER_MS
from fsdpviz.structure.deprofile import (
    REPLAY_MOVED,
    Parts,
    ReplayMove,
    comm_scale,
    deprofiled,
    device_scale,
    host_scale,
    idle_scale,
    replay_moved,
)
from fsdpviz.structure.fsdp_work import launch_points
from fsdpviz.structure.intervals import (
    Intervals,
    clip_intervals,
    complement,
    overlap_ns,
    subtract_intervals,
    total_ns,
    union_intervals,
)
from fsdpviz.structure.profiler_cost import ProfilerCost
from fsdpviz.structure.steps import AnalysedSteps
from fsdpviz.trace import schema

# OVERLAP columns this module fills (sums over the analysed steps; -1: unknown).
BOUND_COLUMNS: Final = ("bound_window_ns", "bound_compute_ns", "bound_exposed_comm_ns", "host_wait_ns",
                        "other_idle_ns", "fsdp_kernels_ns", "fsdp_host_ns", "bound_comm_ns", "carried_ns")
UNKNOWN_NS: Final = -1

KIND_COMPUTE: Final = "compute"
KIND_COMMUNICATION: Final = "communication"
KIND_HOST: Final = "host"
KIND_IDLE: Final = "idle"
KIND_MIXED: Final = "mixed"
KIND_MEMORY: Final = "memory"
# A peak of allocated memory within this share of the device's memory is memory-bound: what the
# caching allocator reserves beyond the allocated bytes (its blocks' rounding and fragmentation,
# typically a few to 10 % of the peak on a GPU) and the CUDA context take the rest, so any setting
# that adds memory (larger units, less resharding, deeper prefetch, a larger micro-batch) risks an
# out-of-memory error.
MEMORY_MARGIN: Final = 0.10
# A part that takes at least this share of the step names the bound; below it, nothing dominates.
DOMINANT_SHARE: Final = 0.5
# A step compute dominates is still launch-bound, not compute-bound, while its host side (host wait
# and FSDP's per-unit work) takes at least this share of its compute: the host's work is then on
# the step's critical path as much as the kernels are, and a coarser wrap (fewer hooks, copies and
# launches) is as large a knob as faster kernels.
LAUNCH_BOUND_RATIO: Final = 0.5
BASIS_UNPROFILED: Final = "unprofiled"
BASIS_TRACED: Final = "traced"
# Which de-profiler moved a split to the clean step (``BoundSummary.deprofiled_by``): the replay's (each
# part less what the replay without the profiler took out of it, :mod:`fsdpviz.replay.split`) or the
# rule's (:func:`fsdpviz.structure.deprofile.deprofiled`, where the run has no such replay).
BY_REPLAY: Final = "replay"
BY_RULE: Final = "rule"
# A remainder the replay's split leaves to the rule (:func:`fsdpviz.structure.deprofile.replay_moved`)
# is named in the bound's note from this size on (ms a step, the note's precision): with the carried work
# and the replay's drop it adds up to profiler_share_ms.
REMAINDER_NOTE_MS: Final = 0.001


def step_windows(traces_steps: pd.DataFrame, rank: int, analysed: AnalysedSteps | None,
                 busy: Intervals) -> list[tuple[int, int]]:
    """The spans the split covers: each analysed step's CPU-side span, or the busy span of a trace
    without ProfilerSteps."""
    if analysed is not None and analysed.steps:
        rows = traces_steps[(traces_steps["rank"] == rank).to_numpy()
                            & traces_steps["step"].isin(list(analysed.steps)).to_numpy()]
        return [(int(s), int(e)) for s, e in zip(rows["start_ns"], rows["end_ns"]) if e > s]
    if len(busy[0]):
        return [(int(busy[0][0]), int(busy[1][-1]))]
    return []


def launch_times(events: pd.DataFrame, work: pd.DataFrame) -> np.ndarray:
    """Per row of ``work`` (GPU events): when the runtime call that launched it began (-1: unknown)."""
    return launch_points(events, work)[0]


def gap_starters(events: pd.DataFrame, host_comm: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """(start_ns, launch_ns) of every piece of work that can end a GPU idle gap, sorted by start:
    GPU events with their launch time (-1 when the trace holds no launch), and host-backend
    collectives (launched by no runtime call: -1)."""
    gpu = events[events["kind"].isin([schema.KIND_KERNEL, schema.KIND_MEMCPY, schema.KIND_MEMSET]).to_numpy()]
    starts = np.concatenate([gpu["start_ns"].to_numpy(dtype=np.int64), host_comm["start_ns"].to_numpy(dtype=np.int64)])
    launches = np.concatenate([launch_times(events, gpu), np.full(len(host_comm), -1, dtype=np.int64)])
    order = np.lexsort((-launches, starts))  # by start; of work starting together, the latest launch
    return starts[order], launches[order]


def carried_work(windows: list[tuple[int, int]], work: pd.DataFrame, launch_ns: np.ndarray, is_model: np.ndarray,
                 host_comm: Intervals | None = None) -> int:
    """:func:`gpu_split`'s ``carried_ns``: what came in beyond what went out (0 where it did not), summed
    over the step ``windows`` (the analysed
    steps' spans, in order; they need not be adjacent). ``work``: a rank's GPU events, ``launch_ns``
    when each was launched (-1: the trace holds none; its start stands for it, and one that starts
    before the first work its window launched was queued before the window), ``is_model``
    which are the model's (:func:`fsdpviz.analysis.overlap.is_model_work`), ``host_comm`` a host
    backend's collectives (no launch: they are the windows' own by their time).

    In: the time a window ran only model work launched before it (no work of its own, launched in
    it or later, beside it). Out: the time the model work launched in a window ran after it with no
    later-launched work beside it. Each is measured as the other, so in a steady run, where each step
    hands the next its tail, the two match; 0 without windows or launches, where work is a step's by
    its time."""
    if not windows or not len(work) or not (launch_ns >= 0).any():
        return 0
    start = work["start_ns"].to_numpy(np.int64)
    end = start + work["dur_ns"].to_numpy(np.int64)
    launched = np.where(launch_ns >= 0, launch_ns, start)
    known = launch_ns >= 0
    for i, (a, b) in enumerate(windows):
        # work without a launch record that runs before the first work the window launched was queued
        # before it: in the window before (its tail), or before tracing began (the loader's rule,
        # NO_STEP); later in the window, it is the window's own (a launch the profiler missed)
        ours = known & (launch_ns >= a) & (launch_ns < b)
        first = int(start[ours].min()) if ours.any() else b
        launched[~known & (start >= a) & (start < first)] = windows[i - 1][1] - 1 if i else a - 1
    comm_s, comm_e = host_comm if host_comm is not None else (np.zeros(0, np.int64), np.zeros(0, np.int64))

    def alone(mine: np.ndarray, others: np.ndarray, a: int, b: int) -> int:
        """The time in [a, b) the ``mine`` events ran with no ``others`` event and no host collective."""
        near = (end > a) & (start < b)
        ran = clip_intervals(union_intervals(start[mine & near], end[mine & near]), a, b)
        beside = union_intervals(np.concatenate([start[others & near], comm_s]),
                                 np.concatenate([end[others & near], comm_e]))
        return total_ns(subtract_intervals(ran, clip_intervals(beside, a, b)))

    came_in = went_out = 0
    for a, b in windows:
        came_in += alone(is_model & (launched < a), launched >= a, a, b)
        ran_on = (launched >= a) & (launched < b) & is_model
        if ran_on.any():
            went_out += alone(ran_on, launched >= b, b, int(end[ran_on].max()))
    return max(came_in - went_out, 0)


def split_idle(gaps: list[tuple[int, int]], starts: np.ndarray, launches: np.ndarray,
               fsdp_host: Intervals | None = None) -> tuple[int, int, int]:
    """(host wait, other idle, FSDP host wait) ns of idle ``gaps``: a gap is host wait when the first
    work starting at or after its end was launched after the gap began. Of a host-wait gap, the time
    from its start to that launch during which the host was inside one of FSDP's own ranges
    (``fsdp_host``, :mod:`fsdpviz.structure.fsdp_work`) is FSDP's: the GPU waited for FSDP's hooks."""
    host = other = fsdp = 0
    for a, b in gaps:
        i = int(np.searchsorted(starts, b, side="left"))
        if i < len(starts) and launches[i] >= a:
            theirs = total_ns(clip_intervals(fsdp_host, a, min(int(launches[i]), b))) if fsdp_host is not None else 0
            host += b - a - theirs
            fsdp += theirs
        else:
            other += b - a
    return host, other, fsdp


def gpu_split(windows: list[tuple[int, int]], comm: Intervals, compute: Intervals, busy: Intervals,
              starts: np.ndarray, launches: np.ndarray, model: Intervals | None = None,
              fsdp_host: Intervals | None = None, carried_ns: int = 0) -> dict[str, int]:
    """The BOUND_COLUMNS of a GPU rank over ``windows`` (every GPU event, clipped to each window).

    ``model``: the GPU work that is neither communication nor launched by FSDP's own ranges; the
    busy time outside exposed communication that no model work covers is FSDP's kernels
    (``fsdp_kernels_ns``; None: all of it is compute). ``fsdp_host``: FSDP's host ranges, whose
    share of host-wait gaps is ``fsdp_host_ns`` (:func:`split_idle`).

    ``carried_ns`` (:func:`carried_work`): the time the windows ran the model's work launched before
    them beyond what their own ran after them: earlier work the steps waited on (the steps before the
    analysed ones, queued ahead: a warm-up's optimizer, the work in flight when the profiler
    started), not compute of theirs. It is a part of its own, shown as other idle where it stays
    (:class:`fsdpviz.structure.deprofile.Parts`)."""
    out = dict.fromkeys(BOUND_COLUMNS, 0)
    known_launch = bool((launches >= 0).any())
    for lo, hi in windows:
        c, k, b = clip_intervals(comm, lo, hi), clip_intervals(compute, lo, hi), clip_intervals(busy, lo, hi)
        exposed = total_ns(c) - overlap_ns(c, k)
        host, other, fsdp = split_idle(complement(lo, hi, b), starts, launches, fsdp_host)
        busy_compute = total_ns(b) - exposed
        kernels = 0
        if model is not None:
            m = clip_intervals(model, lo, hi)
            # model work under exposed communication (a memcpy beside a collective) is in that part
            kernels = max(busy_compute - (total_ns(m) - overlap_ns(m, subtract_intervals(c, k))), 0)
        out["bound_window_ns"] += hi - lo
        out["bound_comm_ns"] += total_ns(c)
        out["bound_exposed_comm_ns"] += exposed
        out["bound_compute_ns"] += busy_compute - kernels
        out["fsdp_kernels_ns"] += kernels
        out["host_wait_ns"] += host
        out["fsdp_host_ns"] += fsdp
        out["other_idle_ns"] += other
    earlier = min(carried_ns, out["bound_compute_ns"])
    out["bound_compute_ns"] -= earlier
    out["carried_ns"] = earlier
    if not known_launch:  # a trace without runtime calls (CUDA activity alone): no gap can be told
        out["other_idle_ns"] += out["host_wait_ns"] + out["fsdp_host_ns"]
        out["host_wait_ns"] = UNKNOWN_NS
        out["fsdp_host_ns"] = 0
    return out


def cpu_split(windows: list[tuple[int, int]], comm: Intervals, compute: Intervals,
              fsdp: Intervals | None = None) -> dict[str, int]:
    """The BOUND_COLUMNS of a CPU rank over ``windows`` (host wait does not apply: -1). ``fsdp``:
    FSDP's own ranges; the training thread's ops inside them are ``fsdp_host_ns``, not compute."""
    out = dict.fromkeys(BOUND_COLUMNS, 0)
    for lo, hi in windows:
        c, k = clip_intervals(comm, lo, hi), clip_intervals(compute, lo, hi)
        exposed = total_ns(c) - overlap_ns(c, k)
        theirs = overlap_ns(k, clip_intervals(fsdp, lo, hi)) if fsdp is not None else 0
        out["bound_window_ns"] += hi - lo
        out["bound_comm_ns"] += total_ns(c)
        out["bound_exposed_comm_ns"] += exposed
        out["bound_compute_ns"] += total_ns(k) - theirs
        out["fsdp_host_ns"] += theirs
        out["other_idle_ns"] += max(hi - lo - total_ns(k) - exposed, 0)
    out["host_wait_ns"] = UNKNOWN_NS
    return out


def bound_kind(compute: float, exposed_comm: float, host_wait: float | None, other_idle: float,
               fsdp_overhead: float = 0.0, step: float | None = None) -> str:
    """The part that takes at least :data:`DOMINANT_SHARE` of the step, else ``mixed``. FSDP's per-unit
    work counts on the host side (``host``: host wait + ``fsdp_overhead``); compute that dominates
    while the host side is at least :data:`LAUNCH_BOUND_RATIO` of it is ``mixed`` (launch-bound).
    ``step``: the step the shares are of, where the parts need not add up to it (each a median over
    ranks); else their sum."""
    host_side = (host_wait or 0.0) + fsdp_overhead
    parts = {KIND_COMPUTE: compute, KIND_COMMUNICATION: exposed_comm, KIND_HOST: host_side, KIND_IDLE: other_idle}
    total = step if step else sum(parts.values())
    if total <= 0:
        return KIND_MIXED
    kind, biggest = max(parts.items(), key=lambda kv: kv[1])
    if kind == KIND_COMPUTE and host_side >= LAUNCH_BOUND_RATIO * compute:
        return KIND_MIXED
    return kind if biggest >= DOMINANT_SHARE * total else KIND_MIXED


def step_kind(compute: float, exposed_comm: float, host_wait: float | None, other_idle: float,
              fsdp_overhead: float = 0.0, step: float | None = None) -> str:
    """What bounds one step's time: :func:`bound_kind`, with other idle (which names no knob) as
    ``mixed``. The run's bound (:func:`summarize_bound`) and the advisor's predicted steps
    (fsdpviz/whatif/explore.py) both read it."""
    kind = bound_kind(compute, exposed_comm, host_wait, other_idle, fsdp_overhead, step)
    return KIND_MIXED if kind == KIND_IDLE else kind


def is_memory_bound(peak_bytes: int | None, limit_bytes: int | None) -> bool | None:
    """Whether a peak of allocated memory is within :data:`MEMORY_MARGIN` of ``limit_bytes`` (the
    device's memory, or a budget); None when either is unknown."""
    if peak_bytes is None or limit_bytes is None or limit_bytes <= 0:
        return None
    return peak_bytes >= (1.0 - MEMORY_MARGIN) * limit_bytes


# --- the run's bound (``summary --json`` ``bound``) ---------------------------------------------

class RankBound(msgspec.Struct, kw_only=True):
    """One rank's step split (ms per step; they add up to ``step_ms``): on the run's clock, the rank's
    clean unprofiled step where the run leads with the timers (``basis`` ``unprofiled``), else its
    analysed steps as traced."""

    step_ms: float
    compute_ms: float
    exposed_comm_ms: float
    host_wait_ms: float | None
    other_idle_ms: float
    kind: str
    fsdp_overhead_ms: float = 0.0
    """FSDP's per-unit work: its kernels (``fsdp_kernels_ms``) and the host wait its hooks caused."""
    fsdp_kernels_ms: float | None = None
    """The GPU time of the copies FSDP's hooks launched (None on a CPU rank)."""
    traced_step_ms: float | None = None
    """The rank's analysed steps as traced (mean), which ``step_ms`` was moved from."""
    comm_ms: float | None = None
    """All its communication in the same spans, moved as its exposed communication was (``comm_scale``;
    not a part of the step: ``exposed_comm_ms`` is the part of it no compute hid)."""
    device_scale: float = 1.0
    """How the rank's device figures (per-unit times) move to its clock
    (:func:`fsdpviz.structure.deprofile.device_scale`)."""
    comm_scale: float | None = None
    """How the rank's communication figures move to its clock (:func:`fsdpviz.structure.deprofile.comm_scale`:
    as its exposed communication moved); None: as ``device_scale``."""
    basis: str = BASIS_TRACED
    """``unprofiled`` where the rank's split was moved to its own clean step, ``traced`` where it timed none
    (or the run leads with the traced step)."""


class Loss(msgspec.Struct, kw_only=True):
    """The largest part of the step that is not compute: what to act on first."""

    kind: str
    """``communication`` (exposed), ``host`` (the GPU waited for launches, FSDP's per-unit work
    included) or ``idle`` (other idle)."""
    ms: float
    share: float
    """Of the step (0-1)."""


class StepSplit(msgspec.Struct, kw_only=True):
    """One step split into the five parts that add up to it (module docstring) and what bounds it: the
    recorded step's (:class:`BoundSummary`) and a what-if setting's predicted step
    (:class:`fsdpviz.whatif.explore.StepBound`) alike."""

    kind: str
    """``memory`` when the peak is within :data:`MEMORY_MARGIN` of the device's memory (or a what-if
    budget); else ``compute`` / ``communication`` / ``host``: the part that takes at least half the step;
    ``mixed`` when none does (or other idle does)."""
    step_ms: float
    compute_ms: float
    """The model's compute: the GPU busy with work FSDP's hooks did not launch (CPU: the training
    thread's ops outside FSDP's ranges)."""
    exposed_comm_ms: float
    host_wait_ms: float | None
    """None on a CPU rank (the host is the device) or a trace without launches (a note says why)."""
    other_idle_ms: float
    basis: str
    """``unprofiled`` (the timers' unprofiled step, the profiler's share taken out) or ``traced``."""
    fsdp_overhead_ms: float = 0.0
    """FSDP's per-unit work (a part of the step beside the four others): on a GPU the copies its hooks
    launched (``fsdp_kernels_ms``) and the host wait spent while the host ran its hooks; on a CPU the
    training thread's ops inside FSDP's ranges. Fewer, larger units shrink it."""
    time_kind: str | None = None
    """What bounds the step's time (``kind`` unless the step is memory-bound)."""

    @property
    def parts_ms(self) -> float:
        """What the five parts add up to: ``step_ms`` to their rounding, but on a traced split of three
        ranks or more, whose parts are each a median over ranks (the note says their sum)."""
        return self.compute_ms + self.exposed_comm_ms + (self.host_wait_ms or 0.0) + self.other_idle_ms \
            + self.fsdp_overhead_ms


class BoundSummary(StepSplit, kw_only=True):
    """What bounds the step (module docstring): the parts of one step, median over ranks of each
    rank's mean over its analysed steps; on ``basis`` ``unprofiled`` moved to the timers' unprofiled
    step (the profiler's share taken out of the idle parts)."""

    device: str
    """``gpu`` (the GPU's time) or ``cpu`` (the training thread's)."""
    loss: Loss | None
    """The largest non-compute part; None when the step is all compute."""
    traced_step_ms: float
    """The analysed steps as traced: the median over ranks of each rank's mean (``traced_step_time_ms``)."""
    profiler_share_ms: float | None
    """The traced step less the clean one (``profiler.share_ms``, ``clock.profiler_share_ms``: one figure),
    what the de-profiler took out on ``unprofiled``; on ``traced`` the split keeps it; None without the
    recorder's timers, or where the profiled steps ran faster than the clean ones (noise: not known)."""
    per_rank: dict[str, RankBound]
    note: str | None = None
    fsdp_kernels_ms: float | None = None
    """Of ``fsdp_overhead_ms``, the GPU time of FSDP's copy kernels (None on a CPU rank)."""
    peak_allocated_bytes: int | None = None
    device_memory_bytes: int | None = None
    """The smallest device memory the traces state (``deviceProperties``); None on CPU or unrecorded."""
    comm_ms: float | None = None
    """All communication per step in the split's spans (median over ranks), moved as the exposed
    communication was: not a part of the step (``exposed_comm_ms`` is what no compute hid of it)."""
    device_scale: float = 1.0
    """How the run's device figures move from the trace to its clock (CPU: the de-profiler's factor;
    GPU: 1 unless the de-profiler had to shrink device work, ``note`` says so)."""
    comm_scale: float | None = None
    """How the run's communication figures (each unit's collectives and exposed communication, each
    purpose's, ``comm_ms``, the findings') move from the trace to its clock: as its exposed communication
    moved (GPU: by the replay's drop of it, :mod:`fsdpviz.replay.split`); None (a summary kept before it
    was written): as ``device_scale``."""
    host_scale: float = 1.0
    """How the run's host-wait figures (each unit's ``host_wait_ms``) move from the trace to its clock
    (GPU: the share of the traced host wait the de-profiler kept; CPU: ``device_scale``, though no unit
    has a host wait there: the thread is the device). On a GPU it also moves the host wait inside each
    unit's forward and backward (``units[].forward_ms``: a pass runs from its first kernel to its last,
    and the gaps between are the run's idle parts)."""
    idle_scale: float = 1.0
    """How the other idle inside each GPU unit's forward and backward moves to the run's clock: the share
    of the traced other idle the de-profiler kept (1 where it took none;
    :func:`fsdpviz.structure.deprofile.idle_scale`); CPU: ``device_scale``, as ``host_scale``."""
    deprofiled_by: str | None = None
    """How the profiler's share came out on ``unprofiled`` (None on ``traced``): ``replay``, the waits on
    the host (and a host backend's exposed communication) less what the run's replay without the
    profiler took out of them, the kernels' own time and other idle as traced
    (:mod:`fsdpviz.replay.split`; what the replay leaves unaccounted goes by the rule, ``note`` says how
    much); ``rule``, by :func:`fsdpviz.structure.deprofile.deprofiled` alone, where the run has no such
    replay (a CPU run's replay scales each rank by the same factor the rule does), or until a view reads
    the run's model (``note`` says why on a GPU once one has: :mod:`fsdpviz.replay.split`)."""
    memory_bound: bool | None = None
    """The peak within :data:`MEMORY_MARGIN` of ``device_memory_bytes``; None when either is unknown
    (``note`` says why)."""
    carried_ms: float | None = None
    """GPU (None on CPU ranks, whose thread runs nothing queued, as ``fsdp_kernels_ms``, and on a run of CPU
    and GPU ranks): of ``other_idle_ms``, the time a step ran only model work launched before it, beyond
    what its own ran after it (:func:`carried_work`; median over ranks, per step). The steps waited on it, so other
    idle holds it; on ``unprofiled`` the de-profiler takes the profiler's share out of it first, since
    the clean steps do not carry it, and this is what is left (on the run's clock, as the other parts)."""


def traced_parts(r: Mapping[Any, Any]) -> tuple[float, Parts, float]:
    """(step, parts, all communication in the same spans) of one OVERLAP row, in ms per analysed step."""
    n = max(int(r["n_steps"]), 1)

    def per_step(key: str) -> float:
        return float(r[key]) / n / NS_PER_MS

    host = None if int(r["host_wait_ns"]) < 0 else per_step("host_wait_ns")
    return per_step("bound_window_ns"), Parts(per_step("bound_compute_ns"), per_step("bound_exposed_comm_ns"), host,
                                              per_step("other_idle_ns"), per_step("fsdp_kernels_ns"),
                                              per_step("fsdp_host_ns"), per_step("carried_ns")), per_step("bound_comm_ns")


def _moved(parts: Parts, step: float, device: str, drop: Parts | None) -> ReplayMove:
    """``parts`` moved to the clean ``step``: by the replay's ``drop`` where given, else by the rule
    (then ``left`` is ``parts`` itself: the device's scale is the rule's shrink of ``left`` alone)."""
    if drop is None:
        moved, note = deprofiled(parts, step, device)
        return ReplayMove(moved, parts, note, {})
    return replay_moved(parts, drop, step)


def _rank_bound(traced: float, parts: Parts, comm: float, device: str,
                step: float | None, drop: Parts | None = None) -> tuple[RankBound, str | None]:
    """One rank's split, moved to its clean ``step`` (None: kept as traced; by the replay's ``drop``
    where given), and its communication (``comm``, traced) moved as its exposed communication was."""
    note = None
    moved = base = parts
    if step is not None:
        moved, base, note, _ = _moved(parts, step, device, drop)
    moved = moved.settled()
    fsdp = moved.fsdp_kernels + moved.fsdp_host
    scale = device_scale(base, moved)
    cscale = comm_scale(parts, moved)
    return RankBound(
        step_ms=round(traced if step is None else step, 3), compute_ms=round(moved.compute, 3),
        exposed_comm_ms=round(moved.exposed_comm, 3),
        host_wait_ms=None if moved.host_wait is None else round(moved.host_wait, 3),
        other_idle_ms=round(moved.other_idle, 3),
        kind=bound_kind(moved.compute, moved.exposed_comm, moved.host_wait, moved.other_idle, fsdp),
        fsdp_overhead_ms=round(fsdp, 3),
        fsdp_kernels_ms=None if device == schema.OVERLAP_CPU else round(moved.fsdp_kernels, 3),
        traced_step_ms=round(traced, 3), device_scale=round(scale, 6), comm_scale=round(cscale, 6),
        comm_ms=round(comm * cscale, 3), basis=BASIS_TRACED if step is None else BASIS_UNPROFILED), note


def _median(values: list[float]) -> float:
    return float(np.median(values))


def traced_rank_steps(overlap: pd.DataFrame) -> dict[int, float]:
    """Per rank with a step span: its analysed steps' mean duration as traced (ms)."""
    out = {}
    for r in overlap.to_dict(orient="records"):
        step = traced_parts(r)[0]
        if step > 0:
            out[int(r["rank"])] = step
    return out


def traced_step_ms(overlap: pd.DataFrame) -> float | None:
    """The run's traced step: the median over ranks of each rank's mean analysed step as traced (ms);
    the one figure ``traced_step_time_ms``, the bound and the profiler's share read."""
    steps = traced_rank_steps(overlap)
    return round(_median(list(steps.values())), 3) if steps else None


def rank_drops(drops: Mapping[int, Parts], ranks: list[int], excess: Mapping[int, float]) -> dict[int, Parts]:
    """Per rank of ``ranks``, what the replay took out of the parts it moves (``drops``, ms a step;
    :data:`fsdpviz.structure.deprofile.REPLAY_MOVED`): its own where it was replayed; elsewhere (a run
    larger than the ranks its model reads) the replayed ranks' median share of their own excess (traced
    less clean step, ``excess``) that each part gave, of that rank's excess (none where it ran no slower
    traced)."""
    shares = [{name: (getattr(d, name) or 0.0) / excess[r] for name in REPLAY_MOVED} for r, d in drops.items()
              if excess.get(r, 0.0) > 0]
    out = {}
    for rank in ranks:
        if rank in drops:
            out[rank] = drops[rank]
        elif shares and rank in excess:
            ms = max(excess[rank], 0.0)
            out[rank] = Parts(0.0, 0.0, None, 0.0)._replace(
                **{name: _median([sh[name] for sh in shares]) * ms for name in REPLAY_MOVED})
    return out


def summarize_bound(overlap: pd.DataFrame, profiler: ProfilerCost | None,
                    clean: dict[int, tuple[float, int]] | None = None,
                    drops: Mapping[int, Parts] | None = None, rule_why: str | None = None) -> BoundSummary | None:
    """The run's bound from the OVERLAP rows, what the profiler cost and each rank's clean unprofiled
    step (``clean``: rank -> (ms, count), :func:`fsdpviz.structure.profiler_cost.clean_step_ms`); None
    without a step span. Where the run leads with the timers (``profiler.headline``), each rank's split
    is moved to its own clean step and the run's to the headline step: on a GPU by the replay's split
    where ``drops`` gives it (rank -> what the replay without the profiler took out of each part, ms a
    step: :func:`fsdpviz.replay.split.replay_drops`), else by the rule (:mod:`fsdpviz.structure.deprofile`;
    ``rule_why``: why a GPU run has no replay's split, said in the note); the profiler's share is the
    traced step less the headline's."""
    rows = [r for r in overlap.to_dict(orient="records") if int(r["bound_window_ns"]) > 0]
    if not rows:
        return None
    devices = set(overlap["device"].astype(str))
    device = devices.pop() if len(devices) == 1 else "mixed"
    lead = profiler is not None and profiler.headline
    clean = clean or {}
    per_rank: dict[str, RankBound] = {}
    rank_parts: list[Parts] = []
    traced_comms: list[float] = []
    notes: list[str] = []
    by_replay = lead and bool(drops) and device == schema.OVERLAP_GPU
    replayed: set[int] = set()
    if by_replay:
        assert drops is not None
        replayed = set(drops)
        excess = {int(r["rank"]): traced_parts(r)[0] - clean[int(r["rank"])][0] for r in rows if int(r["rank"]) in clean}
        drops = rank_drops(drops, [int(r["rank"]) for r in rows], excess)
    for r in rows:
        traced, parts, comm = traced_parts(r)
        rank = int(r["rank"])
        clean_ms = clean[rank][0] if lead and rank in clean else None
        drop = drops.get(rank) if by_replay and drops is not None else None
        bound, note = _rank_bound(traced, parts, comm, str(r["device"]), clean_ms, drop)
        traced_comms.append(comm)
        per_rank[str(rank)] = bound
        rank_parts.append(parts)
        if note is not None:
            notes.append(f"rank {rank}: {note}")
    traced = traced_step_ms(overlap) or 0.0
    median_traced = Parts(*(_median([p[i] or 0.0 for p in rank_parts]) for i in range(len(Parts._fields))))
    if any(p.host_wait is None for p in rank_parts):
        median_traced = median_traced._replace(host_wait=None)
    if device == schema.OVERLAP_CPU:
        notes.append("host_wait_ms, fsdp_kernels_ms and carried_ms are null: on a CPU rank the training thread "
                     "is the device, so nothing waits for it and nothing of FSDP's or of earlier steps runs beside "
                     "it; other_idle_ms is the thread's time outside traced ops and collectives")
    elif median_traced.host_wait is None:
        notes.append("host_wait_ms is null: the traces hold no kernel launches (CUDA activity alone), so an "
                     "idle gap cannot be told to be the host's; other_idle_ms holds all idle time")
    basis, step, parts = BASIS_TRACED, traced, median_traced
    share = profiler.share_ms if profiler is not None else None
    missing = [r for r in per_rank if int(r) not in clean]
    by, base = None, median_traced
    if lead and profiler is not None:  # one clock: the split is of the run's step time
        basis, step = BASIS_UNPROFILED, profiler.unprofiled_step_ms
        median_drop = None
        if by_replay and drops:
            median_drop = Parts(*(_median([d[i] or 0.0 for d in drops.values()]) for i in range(len(Parts._fields))))
        parts, base, note, beyond = _moved(median_traced, step, device, median_drop)
        by = BY_RULE
        if median_drop is not None:
            took = sum((getattr(median_traced, name) or 0.0) - (getattr(base, name) or 0.0) for name in REPLAY_MOVED)
            notes.append(_replay_words(took, beyond, base.total - step, median_drop.exposed_comm > 0,
                                       median_traced.carried - base.carried))
            # named for what decided most of the share: the replay's drop of the waits, or the rule's remainder
            by = BY_REPLAY if took >= base.total - step else BY_RULE
            if by == BY_RULE:
                notes.append(f"deprofiled_by is rule: the rule's remainder ({base.total - step:.3f} ms a step) is more "
                             f"than the replay's drop ({took:.3f} ms)")
            guessed = sorted(set(per_rank) - {str(r) for r in replayed} - set(missing), key=int)
            if guessed:
                notes.append(f"rank(s) {', '.join(guessed)} were not read by the model: their parts lost the replayed "
                             "ranks' median share of each one's own excess")
        elif device == schema.OVERLAP_GPU and rule_why:
            notes.append(f"the profiler's share came out by the rule (out of the device's waits on the host in "
                         f"proportion, then other idle), not by the replay: {rule_why}")
        if note is not None and not any(note in n for n in notes):
            notes.append(note)
        if missing:
            notes.append(f"rank(s) {', '.join(missing)} timed no clean step: their split is as traced")
    elif profiler is not None:
        notes.append("the split is the traced step's, as the step time is: " + (profiler.note or "").removeprefix(
            "the step time is the traced one: "))
    else:
        notes.append("the split is the traced step's: without the recorder's timers the profiler's share of "
                     "the idle time is unknown and included")
    shown = parts.settled()
    waited = (median_traced.host_wait or 0.0) + median_traced.fsdp_host
    if basis == BASIS_UNPROFILED and waited > 0 and (parts.host_wait or 0.0) + parts.fsdp_host == 0:
        # a 0 the rule leaves, not a wait measured: said, as the terminal's "(... taken as the profiler's)"
        notes.append(f"host_wait_ms is 0, and so is every unit's host wait: the profiler's share "
                     f"({median_traced.total - step:.3f} ms a step) is more than the traced steps' host wait "
                     f"({waited:.3f} ms, FSDP's hooks' share included), which the de-profiler takes as the "
                     "profiler's first (it slows the host, not the kernels); how long the clean steps wait for "
                     "the host is not measured")
    if parts.carried >= 0.001:
        notes.append(f"other_idle_ms holds {parts.carried:.3f} ms a step the GPU ran work queued before the "
                     "analysed steps (the steps waited on it; carried_ms)")
    compute, comm, host, idle = shown.compute, shown.exposed_comm, shown.host_wait, shown.other_idle
    fsdp = shown.fsdp_kernels + shown.fsdp_host
    losses = {KIND_COMMUNICATION: comm, KIND_HOST: (host or 0.0) + fsdp, KIND_IDLE: idle}
    loss_kind, loss_ms = max(losses.items(), key=lambda kv: kv[1])
    total = shown.total
    if basis == BASIS_TRACED and abs(total - step) >= 0.001 and step > 0:
        # each part is its own median over ranks, the step the median of the ranks' steps: with three
        # ranks or more they need not add up (on the timers' clock the de-profiler moves them to the step)
        notes.append(f"each part is the median over ranks of that rank's part: together they come to {total:.3f} ms "
                     f"of the {step:.3f} ms step (the median of the ranks' steps); shares are of the step")
    # a share of the step the split is of, as the actions and the headline say it
    loss = Loss(kind=loss_kind, ms=round(loss_ms, 3), share=round(loss_ms / step, 4)) if loss_ms > 0 and step > 0 else None
    kind = step_kind(compute, comm, host, idle, fsdp, step)  # shares of the step, as said
    scale = device_scale(base, parts)
    cscale = comm_scale(median_traced, parts)
    return BoundSummary(
        kind=kind, time_kind=kind, step_ms=round(step, 3), compute_ms=round(compute, 3),
        exposed_comm_ms=round(comm, 3), host_wait_ms=None if host is None else round(host, 3),
        other_idle_ms=round(idle, 3), basis=basis, device=device, loss=loss, traced_step_ms=round(traced, 3),
        profiler_share_ms=None if share is None else round(share, 3), per_rank=per_rank, note="; ".join(notes) or None,
        fsdp_overhead_ms=round(fsdp, 3),
        fsdp_kernels_ms=None if device == schema.OVERLAP_CPU else round(parts.fsdp_kernels, 3),
        device_scale=round(scale, 6), host_scale=round(host_scale(median_traced, parts), 6),
        idle_scale=round(scale if device == schema.OVERLAP_CPU else idle_scale(median_traced, parts), 6),
        comm_scale=round(cscale, 6), comm_ms=round(_median(traced_comms) * cscale, 3),
        carried_ms=round(parts.carried, 3) if device == schema.OVERLAP_GPU else None, deprofiled_by=by)


_PART_WORDS: Final = {"host_wait": "the host wait", "fsdp_host": "FSDP's hooks' wait",
                      "exposed_comm": "exposed communication"}


def _replay_words(took: float, beyond: Mapping[str, float], remainder: float, comm: bool,
                  carried: float) -> str:
    """The bound's note on the replay's split: the work carried in from before the analysed steps it took
    out first (``carried``, ms a step), how much it took out of the parts it moves (``took``; ``comm``: the
    exposed communication among them, a host backend's), where it asked a part for more than the trace
    holds (the part stops at 0: said, with how much), and what it left to the rule (``remainder``). The
    three figures add up to the profiler's share (``profiler_share_ms``, one rank's; the run's medians
    with more)."""
    moved, kept = (("the host wait, FSDP's hooks' wait and exposed communication", "") if comm else
                   ("the host wait and FSDP's hooks' wait", ", exposed communication"))
    words = ""
    if carried >= 0.001:
        words = (f"the work the GPU ran from before the analysed steps came out first ({carried:.3f} ms a step: "
                 "the traced steps' alone); ")
    words += (f"the profiler's share came out of the step as the replay without it takes it out ({took:.3f} ms a "
             f"step, median over ranks, out of {moved}; the kernels' own time, the model's compute and FSDP's "
             f"copies{kept} and other idle are the trace's)")
    over = {name: ms for name, ms in beyond.items() if ms >= 0.001}
    if over:
        words += ("; it took more out of " + ", ".join(f"{_PART_WORDS[name]} (by {ms:.3f} ms)" for name, ms in over.items())
                  + " than the trace holds (its replay of the traced steps holds more there than they did): the "
                  "part ends at 0 and the rest goes with the remainder")
    if remainder >= REMAINDER_NOTE_MS:
        words += (f"; the replay's drop falls {remainder:.3f} ms a step short of the timers' (taken out by the rule: "
                  "the waits on the host in proportion, then other idle)")
    elif remainder <= -REMAINDER_NOTE_MS:
        words += f"; the clean step is {-remainder:.3f} ms longer than the traced one: other idle the trace did not see"
    return words


def comm_clock_scale(bound: BoundSummary | RankBound | None) -> float:
    """The factor that moves the trace's communication figures (a unit's collectives and exposed
    communication, a purpose's, the findings', compare's) to the run's clock: the bound's ``comm_scale``
    (``device_scale`` where it has none); 1.0 without a bound (the trace's clock)."""
    if bound is None:
        return 1.0
    return bound.comm_scale if bound.comm_scale is not None else bound.device_scale


def clock_scale(bound: BoundSummary | None) -> float:
    """The factor that moves the trace's device durations (a pass's kernels, the findings' compute and
    lateness, compare's step parts) to the run's clock: the bound's ``device_scale``; 1.0 without a bound
    (the trace's clock). Communication moves by :func:`comm_clock_scale`."""
    return bound.device_scale if bound is not None else 1.0


def device_memory_bytes(ranks: pd.DataFrame) -> int | None:
    """The smallest device memory any rank's trace states (TRACES ``ranks``), or None (CPU, or not recorded)."""
    if "device_memory_bytes" not in ranks.columns:
        return None
    known = [int(v) for v in ranks["device_memory_bytes"] if int(v) > 0]
    return min(known) if known else None


def with_memory(bound: BoundSummary | None, peak_bytes: int | None,
                device_memory_bytes: int | None) -> BoundSummary | None:
    """``bound`` with the run's memory against the device's: ``kind`` becomes ``memory`` when the peak
    is within :data:`MEMORY_MARGIN` of it (``time_kind`` keeps what bounds the time)."""
    if bound is None:
        return None
    memory_bound = is_memory_bound(peak_bytes, device_memory_bytes)
    notes = [bound.note] if bound.note else []
    said = "memory_bound is null: " + (
        "the traces do not state the device's memory (a CPU run, or no deviceProperties), so a peak cannot "
        "be held against it" if device_memory_bytes is None else "the traces hold no memory samples")
    if memory_bound is None and said not in (bound.note or ""):  # once: a bound adopted from the cache has it
        notes.append(said)
    return msgspec.structs.replace(
        bound, kind=KIND_MEMORY if memory_bound else bound.kind, time_kind=bound.time_kind or bound.kind,
        peak_allocated_bytes=peak_bytes, device_memory_bytes=device_memory_bytes, memory_bound=memory_bound,
        note="; ".join(notes) or None)


# --- per unit -----------------------------------------------------------------------------------

def host_wait_gaps(windows: list[tuple[int, int]], busy: Intervals, starts: np.ndarray,
                   launches: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(launch_ns, gap_ns) of each host-wait gap in ``windows``: the launch the GPU waited for."""
    at, size = [], []
    for lo, hi in windows:
        for a, b in complement(lo, hi, clip_intervals(busy, lo, hi)):
            i = int(np.searchsorted(starts, b, side="left"))
            if i < len(starts) and launches[i] >= a:
                at.append(int(launches[i]))
                size.append(b - a)
    return np.asarray(at, dtype=np.int64), np.asarray(size, dtype=np.int64)


def _pass_rows(unit_steps: pd.DataFrame) -> dict[tuple[int, str, str], int]:
    """(step, unit, phase) -> its row in one rank's ``unit_steps``."""
    return {k: i for i, k in enumerate(zip(unit_steps["step"].astype(int), unit_steps["unit"].astype(str),
                                           unit_steps["phase"].astype(str)))}


def unit_host_wait(unit_steps: pd.DataFrame, windows: pd.DataFrame, launch_ns: np.ndarray,
                   gap_ns: np.ndarray) -> np.ndarray:
    """Per row of one rank's ``unit_steps``: the host-wait gaps whose awaited launch the host made
    inside that unit pass's window, each gap counted once, for the innermost window holding its launch
    (a unit nested in another is its own)."""
    out = np.zeros(len(unit_steps), dtype=np.int64)
    if not len(launch_ns) or windows.empty:
        return out
    w_start = windows["start_ns"].to_numpy(np.int64)
    w_end = windows["end_ns"].to_numpy(np.int64)
    keys = list(zip(windows["step"].astype(int), windows["unit"].astype(str), windows["phase"].astype(str)))
    row_of = _pass_rows(unit_steps)
    span = w_end - w_start
    for t, g in zip(launch_ns.tolist(), gap_ns.tolist()):
        inside = np.flatnonzero((w_start <= t) & (t < w_end))
        if not len(inside):
            continue
        row = row_of.get(keys[int(inside[np.argmin(span[inside])])])
        if row is not None:
            out[row] += g
    return out


def unit_pass_gaps(unit_steps: pd.DataFrame, spans: pd.DataFrame, busy: Intervals, starts: np.ndarray,
                   launches: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per row of one GPU rank's ``unit_steps``: the GPU idle inside that unit pass's compute spans
    (``spans`` of kind compute; first kernel to last), as (host wait, other idle) ns by
    :func:`split_idle`'s test, FSDP's hooks' share in the host wait. A pass's forward / backward time
    holds them, so the de-profiler moves them as it moves the step's own (``host_scale``,
    ``idle_scale``)."""
    host = np.zeros(len(unit_steps), dtype=np.int64)
    idle = np.zeros(len(unit_steps), dtype=np.int64)
    if spans.empty or not len(unit_steps):
        return host, idle
    row_of = _pass_rows(unit_steps)
    b_start, b_end = busy
    for step, unit, phase, lo, hi in zip(spans["step"].astype(int), spans["unit"].astype(str),
                                         spans["phase"].astype(str), spans["start_ns"].to_numpy(np.int64).tolist(),
                                         spans["end_ns"].to_numpy(np.int64).tolist()):
        row = row_of.get((step, unit, phase))
        if row is None or hi <= lo:
            continue
        # the busy intervals that reach into [lo, hi) (normalised: sorted, apart), cut to it
        a, z = int(np.searchsorted(b_end, lo, side="right")), int(np.searchsorted(b_start, hi, side="left"))
        inside = (np.clip(b_start[a:z], lo, hi), np.clip(b_end[a:z], lo, hi))
        h, o, _ = split_idle(complement(lo, hi, inside), starts, launches)
        host[row] += h
        idle[row] += o
    return host, idle
