"""Hypothesis strategies for random Kineto traces, from plausible to hostile.

Four families, each a dict ready for ``json.dumps``:

- :func:`fsdp_timelines`: what FSDP2 (or fsdpviz's own labels, for FSDP1 / ZeRO-3) leaves in a
  trace, with random units (odd names included), durations, prefetching and omissions: per step a
  forward and a backward pass over the units, each gather and reduction issued inside its label
  and run on a gloo thread or an NCCL stream, compute ops (with kernels on a GPU), the optimizer.
  The strictest invariants hold on these.
- :func:`fsdp_traces`: a main thread whose ranges nest properly but whose names are drawn at
  random (FSDP2 / fsdpviz / FSDP1 labels, well-formed or not, aten ops, collective issue ops),
  gloo threads running serial collectives, optionally CUDA streams running kernels launched from
  the main thread (never before their launch, one at a time per stream), allocator samples.
- the same with ``tangled=True``: ranges that overlap without nesting, labels that open and never
  close, steps out of order, repeated or with absurd numbers. No crash, basic invariants.
- :func:`hostile_events`: events whose fields have any JSON type or value (null, strings, huge or
  negative numbers, NaN, unknown phases and categories, ``args`` that are not objects), mixed into
  either family. They must be skipped and counted, never crash the loader.

Times are microseconds, as Kineto writes them.
"""

from __future__ import annotations

import math
from typing import Any

from helpers.kineto import complete, gpu_op, launch, memory_sample, thread_name
from hypothesis import strategies as st

PID = 4242
MAIN_TID = 4242
AUTOGRAD_TID = 4300
GLOO_TIDS = (4310, 4311)
STREAMS = (7, 20)

# Unit names users write, and names nobody should write but a trace may still carry.
ODD_FQNS = (
    "blocks.0", "layers.11.mlp", "(root)", "", " ", "a (b)", "x)", "(", "))", "blocks.0, blocks.1",
    "a [pg=3]", "<img src=x onerror=alert(1)>", "ünï.cödé", "模块.0", "\t", "a\nb", "\\", '"q"', "%s", "{}",
)
LABEL_TEMPLATES = (
    "FSDP::pre_forward ({u})", "FSDP::post_forward ({u})", "FSDP::all_gather ({u})",
    "FSDP::all_gather_copy_out ({u})", "FSDP::pre_backward ({u})", "FSDP::post_backward_reduce ({u})",
    "FSDP::post_backward_reduce ({u}) [pg=2]", "FSDP::post_backward_reshard ({u})",
    "FSDP::post_backward_accumulate ({u})", "FSDP::post_backward_rs_wait ({u})",
    "FSDP::forward_prefetch for {u}", "FSDP::backward_prefetch for {u}", "FSDP::root_pre_forward",
    "FSDP::root_post_backward_callback", "FSDP::pre_forward", "FSDP::all_gather", "FSDP::post_backward_reduce",
    "fsdpviz::forward ({u})", "fsdpviz::backward ({u})", "fsdpviz::all_gather ({u})",
    "fsdpviz::reduce_scatter ({u})", "fsdpviz::all_gather ({u}, {u})", "FullyShardedDataParallel._pre_forward",
    "FullyShardedDataParallel.forward", "Optimizer.step#AdamW.step",
    # malformed: no closing parenthesis, empty action, unknown action, a label inside a label
    "FSDP::pre_forward ({u}", "FSDP::", "fsdpviz::", "FSDP::weird_action ({u})", "fsdpviz::forward ((({u})",
    "FSDP::pre_forward ({u}) [pg=x]", "FSDP::pre_forward (FSDP::all_gather ({u}))",
)
STEP_NAMES = ("ProfilerStep#{n}", "ProfilerStep#-1", "ProfilerStep#99999999999999999999", "ProfilerStep#",
              "ProfilerStep#2147483648")
OP_NAMES = (
    "aten::mm", "aten::add_", "aten::empty", "c10d::allgather_", "c10d::_allgather_base_",
    "c10d::_reduce_scatter_base_", "c10d::allreduce_", "record_param_comms", "fsdp::all_gather_copy_in",
    "autograd::engine::evaluate_function: PreBackwardFunctionForModule", "nccl:all_gather", "gloo:all_gather",
    "aten::copy_",
)
GLOO_OPS = ("gloo:all_gather", "gloo:reduce_scatter", "gloo:all_reduce", "gloo:broadcast", "gloo:weird")
KERNELS = (
    "volta_sgemm_128x64_nn", "ncclDevKernel_AllGather_RING_LL", "ncclDevKernel_ReduceScatter_Sum_f32_RING_LL",
    "ncclKernel_AllReduce_RING_LL_Sum_float", "Memcpy DtoD (Device -> Device)", "void at::elementwise<>",
)

# Any JSON value, including the non-standard NaN / Infinity literals json.dumps writes for floats.
EDGE_INTS = (2**31 - 1, 2**31, 2**32 + 1, 2**53 + 1, 2**63 - 1, 2**63, 2**64 - 1, 2**64, -(2**63), -(2**63) - 1, -1, 0)
ODD_VALUES = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70), st.sampled_from(EDGE_INTS),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=6),
    st.lists(st.integers(min_value=-3, max_value=3), max_size=2),
    st.dictionaries(st.text(max_size=3), st.integers(min_value=-3, max_value=3), max_size=2),
)
ARG_KEYS = (
    "External id", "correlation", "stream", "device", "Collective name", "In msg nelems", "Out msg nelems",
    "dtype", "Group size", "Process Group Name", "Input Dims", "Input type", "Total Allocated",
    "Total Reserved", "Bytes", "Device Type", "Device Id", "name", "labels", "Brand new field",
)


def hostile_events() -> st.SearchStrategy[Any]:
    """Single trace events with any field missing or of any type; also non-objects."""
    event = st.fixed_dictionaries(
        {},
        optional={
            "ph": st.one_of(st.sampled_from(["X", "i", "I", "M", "B", "E", "b", "e", "s", "f", "C", "Q", ""]),
                            ODD_VALUES),
            "cat": st.one_of(st.sampled_from(["cpu_op", "user_annotation", "kernel", "gpu_memcpy", "cuda_runtime",
                                              "cpu_instant_event", "brand_new", "", "Kernel"]), ODD_VALUES),
            "name": st.one_of(st.sampled_from([*OP_NAMES, *KERNELS, "[memory]", "thread_name",
                                               "ProfilerStep#1", "FSDP::pre_forward (x)"]), ODD_VALUES),
            "pid": st.one_of(st.just(PID), ODD_VALUES),
            "tid": st.one_of(st.sampled_from([MAIN_TID, *GLOO_TIDS, *STREAMS]), ODD_VALUES),
            "ts": st.one_of(st.floats(min_value=0, max_value=5000), ODD_VALUES),
            "dur": st.one_of(st.floats(min_value=-10, max_value=5000), ODD_VALUES),
            "args": st.one_of(ODD_VALUES, st.dictionaries(st.sampled_from(ARG_KEYS), ODD_VALUES, max_size=4)),
            "new_field_of_a_future_pytorch": ODD_VALUES,
        },
    )
    return st.one_of(event, ODD_VALUES)


def _fqn() -> st.SearchStrategy[str]:
    return st.one_of(st.sampled_from(ODD_FQNS), st.text(max_size=8))


@st.composite
def _label_name(draw: st.DrawFn, *, steps: bool = False) -> str:
    template = draw(st.sampled_from(LABEL_TEMPLATES + (STEP_NAMES if steps else ())))
    fqn = draw(_fqn())
    return template.replace("{u}", fqn).replace("{n}", str(draw(st.integers(0, 9))))


def _x(name: str, cat: str, tid: int, ts: float, dur: float, **args: Any) -> dict[str, Any]:
    return complete(name, cat, PID, tid, ts, dur, args)


class _Builder:
    """Collects events and hands out correlation ids."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self.corr = 1
        self.stream_free = dict.fromkeys(STREAMS, 0.0)

    def add(self, event: dict[str, Any]) -> None:
        self.events.append(event)

    def launch(self, draw: st.DrawFn, ts: float, dur: float) -> None:
        """A cudaLaunchKernel at ``ts`` and its kernel: after the launch, serial on its stream."""
        corr, self.corr = self.corr, self.corr + 1
        self.add(launch(corr, PID, MAIN_TID, ts, min(dur, 1.0)))
        name = draw(st.sampled_from(KERNELS))
        stream = STREAMS[1] if name.startswith("nccl") else draw(st.sampled_from(STREAMS))
        start = max(ts + draw(st.floats(0, 50)), self.stream_free[stream])
        length = draw(st.floats(0.5, 300))
        self.stream_free[stream] = start + length
        cat = "gpu_memcpy" if name.startswith("Memcpy") else "kernel"
        self.add(gpu_op(name, start, length, corr=corr, stream=stream, cat=cat))


def _nested(draw: st.DrawFn, b: _Builder, lo: float, hi: float, depth: int, gpu: bool) -> None:
    """Ranges that nest properly inside [lo, hi) on the main thread (a call stack)."""
    n = draw(st.integers(0, 3 if depth > 0 else 0))
    if n == 0 or hi - lo < 2:
        return
    cuts = sorted(draw(st.lists(st.floats(lo, hi), min_size=2 * n, max_size=2 * n)))
    for i in range(n):
        a, z = cuts[2 * i], cuts[2 * i + 1]
        if draw(st.booleans()):
            name, cat = draw(_label_name()), "user_annotation"
        else:
            name, cat = draw(st.sampled_from(OP_NAMES)), "cpu_op"
        b.add(_x(name, cat, MAIN_TID, a, z - a))
        if gpu and cat == "cpu_op" and draw(st.booleans()):
            b.launch(draw, a, z - a)
        _nested(draw, b, a, z, depth - 1, gpu)


@st.composite
def fsdp_traces(draw: st.DrawFn, *, rank: int = 0, world_size: int = 2, gpu: bool = False,
                tangled: bool = False, hostile: bool = False) -> dict[str, Any]:
    """One rank's trace document (see the module docstring)."""
    b = _Builder()
    b.add(thread_name(PID, MAIN_TID, f"thread {MAIN_TID} (python)"))
    for tid in GLOO_TIDS:
        b.add(thread_name(PID, tid, f"thread {tid} (pt_gloo_runloop)"))
    t = draw(st.floats(0, 100))
    for number in range(1, draw(st.integers(0, 4)) + 1):
        length = draw(st.floats(50, 3000))
        step_no = draw(st.integers(0, 6)) if tangled else number
        b.add(_x(f"ProfilerStep#{step_no}", "user_annotation", MAIN_TID, t, length))
        _nested(draw, b, t, t + length, depth=3, gpu=gpu)
        t += length + (draw(st.floats(-40, 40)) if tangled else draw(st.floats(0, 20)))
    end = max(t, 100.0)
    for tid in GLOO_TIDS:  # serial collectives on each gloo thread
        g = draw(st.floats(0, 50))
        for _ in range(draw(st.integers(0, 4))):
            length = draw(st.floats(1, 400))
            op = draw(st.sampled_from(GLOO_OPS))
            b.add(_x(op, "user_annotation", tid, g, length, **{"Input Dims": [[draw(st.integers(0, 4096))]],
                                                               "Input type": ["float"]}))
            g += length + draw(st.floats(0, 200))
    if tangled:  # ranges that overlap without nesting, labels that never close (dur up to the end)
        for _ in range(draw(st.integers(1, 8))):
            a = draw(st.floats(0, end))
            dur = draw(st.one_of(st.floats(0, end), st.just(end - a + 1000.0)))
            b.add(_x(draw(_label_name(steps=True)), draw(st.sampled_from(["user_annotation", "cpu_op"])),
                     draw(st.sampled_from([MAIN_TID, AUTOGRAD_TID, GLOO_TIDS[0]])), a, dur))
    for _ in range(draw(st.integers(0, 6))):  # allocator samples
        b.add(memory_sample(PID, MAIN_TID, draw(st.floats(0, end)), delta=draw(st.integers(-4096, 4096)),
                            allocated=draw(st.integers(0, 2**40)), reserved=draw(st.integers(0, 2**40)),
                            device_type=1 if gpu else 0))
    if hostile:
        b.events.extend(draw(st.lists(hostile_events(), max_size=8)))
    events = draw(st.permutations(b.events)) if draw(st.booleans()) else b.events
    doc: dict[str, Any] = {"schemaVersion": 1, "traceEvents": events,
                           "distributedInfo": {"backend": "nccl" if gpu else "gloo", "rank": rank,
                                               "world_size": world_size}}
    if draw(st.booleans()):
        doc["baseTimeNanoseconds"] = draw(st.sampled_from([1_790_000_000_000_000_000, 0]))
    return doc


def _unit_label(family: str, action: str, unit: str, root: bool) -> str:
    """The label FSDP2 or fsdpviz writes for ``action`` of ``unit`` (FSDP2's root labels are bare)."""
    if family == "fsdpviz":
        return f"fsdpviz::{action} ({'(root)' if root else unit})"
    if action.endswith("_prefetch"):
        return f"FSDP::{action} for {unit}"
    return f"FSDP::{action}" if root else f"FSDP::{action} ({unit})"


class _Timeline(_Builder):
    """Main-thread time moves forward; gloo threads and streams run what it issues."""

    def __init__(self, draw: st.DrawFn, gpu: bool, t0: float) -> None:
        super().__init__()
        self.draw, self.gpu, self.t = draw, gpu, t0
        self.gloo_free = dict.fromkeys(GLOO_TIDS, 0.0)

    def wait(self, lo: float = 0.0, hi: float = 30.0) -> None:
        self.t += self.draw(st.floats(lo, hi))

    def open(self, name: str) -> tuple[str, float]:
        self.wait(0.1, 5)
        return name, self.t

    def close(self, opened: tuple[str, float]) -> None:
        self.wait(0.1, 5)
        name, start = opened
        self.add(_x(name, "user_annotation", MAIN_TID, start, self.t - start))

    def compute(self) -> None:
        for _ in range(self.draw(st.integers(0, 3))):
            start = self.t
            self.wait(1, 200)
            self.add(_x(self.draw(st.sampled_from(["aten::mm", "aten::add_", "aten::gelu"])), "cpu_op",
                        MAIN_TID, start, self.t - start))
            if self.gpu:
                self.kernel("volta_sgemm_128x64_nn", STREAMS[0], start)

    def kernel(self, name: str, stream: int, at: float) -> None:
        corr, self.corr = self.corr, self.corr + 1
        self.add(launch(corr, PID, MAIN_TID, at, 0.5))
        start = max(at + self.draw(st.floats(1, 40)), self.stream_free[stream])
        length = self.draw(st.floats(1, 300))
        self.stream_free[stream] = start + length
        self.add(gpu_op(name, start, length, corr=corr, stream=stream))

    def collective(self, comm: str) -> None:
        """The issuing op on the main thread, the collective on a gloo thread or the NCCL stream."""
        start = self.t
        self.wait(1, 20)
        op = {"all_gather": "c10d::_allgather_base_", "reduce_scatter": "c10d::_reduce_scatter_base_"}[comm]
        self.add(_x(op, "cpu_op", MAIN_TID, start, self.t - start))
        if self.gpu:
            kernel = {"all_gather": "ncclDevKernel_AllGather_RING_LL",
                      "reduce_scatter": "ncclDevKernel_ReduceScatter_Sum_f32_RING_LL"}[comm]
            self.kernel(kernel, STREAMS[1], start)
            return
        tid = self.draw(st.sampled_from(GLOO_TIDS))
        g_start = max(start + self.draw(st.floats(0, 10)), self.gloo_free[tid])
        length = self.draw(st.floats(1, 500))
        self.gloo_free[tid] = g_start + length
        self.add(_x(f"gloo:{comm}", "user_annotation", tid, g_start, length,
                    **{"Input Dims": [[self.draw(st.integers(1, 4096))]], "Input type": ["float"]}))


def _gather(tl: _Timeline, family: str, unit: str, root: bool) -> None:
    if tl.draw(st.integers(0, 4)) == 0:  # resharded units are not always gathered
        return
    label = tl.open(_unit_label(family, "all_gather", unit, root))
    tl.collective("all_gather")
    tl.close(label)


@st.composite
def fsdp_timelines(draw: st.DrawFn, *, rank: int = 0, world_size: int = 2, gpu: bool = False) -> dict[str, Any]:
    """One rank of an FSDP job as its labels and collectives show it (see the module docstring)."""
    family = draw(st.sampled_from(["fsdp2", "fsdpviz"]))
    units = draw(st.lists(st.one_of(st.sampled_from(ODD_FQNS[:4] + ODD_FQNS[5:]), st.text(min_size=1, max_size=6)),
                          min_size=1, max_size=4, unique=True))
    units = [u for u in units if u.strip() and u != "(root)"] or ["blocks.0"]
    with_root = draw(st.booleans())
    order = [("(root)", True)] * with_root + [(u, False) for u in units]
    tl = _Timeline(draw, gpu, draw(st.floats(0, 100)))
    tl.add(thread_name(PID, MAIN_TID, f"thread {MAIN_TID} (python)"))
    for number in range(1, draw(st.integers(1, 4)) + 1):
        step = tl.open(f"ProfilerStep#{number}")
        for i, (unit, root) in enumerate(order):  # forward: each unit's window, gathered first
            action = "pre_forward" if family == "fsdp2" else "forward"
            window = tl.open(_unit_label(family, action, unit, root))
            _gather(tl, family, unit, root)
            if family == "fsdp2" and i + 1 < len(order) and draw(st.booleans()):
                ahead = tl.open(_unit_label(family, "forward_prefetch", order[i + 1][0], order[i + 1][1]))
                _gather(tl, family, *order[i + 1])
                tl.close(ahead)
            if family == "fsdp2":
                tl.close(window)
            tl.compute()
            if family == "fsdp2":
                tl.close(tl.open(_unit_label(family, "post_forward", unit, root)))
            else:
                tl.close(window)
        tl.compute()  # the loss
        for unit, root in reversed(order):  # backward
            action = "pre_backward" if family == "fsdp2" else "backward"
            window = tl.open(_unit_label(family, action, unit, root))
            _gather(tl, family, unit, root)
            if family == "fsdp2":
                tl.close(window)
            tl.compute()
            if family == "fsdp2":
                tl.close(tl.open(_unit_label(family, "post_backward_reshard", unit, root)))
            reduce = tl.open(_unit_label(family, "post_backward_reduce" if family == "fsdp2" else "reduce_scatter",
                                         unit, root))
            tl.collective("reduce_scatter")
            tl.close(reduce)
            if family != "fsdp2":
                tl.close(window)
        optimizer = tl.open("Optimizer.step#AdamW.step")
        tl.compute()
        tl.close(optimizer)
        if not gpu:  # the end of backward waits for the reductions (FSDP2's root_post_backward_callback)
            tl.t = max(tl.t, *tl.gloo_free.values())
        tl.close(step)
    for _ in range(draw(st.integers(0, 6))):
        tl.add(memory_sample(PID, MAIN_TID, draw(st.floats(0, tl.t)), delta=64,
                             allocated=draw(st.integers(0, 2**40)), reserved=2**41, device_type=1 if gpu else 0))
    return {"schemaVersion": 1, "traceEvents": tl.events,
            "distributedInfo": {"backend": "nccl" if gpu else "gloo", "rank": rank, "world_size": world_size}}


@st.composite
def odd_headers(draw: st.DrawFn) -> dict[str, Any]:
    """Top-level fields of any type: distributedInfo, baseTimeNanoseconds, deviceProperties."""
    doc: dict[str, Any] = {}
    if draw(st.booleans()):
        doc["distributedInfo"] = draw(st.one_of(
            ODD_VALUES,
            st.fixed_dictionaries({}, optional={"rank": ODD_VALUES, "world_size": ODD_VALUES,
                                                "backend": ODD_VALUES, "nccl_version": ODD_VALUES}),
        ))
    if draw(st.booleans()):
        doc["baseTimeNanoseconds"] = draw(ODD_VALUES)
    if draw(st.booleans()):
        doc["deviceProperties"] = draw(st.one_of(ODD_VALUES, st.lists(
            st.fixed_dictionaries({}, optional={"id": ODD_VALUES, "name": ODD_VALUES}), max_size=2)))
    if draw(st.booleans()):
        doc["aNewTopLevelField"] = draw(ODD_VALUES)
    return doc


def finite(value: float | None) -> bool:
    """A number that exists (not None, not NaN, not infinite)."""
    return value is not None and math.isfinite(value)
