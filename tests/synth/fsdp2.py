"""FSDP2's schedule on the simulated GPUs: what each rank does in a training step, and in which order.

Per micro-batch (one, or several under gradient accumulation): root pre-forward; per unit pre-forward (all-gather unless prefetched, copy-out), explicit forward
prefetches, compute, post-forward (reshard); the backward on the autograd thread with pre-backward
(gather, copy-out, FSDP2's implicit one-unit prefetch nested inside it, or explicit prefetches
after it), compute, post-backward (accumulate, reshard, ``rs_wait`` on the previous unit's
reduce-scatter, reduce-scatter and HSDP all-reduce); the root's post-backward inside
``FSDP::root_post_backward_callback``. Then the optimizer. The streams follow FSDP2's waits: the copy-in
stream waits on the previous copy-out, the all-gather stream on the copy-in, the compute stream on
the gather before copy-out, the reduce-scatter stream on the compute stream, and ``rs_wait`` makes
the compute stream wait on the previous unit's reduce-scatter.
"""

from __future__ import annotations

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
from .timeline import AUTOGRAD, MAIN, Engine, Event

COPY_BYTES_PER_NS = 400.0  # device-local copies (copy-in, copy-out, chunk_cat)
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


class Fsdp2Engine(Engine):
    """Runs the scenario's steps through FSDP2's schedule."""

    def __init__(self, sc: Scenario, n: int) -> None:
        super().__init__(sc, n)
        self.units = {u.name: u for u in sc.all_units()}
        self.children = [u.name for u in sc.units]
        # FSDP2 state between steps
        self.pending: dict[str, Any] = {}  # unit -> all-gather done time (issued, not copied out)
        self.unsharded: set[str] = set()
        self.last_copy_out: Any = None
        self.rs_states: list[tuple[Any, int]] = []  # (event time, reduce-scatter input bytes)
        self.grad_pieces: dict[str, list[int]] = {}  # unit -> its unsharded gradients, as allocated
        self.act_pieces: dict[str, list[int]] = {}  # unit -> its activations, as allocated
        self.act_owed: dict[str, int] = {}  # unit -> activation bytes backward is done with, not yet freed

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

    def comm_ns(self, nbytes: int, group_size: int | None = None) -> int:
        sc = self.sc
        if not sc.ring_comm:
            return sc.comm_latency_ns + int(nbytes / sc.comm_bytes_per_ns)
        n = group_size or sc.shard_size
        # described for 2 ranks: one latency step and half the bytes per link
        return int(sc.comm_latency_ns * (n - 1) + nbytes * (n - 1) / n / (sc.comm_bytes_per_ns / 2))

    def needs_gather(self, unit: str) -> bool:
        return unit not in self.unsharded and unit not in self.pending

    def all_gather(self, unit: str, phase: str) -> None:
        sc = self.sc
        nbytes = self.unit_bytes(unit)
        numel = nbytes // sc.dtype_bytes
        with self.range(self.label("all_gather", unit)):
            with self.range("fsdp::all_gather_copy_in", cat="cpu_op"):
                self.mem(nbytes, "comm_buffers")  # the all-gather output buffer
                self.wait(STREAM_AG_COPY_IN, self.last_copy_out)
                l0, c0, c1 = self.launch(FOREACH_COPY, STREAM_AG_COPY_IN, int(nbytes / sc.shard_size / COPY_BYTES_PER_NS) + 2_000, fsdp_copy=True)
            self.span(unit, phase, "copy_in", ("gpu", STREAM_AG_COPY_IN), c0, c1, l0)
            self.wait(STREAM_ALL_GATHER, self.free[STREAM_AG_COPY_IN])
            if sc.no_overlap:
                self.wait(STREAM_ALL_GATHER, self.free[STREAM_COMPUTE])
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
                self.mem(nbytes, "unsharded_params")
                l0, c0, c1 = self.launch(SPLIT_COPY, STREAM_COMPUTE, int(nbytes / COPY_BYTES_PER_NS) + 2_000, fsdp_copy=True)
            self.mem(-nbytes, "comm_buffers")  # the all-gather output buffer
            self.last_copy_out = self.record_event(STREAM_COMPUTE)
        self.unsharded.add(unit)
        self.span(unit, phase, "copy_out", ("gpu", STREAM_COMPUTE), c0, c1, l0)

    def compute(self, unit: str, phase: str, gpu_ns: int, n_kernels: int, act_bytes: int,
                grad_bytes: int = 0) -> None:
        """One contiguous piece of the unit's own compute: ``n_kernels`` ops on the compute stream."""
        sc = self.sc
        first = last = launched = None
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
                # autograd allocates each parameter's gradient when the op that computes it runs
                if sc.gradients_per_kernel:
                    grads = grad_bytes // n_kernels + (grad_bytes % n_kernels if k == n_kernels - 1 else 0)
                else:
                    grads = grad_bytes if k == 0 else 0
                if grads:
                    self.mem(grads, "unsharded_grads")
                    self.grad_pieces.setdefault(unit, []).append(grads)
                share = act_bytes // n_kernels + (act_bytes % n_kernels if k == n_kernels - 1 else 0)
                if share and phase == "forward":
                    self.mem(share, "activations")
                    self.act_pieces.setdefault(unit, []).append(share)
                elif share:
                    self.free_activations(unit, share)
                with self.range(name, cat="cpu_op", overhead_ns=0):
                    t_launch, start, end = self.launch(kernel, STREAM_COMPUTE, dur)
            first = start if first is None else first
            launched = t_launch if launched is None else launched
            last = end
        self.span(unit, phase, "compute", ("gpu", STREAM_COMPUTE), first, last, launched)

    def free_activations(self, unit: str, nbytes: int) -> None:
        """Backward is done with ``nbytes`` more of the unit's activations: free the blocks forward
        made (last made first) once backward is past each whole one, as the allocator sees them."""
        owed = self.act_owed.get(unit, 0) + nbytes
        pieces = self.act_pieces.get(unit, [])
        while pieces and pieces[-1] <= owed:
            piece = pieces.pop()
            owed -= piece
            self.mem(-piece, "activations")
        if not pieces and owed:
            self.mem(-owed, "activations")
            owed = 0
        self.act_owed[unit] = owed

    def reshard(self, unit: str) -> None:
        if unit in self.unsharded:
            self.unsharded.discard(unit)
            self.mem(-self.unit_bytes(unit), "unsharded_params")

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
                    self.mem(-rs_bytes, "comm_buffers")
        with self.range(self.label("post_backward_reduce", unit)):
            with self.range("fsdp::chunk_cat", cat="cpu_op"):
                self.mem(nbytes, "comm_buffers")  # reduce-scatter input
                self.launch(CHUNK_CAT, STREAM_COMPUTE, int(nbytes / COPY_BYTES_PER_NS) + 2_000, fsdp_copy=True)
                # the unsharded gradients, freed block by block as autograd made them
                pieces = self.grad_pieces.pop(unit, [])
                for piece in pieces:
                    self.mem(-piece, "unsharded_grads")
                if nbytes != sum(pieces):
                    self.mem(sum(pieces) - nbytes, "unsharded_grads")
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
                        issue, start, end = self.launch(NCCL_AR, STREAM_ALL_REDUCE,
                                                        self.comm_ns(shard_bytes, sc.hsdp_replicas),
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
            self.mem(-rs_bytes, "comm_buffers")

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
        first = last = launched = None
        with self.range("Optimizer.step#AdamW.step"):
            for k in range(n):
                with self.range("aten::_fused_adamw_", cat="cpu_op"):
                    t_launch, start, end = self.launch(ADAM, STREAM_COMPUTE, self.sc.optimizer_ns // n)
                first = start if first is None else first
                launched = t_launch if launched is None else launched
                last = end
        self.span("", "optimizer", "compute", ("gpu", STREAM_COMPUTE), first, last, launched)
        with self.range("Optimizer.zero_grad#AdamW.zero_grad"):
            pass

    def run_step(self, step: int) -> None:
        sc = self.sc
        self.step = step
        delay: Any = sc.data_ns
        if self.vec and sc.step_delay_ns:
            delay = sc.data_ns + np.array([sc.step_delay_ns.get(r, 0) for r in range(self.n)], dtype=np.int64)
        delay = delay + sc.step_data_ns.get(step, 0)
        self._step_gpu = [None, None]
        self._step_ext = self._ext + 1
        with self.range(f"ProfilerStep#{step}") as r:
            for micro in range(sc.micro_batches):
                self.micro = micro
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
