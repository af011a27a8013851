"""The clockwork under the simulation: CPU threads, CUDA streams, launches, collectives, memory.

A CPU range takes CPU time on its thread; a launch is a runtime call on the CPU and a kernel that
starts when its stream is free, its launch has happened and the events it waits for have fired.
A collective ends at the same instant on every rank of its group: the last rank to start it plus
its transfer time. Each ``[memory]`` sample is an allocation or free at the current CPU time.

Times are vectors over ranks (numpy) when ranks behave differently, plain ints when all ranks
share one timeline. Every interval the analysis should find is written to :class:`Truth` as it is
created, so the expected answers come from the model itself, never from the analysis code.
"""

from __future__ import annotations

import collections
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .scenario import (
    STREAM_AG_COPY_IN,
    STREAM_ALL_GATHER,
    STREAM_ALL_REDUCE,
    STREAM_COMPUTE,
    STREAM_REDUCE_SCATTER,
    Scenario,
)

MAIN = ("cpu", "main")
AUTOGRAD = ("cpu", "autograd")
STREAMS = (STREAM_COMPUTE, STREAM_AG_COPY_IN, STREAM_ALL_GATHER, STREAM_REDUCE_SCATTER, STREAM_ALL_REDUCE)
PAGE_BYTES = 2 << 20  # the caching allocator reserves in 2 MiB segments



@dataclass(slots=True)
class Event:
    """One Kineto event with times as vectors over ranks (or ints on a shared timeline)."""

    ph: str
    cat: str
    name: str
    lane: tuple[str, Any]  # MAIN / AUTOGRAD / ("gpu", stream)
    ts: Any
    dur: Any = None
    args: dict | None = None
    flow: tuple[int, tuple[str, Any], Any] | None = None  # (correlation, launch lane, launch ts)


@dataclass(slots=True)
class TruthSpan:
    step: int
    micro: int  # the micro-batch (forward/backward pass) of the step
    unit: str
    phase: str
    kind: str
    lane: tuple[str, Any]
    start: Any
    end: Any
    issue: Any
    bytes: int = -1


@dataclass(slots=True)
class Truth:
    """Everything the analysis must find, recorded while the events are made."""

    spans: list[TruthSpan] = field(default_factory=list)
    compute_kernels: list[tuple[Any, Any]] = field(default_factory=list)  # every non-NCCL kernel
    # every GPU event (kernels, copies): start, end, a collective?, whether its start waited for its
    # launch (the host) rather than for its stream or an event, its launch time, and whether it is one
    # of FSDP's own copies (copy-in, copy-out, the reduce-scatter input)
    gpu_work: list[tuple[Any, Any, bool, Any, Any, bool]] = field(default_factory=list)
    # CPU time inside FSDP's per-unit hooks (the ``FSDP::`` ranges the schedule opens for a unit): start, end
    fsdp_hooks: list[tuple[Any, Any]] = field(default_factory=list)
    windows: dict[tuple[int, int, str, str], list[Any]] = field(default_factory=dict)  # (step, micro, unit, phase)
    memory: list[tuple[Any, int, int, tuple[str, str] | None, int]] = field(default_factory=list)
    memory_categories: list[str] = field(default_factory=list)  # the category of each ``memory`` sample's block
    baseline_categories: dict[str, int] = field(default_factory=dict)  # what was allocated before recording
    steps: dict[int, tuple[Any, Any]] = field(default_factory=dict)
    unit_order: list[str] = field(default_factory=list)
    baseline_bytes: int = 0


# FSDP2's ranges that run once a step, not once a unit: the root's pre-forward (which moves the batch
# to the device) and the post-backward callback (waiting for the last reductions)
PER_STEP_LABELS = frozenset({"FSDP::root_pre_forward", "FSDP::inputs_to_device", "FSDP::root_post_backward_callback"})


class Engine:
    """Time-keeping for ``n`` timelines (ranks, or 1 if shared): CPU threads, CUDA streams,
    launches, collectives, allocator samples. The framework's schedule is a subclass."""

    def __init__(self, sc: Scenario, n: int) -> None:
        self.sc = sc
        self.n = n
        self.vec = n > 1
        zero: Any = np.zeros(n, dtype=np.int64) if self.vec else 0
        self.cpu: dict[tuple[str, str], Any] = {MAIN: sc.start_ns + zero, AUTOGRAD: sc.start_ns + zero}
        self.free: dict[int, Any] = {s: sc.start_ns + zero for s in STREAMS}
        self.thread = MAIN
        self.events: list[Event] = []
        self.truth = Truth()
        self._ext = 0
        self._corr = 0
        self._stack: list[int] = []  # external ids of open CPU ranges (a kernel links to the innermost)
        self._addr = 0x7F00_0000_0000
        # live blocks by size, oldest first: a free releases the oldest block of its size, as FSDP
        # frees units' buffers in the order it made them (the address pairs it, as in real traces)
        self._live: dict[int, collections.deque[int]] = {}
        ranks = np.arange(sc.world_size if self.vec else 1)
        self._shard_group = ranks // sc.shard_size
        self._replica_group = ranks % sc.shard_size
        self.step = -1
        self.micro = 0
        self._step_gpu: list[Any] = [None, None]
        self._step_ext = 0
        self.window: list[tuple[str, str]] = []  # memory attribution: the (unit, phase) windows open
        p = sc.dtype_bytes
        psi = sum(sc.padded_numel(u) for u in sc.all_units())
        self.alloc = (2 * p + sc.optimizer_bytes_per_param) * psi // sc.shard_size
        self.truth.baseline_bytes = self.alloc
        share = p * psi // sc.shard_size
        optimizer = sc.optimizer_bytes_per_param * psi // sc.shard_size
        self.truth.baseline_categories = {"sharded_params": share, "gradients": share,
                                          "optimizer_state": optimizer, "other": self.alloc - 2 * share - optimizer}
        self.reserved = -(-self.alloc // PAGE_BYTES) * PAGE_BYTES

    # ----- primitives ------------------------------------------------------------------------
    def _max(self, *vals: Any) -> Any:
        vals = tuple(v for v in vals if v is not None)
        if self.vec:
            return np.maximum.reduce([np.broadcast_to(v, (self.n,)) for v in vals]).astype(np.int64)
        return max(vals)

    @property
    def now(self) -> Any:
        return self.cpu[self.thread]

    def advance(self, ns: Any) -> None:
        self.cpu[self.thread] = self.cpu[self.thread] + ns

    def _next_ext(self) -> int:
        self._ext += 1
        return self._ext

    @contextmanager
    def range(self, name: str, cat: str = "user_annotation", args: dict | None = None,
              overhead_ns: int | None = None) -> Iterator[dict]:
        """A CPU range (``record_function`` label or op) around the body."""
        half = (self.sc.label_ns if overhead_ns is None else overhead_ns) // 2
        t0 = self.now
        ext = self._next_ext()
        self._stack.append(ext)
        self.advance(half)
        info: dict = {"start": t0}
        yield info
        self.advance(half)
        self._stack.pop()
        full = {"External id": ext, "Record function id": 0}
        if args:
            full.update(args)
        self.events.append(Event("X", cat, name, self.thread, t0, self.now - t0, full))
        info["end"] = self.now
        if name.startswith("FSDP::") and name not in PER_STEP_LABELS:
            self.truth.fsdp_hooks.append((t0, self.now))

    def op(self, name: str, ns: Any, args: dict | None = None) -> None:
        """A leaf CPU op that takes ``ns`` of CPU time."""
        t0 = self.now
        full = {"External id": self._next_ext(), "Record function id": 0}
        if args:
            full.update(args)
        self.advance(ns)
        self.events.append(Event("X", "cpu_op", name, self.thread, t0, self.now - t0, full))

    def runtime(self, name: str, ns: Any, *, driver: bool = False) -> tuple[Any, int]:
        """A CUDA runtime (or driver) call; returns (start, correlation)."""
        self._corr += 1
        t0 = self.now
        args = {"cbid": 652 if driver else 211, "correlation": self._corr}
        if not driver and self._stack:
            args = {"External id": self._stack[-1], **args}
        self.advance(ns)
        self.events.append(Event("X", "cuda_driver" if driver else "cuda_runtime", name, self.thread, t0,
                                 self.now - t0, args))
        return t0, self._corr

    def launch(self, name: str, stream: int, dur_ns: int, *, after: Any = None, comm: dict | None = None,
               group: str = "shard", cat: str = "kernel", api: str = "cudaLaunchKernel",
               extra: dict | None = None, fsdp_copy: bool = False) -> tuple[Any, Any, Any]:
        """Launch a kernel on ``stream`` (``fsdp_copy``: one of FSDP's own copies); returns (launch time,
        start, end) vectors."""
        driver = comm is not None and self.sc.nccl_launch_driver
        t_launch, corr = self.runtime("cuLaunchKernelEx" if driver else api, self.sc.launch_ns, driver=driver)
        launched = t_launch + self.sc.launch_latency_ns
        start = self._max(launched, self.free[stream], after)
        waited_for_host = start == launched
        if comm is not None:
            end = self._group_end(start, dur_ns, group)
        else:
            end = start + dur_ns
        self.free[stream] = end
        args: dict = {"External id": self._stack[-1] if self._stack else 0, "queued": 0, "device": 0,
                      "context": 1, "stream": stream, "correlation": corr}
        if cat == "kernel":
            args.update({"registers per thread": 96 if comm else 128, "shared memory": 0,
                         "blocks per SM": 0.5, "warps per SM": 2.0, "grid": [132, 1, 1], "block": [256, 1, 1],
                         "est. achieved occupancy %": 0 if comm else 12})
        if extra:
            args.update(extra)
        if comm:
            args.update(comm)
        self.events.append(Event("X", cat, name, ("gpu", stream), start, end - start, args,
                                 flow=(corr, self.thread, t_launch)))
        if comm is None and cat == "kernel":
            self.truth.compute_kernels.append((start, end))
        self.truth.gpu_work.append((start, end, comm is not None, waited_for_host, t_launch, fsdp_copy))
        if stream == STREAM_COMPUTE:
            first = self._step_gpu[0]
            self._step_gpu = [start if first is None else first, end]
        return t_launch, start, end

    def _group_end(self, start: Any, dur_ns: int, group: str) -> Any:
        if not self.vec:
            return start + dur_ns
        key = self._shard_group if group == "shard" else self._replica_group
        end = np.empty_like(start)
        for g in np.unique(key):
            members = key == g
            end[members] = start[members].max() + dur_ns
        return end

    def wait(self, stream: int, t: Any) -> None:
        """``stream.wait_event``: later work on ``stream`` starts after ``t``."""
        self.runtime("cudaStreamWaitEvent", 2_000)
        if t is not None:
            self.free[stream] = self._max(self.free[stream], t)

    def record_event(self, stream: int) -> Any:
        self.runtime("cudaEventRecord", 2_000)
        return self.free[stream]

    def sync(self, name: str = "cudaDeviceSynchronize") -> None:
        """Block the CPU until every stream is idle."""
        t0 = self.now
        done = self._max(*self.free.values(), t0 + 3_000)
        self._corr += 1
        self.cpu[self.thread] = done
        self.events.append(Event("X", "cuda_runtime", name, self.thread, t0, done - t0,
                                 {"cbid": 165, "correlation": self._corr}))

    def mem(self, delta: int, category: str) -> None:
        """One ``[memory]`` event: an allocation (+) or free (-) on the GPU at the current CPU time, of a
        block of ``category`` (fsdpviz.analysis.memory_categories.CATEGORIES: the truth)."""
        self.alloc += delta
        self.reserved = max(self.reserved, -(-self.alloc // PAGE_BYTES) * PAGE_BYTES)
        if delta > 0:
            self._addr += 4096
            addr = self._addr
            self._live.setdefault(delta, collections.deque()).append(addr)
        else:
            blocks = self._live.get(-delta)
            if blocks:
                addr = blocks.popleft()
            else:
                self._addr += 4096
                addr = self._addr
        ctx = self.window[-1] if self.window else None
        self.truth.memory.append((self.now, self.alloc, self.reserved, ctx, self.step))
        self.truth.memory_categories.append(category)
        self.events.append(Event("i", "cpu_instant_event", "[memory]", self.thread, self.now, None,
                                 {"Total Reserved": self.reserved, "Total Allocated": self.alloc,
                                  "Bytes": delta, "Device Id": 0, "Device Type": 1, "Addr": addr}))
        self.advance(500)

    def span(self, unit: str, phase: str, kind: str, lane: tuple[str, Any], start: Any, end: Any,
             issue: Any = None, nbytes: int = -1) -> None:
        self.truth.spans.append(TruthSpan(self.step, self.micro, unit, phase, kind, lane, start, end,
                                          start if issue is None else issue, nbytes))

    def open_window(self, unit: str, phase: str) -> None:
        """The unit's forward / backward window starts (at its pre-forward / pre-backward label)."""
        self.window.append((unit, phase))
        self.truth.windows[(self.step, self.micro, unit, phase)] = [self.now, None]

    def close_window(self, unit: str, phase: str) -> None:
        """... and ends with its post-forward / post-backward-reduce label."""
        assert self.window.pop() == (unit, phase)
        self.truth.windows[(self.step, self.micro, unit, phase)][1] = self.now
