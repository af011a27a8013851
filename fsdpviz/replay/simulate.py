"""Run a step's instructions on a model of the host thread and FSDP's streams.

The host executes the instructions in order, spending their busy time. What it launches runs on
in-order lanes, each item starting when its lane is free and what it waits for is done:

- GPU (NCCL): the compute stream runs compute and copy-outs; an all-gather's copy-in waits for the
  copy-out issued before it (FSDP2 keeps at most one all-gather ahead of the unit in use), the
  all-gather stream runs the collectives (a host backend on CUDA tensors, gloo, runs all of the
  rank's collectives on one queue, in the order issued: ``Program.serial_collectives``); a
  reduce-scatter starts after its unit's backward compute
  and, before the next unit's reduction, the compute stream waits for the previous one (FSDP2's
  ``post_backward_rs_wait``); the optimizer's kernels wait for every reduction. A gather's work starts
  where the host launched it inside the gather's label, while the host is still in it (a share of the
  label's host time, read per gather: FSDP2's cast of the parameters and its copy-in on the copy-in's
  stream, a fake group's copies on the gather's), and its collective as the label ends; a host
  backend's label holds the host while its collective runs, so there all of it starts with the label.
  Work starts no earlier than the recording's launch latency after its launch
  (``Program.launch_latency_ns``), and a unit's compute runs in groups of its kernels, each from its
  own launch (``ComputeOp.launches``): a device ahead of the host waits inside the pass.
  FSDP's other kernels run where FSDP runs them: a gather's (a fake group's copies) on its stream before the collective, a
  unit's unshard kernels before its compute, and its gradients' after it, on the compute stream or on
  FSDP's other streams (a lane for the unshards', one for the rest); a unit's compute waits for its
  unshard's and for the unit before's gradients' kernels there, as FSDP1's trace on one rank shows. The host never
  waits except where the recording synchronised (the end of the step).
- CPU (gloo): compute is the host itself, and the host waits for every collective it issues (FSDP2's
  all-gathers and reduce-scatters are synchronous without CUDA streams; ZeRO-3's prefetched
  all-gathers are asynchronous, but on 2 shared cores the host gains nothing while gloo works, and
  modelling them as waited for reproduces recordings best); collectives of one rank run one after
  another on its gloo threads.

The simulated step is split as the bound splits a traced one (analysis/bound.py): the model's compute,
FSDP's copies, exposed communication and, on a GPU, the device's idle time into host wait, the host's
time in FSDP's own work, and other idle (:func:`_idle_split`).

The step's time is the host's, from the start of the step to the end of its last instruction. On a GPU
that is the steady state's: the step runs twice and the second is timed, because the device work a
step leaves running when the host is done (a launch-bound host runs ahead of nothing, a device-bound
one far ahead) is what the next step's first synchronisation waits for. (Memory is predicted apart,
from the recording's memory by category: :mod:`fsdpviz.replay.memory`.)
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

from fsdpviz.replay.program import (
    BusyOp,
    ComputeOp,
    CopyOutOp,
    FsdpKernelsOp,
    GatherOp,
    Program,
    ReduceOp,
    SegmentOp,
)
from fsdpviz.vocabulary import (
    ALL_GATHER,
    ALL_REDUCE,
    BACKWARD,
    COMPUTE,
    COPY_IN,
    FORWARD,
    REDUCE_SCATTER,
    UNIT_COLLECTIVES,
)

HOST: Final = "host"
COMM: Final = "comm"  # CPU: the gloo threads
FSDP_KERNELS: Final = "fsdp_kernels"  # GPU: FSDP's own kernels beyond the gathers' copies (a span kind)
FSDP_SIDE: Final = "fsdp_side"  # GPU: FSDP's streams other than the compute stream, after a compute (a lane)
FSDP_UNSHARD: Final = "fsdp_unshard"  # GPU: the same, before a compute: the unshard's (a lane of its own)
FSDP_WORK: Final = ("copy_in", "copy_out", FSDP_KERNELS)  # the span kinds of FSDP's own GPU work


@dataclass(slots=True)
class SimSpan:
    """One interval of the simulated step (ns from its start)."""

    unit: str
    phase: str
    kind: str  # all_gather / copy_in / copy_out / compute / reduce_scatter / all_reduce / optimizer / fsdp_kernels
    lane: str
    start: float
    end: float
    launched: float = -1.0
    """When the host issued it (ns from the step's start), where that matters (GPU); -1 for the CPU thread's own work."""


@dataclass(slots=True)
class SimResult:
    """A simulated step."""

    step_ns: float
    spans: list[SimSpan]
    comm_ns: float  # union of the collectives
    exposed_comm_ns: float  # part of it while nothing computed (neither the model nor FSDP's copies)
    compute_ns: float
    """The model's own work (its passes and the optimizer), as the bound's compute: FSDP's copies are not in it."""
    fsdp_copy_ns: float = 0.0
    """FSDP's copy-in, copy-out and other kernels outside the model's work and the collectives: GPU, the
    bound's FSDP kernels (``fsdp_kernels_ms``); CPU, the thread's copy-outs, part of FSDP's host work."""
    fsdp_kernel_ns: float = 0.0
    """GPU: FSDP's copies and other kernels, all of them, each whole, whatever ran beside them."""
    host_wait_ns: float | None = None
    """GPU: the device's idle time that ended with work the host had not yet launched when it began, less
    ``fsdp_host_ns`` (analysis/bound.py's ``split_idle`` on the simulated streams); None on a CPU."""
    fsdp_host_ns: float = 0.0
    """GPU: of those idle gaps, the time the host spent in FSDP's own work before the awaited launch: a
    gather's label, a copy-out's launch, a pass's hooks before and after its compute (the recording's
    FSDP ranges; the module's own code around them is the host's, ``BusyOp.what`` ``own``). CPU: all of
    the thread's time in that work (the hooks, each gather's issue, each copy-out, a reduction's host
    work), the bound's FSDP per-unit work; ``fsdp_copy_ns`` (the copy-outs) is part of it there, not
    beside it."""
    other_idle_ns: float = 0.0
    """GPU: the device's other idle time: gaps ended by work launched before they began. The simulated
    device waits only for the host's launches (each one's work starts no earlier than the launch latency
    after it) and for work on its own streams, so little of it is other idle: work launched just before
    a gap that waits out its latency (the bound finds 1.3-4.2 ms a step on the shared GPU recordings,
    where the device also waits on events: docs/whatif.md)."""
    notes: list[str] = field(default_factory=list)

    def unit_totals(self) -> dict[str, dict[str, float]]:
        """Per unit: all-gather, forward, backward, reduce-scatter and exposed communication (ns)."""
        out: dict[str, dict[str, float]] = {}
        on_compute = _coverage(_union([(s.start, s.end) for s in self.spans
                                       if _on_compute(s) and s.kind != "optimizer"]))
        for s in self.spans:
            if not s.unit:
                continue
            row = out.setdefault(s.unit, {ALL_GATHER: 0.0, FORWARD: 0.0, BACKWARD: 0.0, REDUCE_SCATTER: 0.0,
                                          "exposed_comm": 0.0})
            if s.kind == "compute":
                row[s.phase] = row.get(s.phase, 0.0) + s.end - s.start
            elif s.kind in UNIT_COLLECTIVES:
                key = REDUCE_SCATTER if s.kind != ALL_GATHER else ALL_GATHER
                row[key] += s.end - s.start
                row["exposed_comm"] += (s.end - s.start) - on_compute(s.start, s.end)
        return out


def run(program: Program, gpu: bool) -> SimResult:
    """Simulate ``program`` (see the module docstring)."""
    sim = _Sim(program, gpu)
    for op in program.ops:
        sim.step(op)
    if not gpu:
        out = sim.result()
        out.fsdp_host_ns = sum(e - s for s, e in _union(sim.fsdp_host))
        return out
    # the steady state: the same step again after this one, whose device work may still be running
    # when the host reaches the next step's first synchronisation
    before = sim.host
    sim.spans, sim.reduce_ends, sim.fsdp_host = [], [], []
    for op in program.ops:
        sim.step(op)
    out = sim.result()
    for span in out.spans:
        span.start -= before
        span.end -= before
        span.launched -= before
    out.step_ns -= before
    out.host_wait_ns, out.fsdp_host_ns, out.other_idle_ns = _idle_split(
        out.spans, [(a - before, b - before) for a, b in sim.fsdp_host], out.step_ns)
    return out


class _Sim:
    def __init__(self, program: Program, gpu: bool) -> None:
        self.p = program
        self.gpu = gpu
        self.host = 0.0
        self.free: dict[str, float] = {COMPUTE: 0.0, COPY_IN: 0.0, ALL_GATHER: 0.0, REDUCE_SCATTER: 0.0,
                                       ALL_REDUCE: 0.0, COMM: 0.0, FSDP_SIDE: 0.0, FSDP_UNSHARD: 0.0}
        self.lat = program.launch_latency_ns if gpu else 0.0  # GPU: a launch to its work's earliest start
        self.unsharded_at = 0.0  # GPU: when FSDP's kernels on its other streams that the next compute waits for end
        # GPU: each kind of collective on a stream of its own, or all on one queue (a host backend)
        self.lanes = {kind: COMM if program.serial_collectives else kind
                      for kind in (ALL_GATHER, REDUCE_SCATTER, ALL_REDUCE)}
        self.gather_end: dict[int, float] = {}
        self.last_copy_out = 0.0
        self.pending_reduce: list[tuple[float, int]] = []  # (end, buffer bytes) not yet waited for
        self.reduce_ends: list[float] = []
        self.spans: list[SimSpan] = []
        self.fsdp_host: list[tuple[float, float]] = []  # the host's intervals in FSDP's own work
        self.pre_hook = (0.0, 0.0)  # the last pass's pre hook on the host: (start, length)
        self.phase = ""

    # --- instructions ---------------------------------------------------------------------
    def step(self, op: object) -> None:
        if isinstance(op, BusyOp):
            if op.what == "pre":
                self.pre_hook = (self.host, op.ns)
            if op.what in ("pre", "post") and op.ns > 0:
                self.fsdp_host.append((self.host, self.host + op.ns))
            self.host += op.ns
        elif isinstance(op, GatherOp):
            self._gather(op.gid)
        elif isinstance(op, CopyOutOp):
            self._copy_out(op.gid)
        elif isinstance(op, ComputeOp):
            self._compute(op)
        elif isinstance(op, FsdpKernelsOp):
            self._fsdp_kernels(op)
        elif isinstance(op, ReduceOp):
            self._reduce(op.rid)
        elif isinstance(op, SegmentOp):
            self._segment(op)

    def _gather(self, gid: int) -> None:
        g = self.p.gathers[gid]
        issued = self.host
        self.host += g.host_ns
        self.fsdp_host.append((issued, self.host))
        if self.gpu:
            # a host backend's gather holds the host while its collective runs (gloo on CUDA: FSDP's
            # all-gather label ends with the gloo op, which starts within a millisecond of the label):
            # the copy-in and the collective start with the host's work on it, not after it
            # elsewhere the device runs the label's copies where the host launched them, while it is still
            # in the label: a cast on the copy-in's stream, the copy-in, a fake group's copies; the
            # collective is launched as the label ends
            serial = self.p.serial_collectives

            def launched(share: float) -> float:
                return issued if serial else issued + share * g.host_ns

            lat = self.lat

            if g.lead_ns:
                k0 = max(launched(g.lead_at) + lat, self.free[COPY_IN], self.last_copy_out)
                self.free[COPY_IN] = k0 + g.lead_ns
                self.spans.append(SimSpan(g.unit, g.phase, FSDP_KERNELS, COPY_IN, k0, k0 + g.lead_ns,
                                          launched(g.lead_at)))
            ci_start = max(launched(g.copy_in_at) + lat if g.copy_in_ns else issued, self.free[COPY_IN],
                           self.last_copy_out)
            ci_end = ci_start + g.copy_in_ns
            self.free[COPY_IN] = ci_end
            lane = self.lanes[ALL_GATHER]
            start = max(ci_end, self.free[lane], self.free[COMPUTE] if g.after_compute else 0.0)
            if g.kernels_ns > g.lead_ns:
                # each group of them from its own launch (without groups: all from the first)
                for at, ns in g.kernel_launches or [(g.kernels_at, g.kernels_ns - g.lead_ns)]:
                    start = self._queue(g.unit, g.phase, lane, max(start, launched(at) + lat), ns, launched(at))
            launch = issued if serial else self.host
            start = max(start, launch if serial else launch + lat)  # a host backend's collective runs on the host
            end = start + g.comm_ns
            self.free[lane] = end
            if g.copy_in_ns:
                self.spans.append(SimSpan(g.unit, g.phase, "copy_in", COPY_IN, ci_start, ci_end,
                                          launched(g.copy_in_at)))
            self.spans.append(SimSpan(g.unit, g.phase, ALL_GATHER, lane, start, end, launch))
        else:
            start = max(self.host, self.free[COMM])
            end = start + g.comm_ns
            self.free[COMM] = end
            self.spans.append(SimSpan(g.unit, g.phase, ALL_GATHER, COMM, start, end))
            self.host = end  # on CPU the issuing thread waits for its all-gather
        self.gather_end[gid] = end

    def _copy_out(self, gid: int) -> None:
        g = self.p.gathers[gid]
        done = self.gather_end[gid]
        launch = -1.0
        if self.gpu:
            self.fsdp_host.append((self.host, self.host + g.copy_out_host_ns))
            self.host += g.copy_out_host_ns
            launch = self.host
            start = max(self.host + self.lat, self.free[COMPUTE], done)
            end = start + g.copy_out_ns
            self.free[COMPUTE] = end
            self.last_copy_out = end
        else:
            start = max(self.host, done)
            end = start + g.copy_out_host_ns
            self.host = end
            self.fsdp_host.append((start, end))
        self.spans.append(SimSpan(g.unit, g.phase, "copy_out", COMPUTE if self.gpu else HOST, start, end,
                                  launch))

    def _fsdp_kernels(self, op: FsdpKernelsOp) -> None:
        if not self.gpu:
            return
        if op.main_ns > 0:
            # the unshard's kernels, each launched where the pass's pre hook launched it (FSDP2 on one rank
            # casts the parameters one by one: the device runs each while the host is still in the hook)
            hook, hook_ns = self.pre_hook
            for at, ns in op.launches if op.before and op.launches else [(None, op.main_ns)]:
                launched = self.host if at is None else hook + min(at, hook_ns)
                self.free[COMPUTE] = self._queue(op.unit, op.phase, COMPUTE,
                                                 max(launched + self.lat, self.free[COMPUTE]), ns, launched)
        if op.side_ns > 0:
            # an unshard's kernels on a lane of their own, not queued behind the unit before's gradients'
            # copies; the next compute waits for both (FSDP1 on one rank: each backward unit's first
            # kernel waits about 160 us for the unit before's gradient copy on the post-backward stream)
            lane = FSDP_UNSHARD if op.before else FSDP_SIDE
            start = max(self.host + self.lat, self.free[lane], 0.0 if op.before else self.free[COMPUTE])
            end = self.free[lane] = start + op.side_ns
            self.spans.append(SimSpan(op.unit, op.phase, FSDP_KERNELS, lane, start, end, self.host))
            self.unsharded_at = max(self.unsharded_at, end)
            if not op.before:
                self.reduce_ends.append(end)

    def _queue(self, unit: str, phase: str, lane: str, start: float, ns: float, launched: float) -> float:
        """FSDP's kernels of ``unit`` starting at ``start`` on ``lane``: the span before them grows where they
        follow it with no wait (fewer spans, the same timeline), else a span of their own. Returns their end."""
        last = self.spans[-1] if self.spans else None
        if last is not None and last.kind == FSDP_KERNELS and last.lane == lane and last.unit == unit \
                and last.phase == phase and last.end == start:
            last.end = start + ns
        else:
            self.spans.append(SimSpan(unit, phase, FSDP_KERNELS, lane, start, start + ns, launched))
        return start + ns

    def _compute(self, op: ComputeOp) -> None:
        if not self.gpu:
            start, self.host = self.host, self.host + op.ns
            if op.ns > 0:
                self.spans.append(SimSpan(op.unit, op.phase, "compute", HOST, start, self.host))
            return
        # each group of the pass's kernels (without groups: all of them at once) runs once the host has
        # launched it: a device ahead of the launches waits inside the pass, and the pass's span splits there
        start = end = max(self.host + self.lat, self.free[COMPUTE], self.unsharded_at)
        launched = self.host
        for at, ns in op.launches or [(0.0, op.ns)]:
            ready = max(end, self.host + at + self.lat)
            if ready > end:
                if end > start:
                    self.spans.append(SimSpan(op.unit, op.phase, "compute", COMPUTE, start, end, launched))
                start, launched = ready, self.host + at
            end = ready + ns
        self.free[COMPUTE] = end
        if op.launches or op.ns > 0:
            self.spans.append(SimSpan(op.unit, op.phase, "compute", COMPUTE, start, end, launched))

    def _reduce(self, rid: int) -> None:
        r = self.p.reduces[rid]
        if self.gpu:
            prev = max((e for e, _ in self.pending_reduce), default=0.0)
            prep = max(self.free[COMPUTE], prev, self.host + self.lat)
            self.free[COMPUTE] = prep + r.prep_ns
            if r.prep_ns > 0:
                self.spans.append(SimSpan(r.unit, BACKWARD, FSDP_KERNELS, COMPUTE, prep, prep + r.prep_ns, self.host))
            lane = self.lanes[REDUCE_SCATTER]
            start = max(self.host + self.lat, self.free[lane], self.free[COMPUTE])
            end = start + r.comm_ns
            self.free[lane] = end
            self.spans.append(SimSpan(r.unit, BACKWARD, REDUCE_SCATTER, lane, start, end, self.host))
            if r.ar_ns:
                lane = self.lanes[ALL_REDUCE]
                a0 = max(end, self.free[lane])
                end = a0 + r.ar_ns
                self.free[lane] = end
                self.spans.append(SimSpan(r.unit, BACKWARD, ALL_REDUCE, lane, a0, end, self.host))
        else:
            start = max(self.host, self.free[COMM])
            end = start + r.comm_ns + r.ar_ns
            self.free[COMM] = end
            self.spans.append(SimSpan(r.unit, BACKWARD, REDUCE_SCATTER, COMM, start, end))
            self.host = end
        self.pending_reduce = [(end, r.bytes)]
        self.reduce_ends.append(end)

    def _segment(self, op: SegmentOp) -> None:
        seg = op.segment
        if op.finalize:
            self.pending_reduce = []
            if self.gpu:
                self.free[COMPUTE] = max([self.free[COMPUTE], *self.reduce_ends])
            return
        start = self.host
        if self.gpu and seg.device_ns:  # launched as the segment starts, run in order on the compute stream
            d0 = max(start + self.lat, self.free[COMPUTE])
            self.free[COMPUTE] = d0 + seg.device_ns
            kind = "optimizer" if op.name == "post" else "compute"
            self.spans.append(SimSpan("", op.name, kind, COMPUTE, d0, d0 + seg.device_ns, start))
        done = 0.0
        for at in sorted(seg.sync_at):
            self.host += max(0.0, at - done)
            done = max(done, at)
            self.host = max(self.host, *self.free.values())  # the host waits for the device
        self.host += max(0.0, seg.busy_ns - done)
        busy_end = self.host
        # CPU: the collectives the thread waited for outside every unit (ZeRO-3's reductions at the end
        # of its backward, a loss all-reduce) are communication nothing hid, as the bound counts them
        phase = "optimizer" if op.name == "post" else op.name
        for i, ns in enumerate(seg.comm_ns):
            if ns > 0:
                kind = seg.comm_kinds[i] if i < len(seg.comm_kinds) else ALL_REDUCE
                self.spans.append(SimSpan("", phase, kind, COMM, self.host, self.host + ns, self.host))
            self.host += ns
        if not self.gpu and op.name == "post" and seg.busy_ns:
            self.spans.append(SimSpan("", "optimizer", "optimizer", HOST, start, busy_end))

    def result(self) -> SimResult:
        comm = _union([(s.start, s.end) for s in self.spans
                       if s.kind in UNIT_COLLECTIVES])
        busy = _union([(s.start, s.end) for s in self.spans if _on_compute(s)])
        model = _union([(s.start, s.end) for s in self.spans if s.kind in ("compute", "optimizer")])
        copies = _union([(s.start, s.end) for s in self.spans if s.kind in FSDP_WORK])
        # as the bound splits a traced step (analysis/bound.py): a copy under the model's work or a
        # collective is theirs, the rest is FSDP's own
        theirs = _union([*model, *comm])
        comm_ns = sum(e - s for s, e in comm)
        on_busy, on_theirs = _coverage(busy), _coverage(theirs)
        exposed = comm_ns - sum(on_busy(s, e) for s, e in comm)
        return SimResult(step_ns=self.host, spans=self.spans, comm_ns=comm_ns, exposed_comm_ns=exposed,
                         compute_ns=sum(e - s for s, e in model),
                         fsdp_copy_ns=sum((e - s) - on_theirs(s, e) for s, e in copies),
                         fsdp_kernel_ns=sum(s.end - s.start for s in self.spans if s.kind in FSDP_WORK),
                         notes=list(self.p.notes))


def _idle_split(spans: list[SimSpan], fsdp_host: list[tuple[float, float]],
                step_ns: float) -> tuple[float, float, float]:
    """(host wait, FSDP's host work, other idle) of a simulated GPU step, as analysis/bound.py splits a
    traced one (``split_idle``): a gap in the device's work is the host's when the first work starting
    at or after its end was launched after the gap began; of it, the time to that launch the host spent
    in FSDP's own work is FSDP's. The step is the steady state's, one period of the same steps run one
    after another: the device work it leaves running past its end runs at the next one's start, and the
    work ending its last gap is the next one's first."""
    work = [(s.start, s.end, s.launched) for s in spans]
    if not work:
        return 0.0, 0.0, step_ns
    # what runs past the step's end runs at the next one's start (the previous step's, in this one)
    late = [(a - step_ns, b - step_ns, at - step_ns) for a, b, at in work if b > step_ns]
    # by start; of work starting together, the latest launch (as the bound's ``gap_starters``); the next
    # step's first work ends this one's last gap
    first_next = min((a + step_ns, -(at + step_ns)) for a, _, at in work)
    device = [(a, -neg) for a, neg in sorted([(a, -at) for a, _, at in [*work, *late]] + [first_next])]
    busy = _union([(max(a, 0.0), min(b, step_ns)) for a, b, _ in [*work, *late]])
    theirs = _union(fsdp_host)  # the host's intervals lie within its step
    ends = [b for _, b in theirs]
    before = list(itertools.accumulate((b - a for a, b in theirs), initial=0.0))

    def in_theirs(t: float) -> float:  # the host's time in FSDP's work before t
        i = bisect.bisect_left(ends, t)
        return before[i] + (max(0.0, t - theirs[i][0]) if i < len(theirs) else 0.0)

    starts = [d for d, _ in device]
    host = fsdp = other = 0.0
    at = 0.0
    for lo, hi in [*busy, (step_ns, step_ns)]:
        a, b = at, lo
        at = max(at, hi)
        if b <= a:
            continue
        i = bisect.bisect_left(starts, b)
        if i < len(device) and device[i][1] >= a:
            mine = in_theirs(min(device[i][1], b)) - in_theirs(a)
            host += b - a - mine
            fsdp += mine
        else:
            other += b - a
    return host, fsdp, other


def _on_compute(span: SimSpan) -> bool:
    """Work that keeps the compute stream busy: the model's, the copy-outs, FSDP's kernels on it."""
    return span.kind in ("compute", "copy_out", "optimizer") or (span.kind == FSDP_KERNELS and span.lane == COMPUTE)


def _union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for s, e in sorted(intervals):
        if e <= s:
            continue
        if out and s <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], e))
        else:
            out.append((s, e))
    return out


def _coverage(union: list[tuple[float, float]]) -> Callable[[float, float], float]:
    """A function of ``[a, b)``: the time of it that ``union`` (sorted, disjoint: :func:`_union`) covers,
    from a bisection to the first piece that ends after ``a`` (a GPU step's compute is hundreds of
    spans, asked of hundreds of intervals)."""
    ends = [e for _, e in union]

    def covered(a: float, b: float) -> float:
        total = 0.0
        for s, e in itertools.islice(union, bisect.bisect_right(ends, a), None):
            if s >= b:
                break
            total += min(e, b) - max(s, a)
        return total

    return covered
