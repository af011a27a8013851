"""Simulate an FSDP2 training step on GPUs: the events each rank records, and the ground truth.

The engine walks FSDP2's schedule (root pre-forward, per-unit pre-forward / all-gather / copy-out /
compute / post-forward, the backward on the autograd thread with pre-backward, prefetches,
post-backward reshard / rs_wait / reduce, the optimizer) and gives every CPU range, launch and
kernel a time. It follows the stream semantics FSDP2 sets up: the copy-in stream waits on the
previous copy-out, the all-gather stream waits on the copy-in, the compute stream waits on the
gather before copy-out, the reduce-scatter stream waits on the compute stream, and
``post_backward_rs_wait`` makes the compute stream wait on the previous unit's reduce-scatter.
A collective ends at the same instant on every rank of its group: the last rank to start it plus
its transfer time.

Times are vectors over ranks (numpy) when ranks behave differently, plain ints when all ranks
share one timeline. Every interval the analysis should find is written to :class:`Truth` as it is
created, so the expected answers come from the model itself, never from the analysis code.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .scenario import (
    ROOT,
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
COPY_BYTES_PER_NS = 400.0  # device-local copies (copy-in, copy-out, chunk_cat)
PAGE_BYTES = 2 << 20  # the caching allocator reserves in 2 MiB segments

GEMM_FWD = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_kernel__5x_cublas"
GEMM_BWD = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_nt_n_tilesize128x256x64_warpgroupsize1x1x1_execute_kernel__5x_cublas"
FOREACH_COPY = ("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous "
                "namespace)::TensorListMetadata<2>, at::native::(anonymous namespace)::CopyFunctor<c10::BFloat16,"
                " float, 2, 1, 1>, at::native::(anonymous namespace)::Copy<c10::BFloat16, float>>(...)")
SPLIT_COPY = "void at::native::(anonymous namespace)::split_with_sizes_copy_out_contiguous_no_cast_kernel<c10::BFloat16>(...)"
CHUNK_CAT = "void at::native::(anonymous namespace)::chunk_cat_cuda_kernel<c10::BFloat16, c10::BFloat16>(...)"
ADAM = ("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous "
        "namespace)::TensorListMetadata<4>, at::native::(anonymous namespace)::FusedAdamMathFunctor<float, 4, "
        "(at::native::ADAM_MODE)1, false>, ...>(...)")
LOSS = "void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, c10::BFloat16, float, float>(...)"
NCCL_AG = "ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
NCCL_RS = "ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
NCCL_AR = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)"


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
    windows: dict[tuple[int, str, str], list[Any]] = field(default_factory=dict)  # (step, unit, phase)
    memory: list[tuple[Any, int, int, tuple[str, str] | None, int]] = field(default_factory=list)
    steps: dict[int, tuple[Any, Any]] = field(default_factory=dict)
    unit_order: list[str] = field(default_factory=list)
    baseline_bytes: int = 0


class Engine:
    """Builds the events and truth of a scenario for ``n`` timelines (ranks, or 1 if shared)."""

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
        ranks = np.arange(sc.world_size if self.vec else 1)
        self._shard_group = ranks // sc.shard_size
        self._replica_group = ranks % sc.shard_size
        self.units = {u.name: u for u in sc.all_units()}
        self.children = [u.name for u in sc.units]
        # FSDP2 state between steps
        self.pending: dict[str, Any] = {}  # unit -> all-gather done time (issued, not copied out)
        self.unsharded: set[str] = set()
        self.last_copy_out: Any = None
        self.rs_states: list[tuple[Any, int]] = []  # (event time, reduce-scatter input bytes)
        self.step = -1
        self._step_gpu: list[Any] = [None, None]
        self._step_ext = 0
        self.window: list[tuple[str, str]] = []  # memory attribution: the (unit, phase) windows open
        p = sc.dtype_bytes
        psi = sum(sc.padded_numel(u) for u in sc.all_units())
        self.alloc = (2 * p + sc.optimizer_bytes_per_param) * psi // sc.shard_size
        self.truth.baseline_bytes = self.alloc
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
               extra: dict | None = None) -> tuple[Any, Any, Any]:
        """Launch a kernel on ``stream``; returns (launch time, start, end) vectors."""
        driver = comm is not None and self.sc.nccl_launch_driver
        t_launch, corr = self.runtime("cuLaunchKernelEx" if driver else api, self.sc.launch_ns, driver=driver)
        start = self._max(t_launch + self.sc.launch_latency_ns, self.free[stream], after)
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

    def mem(self, delta: int) -> None:
        """One ``[memory]`` event: an allocation (+) or free (-) on the GPU at the current CPU time."""
        self.alloc += delta
        self.reserved = max(self.reserved, -(-self.alloc // PAGE_BYTES) * PAGE_BYTES)
        self._addr += 4096
        ctx = self.window[-1] if self.window else None
        self.truth.memory.append((self.now, self.alloc, self.reserved, ctx, self.step))
        self.events.append(Event("i", "cpu_instant_event", "[memory]", self.thread, self.now, None,
                                 {"Total Reserved": self.reserved, "Total Allocated": self.alloc,
                                  "Bytes": delta, "Device Id": 0, "Device Type": 1, "Addr": self._addr}))
        self.advance(500)

    def span(self, unit: str, phase: str, kind: str, lane: tuple[str, Any], start: Any, end: Any,
             issue: Any = None, nbytes: int = -1) -> None:
        self.truth.spans.append(TruthSpan(self.step, unit, phase, kind, lane, start, end,
                                          start if issue is None else issue, nbytes))

    def open_window(self, unit: str, phase: str) -> None:
        """The unit's forward / backward window starts (at its pre-forward / pre-backward label)."""
        self.window.append((unit, phase))
        self.truth.windows[(self.step, unit, phase)] = [self.now, None]

    def close_window(self, unit: str, phase: str) -> None:
        """... and ends with its post-forward / post-backward-reduce label."""
        assert self.window.pop() == (unit, phase)
        self.truth.windows[(self.step, unit, phase)][1] = self.now

    # ----- FSDP2 pieces ------------------------------------------------------------------------
    def label(self, action: str, unit: str) -> str:
        return f"FSDP::{action}" if unit == ROOT else f"FSDP::{action} ({unit})"

    def unit_bytes(self, unit: str) -> int:
        return self.sc.padded_numel(self.units[unit]) * self.sc.dtype_bytes

    def pg(self, group: str) -> tuple[str, str, str]:
        """(name, description, ranks) of this rank's shard or replica process group."""
        sc = self.sc
        if sc.hsdp_replicas == 1:
            return "0", "default_pg", str(list(range(sc.world_size)))
        # HSDP groups are rank-specific: only possible on per-rank timelines (checked by the caller).
        return ("1", "mesh_shard", "[]") if group == "shard" else ("2", "mesh_replicate", "[]")

    def comm_args(self, collective: str, in_nelems: int, out_nelems: int, group: str) -> dict:
        name, desc, ranks = self.pg(group)
        size = self.sc.shard_size if group == "shard" else self.sc.hsdp_replicas
        return {"Collective name": collective, "In msg nelems": in_nelems, "Out msg nelems": out_nelems,
                "Group size": size, "dtype": "BFloat16", "In split size": "[]", "Out split size": "[]",
                "Process Group Name": name, "Process Group Description": desc, "Process Group Ranks": ranks}

    def comm_ns(self, nbytes: int) -> int:
        return self.sc.comm_latency_ns + int(nbytes / self.sc.comm_bytes_per_ns)

    def needs_gather(self, unit: str) -> bool:
        return unit not in self.unsharded and unit not in self.pending

    def all_gather(self, unit: str, phase: str) -> None:
        sc = self.sc
        nbytes = self.unit_bytes(unit)
        numel = nbytes // sc.dtype_bytes
        with self.range(self.label("all_gather", unit)):
            with self.range("fsdp::all_gather_copy_in", cat="cpu_op"):
                self.mem(nbytes)  # the all-gather output buffer
                self.wait(STREAM_AG_COPY_IN, self.last_copy_out)
                _, c0, c1 = self.launch(FOREACH_COPY, STREAM_AG_COPY_IN, int(nbytes / sc.shard_size / COPY_BYTES_PER_NS) + 2_000)
            self.span(unit, phase, "copy_in", ("gpu", STREAM_AG_COPY_IN), c0, c1)
            self.wait(STREAM_ALL_GATHER, self.free[STREAM_AG_COPY_IN])
            with self.range("c10d::_allgather_base_", cat="cpu_op"):
                comm = self.comm_args("_allgather_base", numel // sc.shard_size, numel, "shard")
                with self.range("record_param_comms", cat="cpu_op", args=comm):
                    issue, start, end = self.launch(NCCL_AG, STREAM_ALL_GATHER, self.comm_ns(nbytes), comm=comm)
            self.pending[unit] = self.record_event(STREAM_ALL_GATHER)
        self.span(unit, phase, "all_gather", ("gpu", STREAM_ALL_GATHER), start, end, issue, nbytes)

    def copy_out(self, unit: str, phase: str) -> None:
        nbytes = self.unit_bytes(unit)
        with self.range(self.label("all_gather_copy_out", unit)):
            self.wait(STREAM_COMPUTE, self.pending.pop(unit))
            with self.range("fsdp::split_with_sizes_copy", cat="cpu_op"):
                self.mem(nbytes)  # unsharded parameters
                _, c0, c1 = self.launch(SPLIT_COPY, STREAM_COMPUTE, int(nbytes / COPY_BYTES_PER_NS) + 2_000)
            self.mem(-nbytes)  # the all-gather output buffer
            self.last_copy_out = self.record_event(STREAM_COMPUTE)
        self.unsharded.add(unit)
        self.span(unit, phase, "copy_out", ("gpu", STREAM_COMPUTE), c0, c1)

    def compute(self, unit: str, phase: str, gpu_ns: int, n_kernels: int, act_bytes: int,
                grad_bytes: int = 0) -> None:
        """One contiguous piece of the unit's own compute: ``n_kernels`` ops on the compute stream."""
        sc = self.sc
        first = last = None
        for k in range(n_kernels):
            dur = gpu_ns // n_kernels + (gpu_ns % n_kernels if k == n_kernels - 1 else 0)
            if phase == "forward":
                name, kernel = "aten::mm", GEMM_FWD
                outer = self.range("aten::linear", cat="cpu_op", overhead_ns=sc.cpu_op_ns - sc.launch_ns)
            else:
                name, kernel = "aten::mm", GEMM_BWD
                outer = self.range("autograd::engine::evaluate_function: MmBackward0", cat="cpu_op",
                                   overhead_ns=sc.cpu_op_ns - sc.launch_ns)
            with outer:
                if k == 0 and grad_bytes:
                    self.mem(grad_bytes)
                share = act_bytes // n_kernels + (act_bytes % n_kernels if k == n_kernels - 1 else 0)
                if share:
                    self.mem(share if phase == "forward" else -share)
                with self.range(name, cat="cpu_op", overhead_ns=0):
                    _, start, end = self.launch(kernel, STREAM_COMPUTE, dur)
            first = start if first is None else first
            last = end
        self.span(unit, phase, "compute", ("gpu", STREAM_COMPUTE), first, last)

    def reshard(self, unit: str) -> None:
        if unit in self.unsharded:
            self.unsharded.discard(unit)
            self.mem(-self.unit_bytes(unit))

    # ----- forward -------------------------------------------------------------------------
    def forward_unit(self, unit: str) -> None:
        sc, spec = self.sc, self.units[unit]
        self.open_window(unit, "forward")
        with self.range(self.label("pre_forward", unit)):
            if self.needs_gather(unit):
                self.all_gather(unit, "forward")
            if unit in self.pending:
                self.copy_out(unit, "forward")
        if isinstance(sc.forward_prefetch, int) and unit != ROOT:
            i = self.children.index(unit)
            for target in self.children[i + 1: i + 1 + sc.forward_prefetch]:
                with self.range(f"FSDP::forward_prefetch for {target}"):
                    if self.needs_gather(target):
                        self.all_gather(target, "forward")
        if unit == ROOT:
            self.compute(unit, "forward", spec.fwd_ns // 2, sc.kernels_per_unit, spec.act_bytes // 2)
            for child in self.children:
                self.forward_unit(child)
            self.compute(unit, "forward", spec.fwd_ns - spec.fwd_ns // 2, sc.kernels_per_unit,
                         spec.act_bytes - spec.act_bytes // 2)
        else:
            self.compute(unit, "forward", spec.fwd_ns, sc.kernels_per_unit, spec.act_bytes)
        if sc.sync_per_unit:
            self.sync()
        with self.range(self.label("post_forward", unit)) as r:
            if spec.reshard_after_forward:
                self.reshard(unit)
        self.close_window(unit, "forward")
        self.span(unit, "forward", "reshard", self.thread, r["start"], r["end"])

    def forward(self) -> None:
        with (self.range("FSDP::root_pre_forward"), self.range("FSDP::inputs_to_device"),
              self.range("aten::to", cat="cpu_op")):
            self.launch("Memcpy HtoD (Pinned -> Device)", STREAM_COMPUTE, 3_000, cat="gpu_memcpy",
                        api="cudaMemcpyAsync", extra={"bytes": 65536, "memory bandwidth (GB/s)": 21.8})
        if self.sc.root is not None:
            self.forward_unit(ROOT)
        else:
            for child in self.children:
                self.forward_unit(child)
        with self.range("aten::cross_entropy_loss", cat="cpu_op"):
            self.launch(LOSS, STREAM_COMPUTE, 20_000)

    # ----- backward ------------------------------------------------------------------------
    def backward_order(self) -> list[str]:
        return list(reversed(self.children))

    def backward_unit(self, unit: str) -> None:
        sc, spec = self.sc, self.units[unit]
        order = self.backward_order()
        self.open_window(unit, "backward")
        with self.range(self.label("pre_backward", unit)):
            if self.needs_gather(unit):
                self.all_gather(unit, "backward")
            if unit in self.pending:
                self.copy_out(unit, "backward")
            # The root has no explicit list: it keeps FSDP2's implicit prefetch unless all are off.
            if sc.backward_prefetch == "implicit" or (unit == ROOT and sc.backward_prefetch != 0):
                target = (order[0] if order else None) if unit == ROOT else self._next_in(order, unit, 1)
                if target is not None:
                    with self.range(f"FSDP::backward_prefetch for {target}"):
                        if self.needs_gather(target):
                            self.all_gather(target, "backward")
        if isinstance(sc.backward_prefetch, int) and unit != ROOT:
            i = order.index(unit)
            for target in order[i + 1: i + 1 + sc.backward_prefetch]:
                with self.range(f"FSDP::backward_prefetch for {target}"):
                    if self.needs_gather(target):
                        self.all_gather(target, "backward")
        grad = self.unit_bytes(unit)
        if unit == ROOT:
            self.compute(unit, "backward", spec.bwd_ns // 2, 2 * sc.kernels_per_unit,
                         spec.act_bytes - spec.act_bytes // 2, grad_bytes=grad)
            for child in order:
                self.backward_unit(child)
            self.compute(unit, "backward", spec.bwd_ns - spec.bwd_ns // 2, 2 * sc.kernels_per_unit,
                         spec.act_bytes // 2)
            if sc.sync_per_unit:
                self.sync()
            with self.range("FSDP::root_post_backward_callback"):
                self.post_backward(unit)
                self.finalize_backward()
        else:
            self.compute(unit, "backward", spec.bwd_ns, 2 * sc.kernels_per_unit, spec.act_bytes,
                         grad_bytes=grad)
            if sc.sync_per_unit:
                self.sync()
            self.post_backward(unit)

    @staticmethod
    def _next_in(order: list[str], unit: str, k: int) -> str | None:
        i = order.index(unit) + k
        return order[i] if i < len(order) else None

    def post_backward(self, unit: str) -> None:
        sc = self.sc
        nbytes = self.unit_bytes(unit)
        numel = nbytes // sc.dtype_bytes
        with self.range(self.label("post_backward_accumulate", unit)):
            pass
        with self.range(self.label("post_backward_reshard", unit)) as r:
            self.reshard(unit)
        self.span(unit, "backward", "reshard", self.thread, r["start"], r["end"])
        if self.rs_states:
            fqn = "" if unit == ROOT else unit
            with self.range(f"FSDP::post_backward_rs_wait ({fqn})"):
                while self.rs_states:
                    event, rs_bytes = self.rs_states.pop(0)
                    self.wait(STREAM_COMPUTE, event)
                    self.mem(-rs_bytes)
        with self.range(self.label("post_backward_reduce", unit)):
            with self.range("fsdp::chunk_cat", cat="cpu_op"):
                self.mem(nbytes)  # reduce-scatter input
                self.launch(CHUNK_CAT, STREAM_COMPUTE, int(nbytes / COPY_BYTES_PER_NS) + 2_000)
                self.mem(-nbytes)  # unsharded gradients
            self.wait(STREAM_REDUCE_SCATTER, self.free[STREAM_COMPUTE])
            with self.range("c10d::_reduce_scatter_base_", cat="cpu_op"):
                comm = self.comm_args("_reduce_scatter_base", numel, numel // sc.shard_size, "shard")
                with self.range("record_param_comms", cat="cpu_op", args=comm):
                    issue, start, end = self.launch(NCCL_RS, STREAM_REDUCE_SCATTER, self.comm_ns(nbytes), comm=comm)
            self.span(unit, "backward", "reduce_scatter", ("gpu", STREAM_REDUCE_SCATTER), start, end, issue, nbytes)
            done = self.record_event(STREAM_REDUCE_SCATTER)
            if sc.hsdp_replicas > 1:
                shard_bytes = nbytes // sc.shard_size
                self.wait(STREAM_ALL_REDUCE, done)
                with self.range("c10d::allreduce_", cat="cpu_op"):
                    n = numel // sc.shard_size
                    comm = self.comm_args("allreduce", n, n, "replica")
                    with self.range("record_param_comms", cat="cpu_op", args=comm):
                        issue, start, end = self.launch(NCCL_AR, STREAM_ALL_REDUCE, self.comm_ns(shard_bytes),
                                                        comm=comm, group="replica")
                self.span(unit, "backward", "all_reduce", ("gpu", STREAM_ALL_REDUCE), start, end, issue,
                          shard_bytes)
                done = self.record_event(STREAM_ALL_REDUCE)
            self.rs_states.append((done, nbytes))
        self.close_window(unit, "backward")

    def finalize_backward(self) -> None:
        while self.rs_states:
            event, rs_bytes = self.rs_states.pop(0)
            self.wait(STREAM_COMPUTE, event)
            self.mem(-rs_bytes)

    def backward(self) -> None:
        self.cpu[AUTOGRAD] = self._max(self.cpu[AUTOGRAD], self.cpu[MAIN])
        self.thread = AUTOGRAD
        if self.sc.root is not None:
            self.backward_unit(ROOT)
        else:
            for child in self.backward_order():
                self.backward_unit(child)
            with self.range("FSDP::root_post_backward_callback"):
                self.finalize_backward()
        self.cpu[MAIN] = self._max(self.cpu[MAIN], self.cpu[AUTOGRAD])
        self.thread = MAIN

    # ----- step ------------------------------------------------------------------------------
    def optimizer(self) -> None:
        n = 4
        first = last = None
        with self.range("Optimizer.step#AdamW.step"):
            for k in range(n):
                with self.range("aten::_fused_adamw_", cat="cpu_op"):
                    _, start, end = self.launch(ADAM, STREAM_COMPUTE, self.sc.optimizer_ns // n)
                first = start if first is None else first
                last = end
        self.span("", "optimizer", "compute", ("gpu", STREAM_COMPUTE), first, last)
        with self.range("Optimizer.zero_grad#AdamW.zero_grad"):
            pass

    def run_step(self, step: int) -> None:
        sc = self.sc
        self.step = step
        delay: Any = sc.data_ns
        if self.vec and sc.step_delay_ns:
            delay = sc.data_ns + np.array([sc.step_delay_ns.get(r, 0) for r in range(self.n)], dtype=np.int64)
        self._step_gpu = [None, None]
        self._step_ext = self._ext + 1
        with self.range(f"ProfilerStep#{step}") as r:
            self.op("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", delay)
            self.forward()
            self.backward()
            self.optimizer()
            with self.range("aten::item", cat="cpu_op"), self.range("aten::_local_scalar_dense", cat="cpu_op"):
                self.launch("Memcpy DtoH (Device -> Pageable)", STREAM_COMPUTE, 2_000, cat="gpu_memcpy",
                            api="cudaMemcpyAsync", extra={"bytes": 4, "memory bandwidth (GB/s)": 0.002})
                self.sync("cudaStreamSynchronize")
        self.truth.steps[step] = (r["start"], r["end"])
        first, last = self._step_gpu
        self.events.append(Event("X", "gpu_user_annotation", f"ProfilerStep#{step}", ("gpu", STREAM_COMPUTE),
                                 first, last - first, {"External id": self._step_ext}))

    def run(self) -> None:
        self.truth.unit_order = [u.name for u in self.sc.all_units()]
        for step in self.sc.steps:
            self.run_step(step)
