"""What a rank holds in memory, measured on its own tensors in the training process.

The CPU profiler's allocated level starts at 0 when the trace begins: a tensor made before is
invisible to it. So when the trace begins the recorder measures what is alive then -- the sharded
parameters, every optimizer's state (and ZeRO-3's fp32 master copy of the parameters, which its
optimizer steps on) and the gradients -- and at the next optimizer step which of
those gradients are still alive (``zero_grad(set_to_none=False)`` keeps them). After each recorded
optimizer step it also measures that optimizer's state. Only tensors on the rank's device count;
a DTensor counts its local shard. Nothing here allocates or runs an operator: it reads sizes.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable, Iterator
from typing import Any

import torch

from fsdpviz.runfolder import OptimizerMemory, TraceStartMemory


def local(tensor: Any) -> torch.Tensor | None:
    """The tensor a rank holds of ``tensor``: a DTensor's local shard, else the tensor itself."""
    if not isinstance(tensor, torch.Tensor):
        return None
    inner = getattr(tensor, "_local_tensor", None)  # DTensor: its shard, without to_local()'s operator
    return inner if isinstance(inner, torch.Tensor) else tensor


def nbytes(tensors: Iterable[Any], device: str) -> int:
    """Bytes of the distinct tensors among ``tensors`` (local shards) on ``device`` (a device type)."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for t in tensors:
        t = local(t)
        if t is None or t.device.type != device:
            continue
        key = (t.data_ptr(), t.numel())
        if key in seen or not t.numel():
            continue
        seen.add(key)
        total += t.numel() * t.element_size()
    return total


def optimizer_tensors(optimizer: Any) -> Iterator[Any]:
    """Every tensor in ``optimizer.state`` (any class, any number of states per parameter)."""
    for state in getattr(optimizer, "state", {}).values():
        if isinstance(state, dict):
            yield from (v for v in state.values() if isinstance(v, torch.Tensor))
        elif isinstance(state, torch.Tensor):
            yield state


def optimizer_memory(optimizer: Any, device: str, step: int) -> OptimizerMemory:
    """One optimizer's state on ``device`` now."""
    tensors = list(optimizer_tensors(optimizer))
    cls = type(optimizer)
    return OptimizerMemory(optimizer=f"{cls.__module__}.{cls.__qualname__}", state_bytes=nbytes(tensors, device),
                           state_tensors=len(tensors), params=len(getattr(optimizer, "state", {})), step=step)


def sharded_params(framework: str, root: Any) -> list[torch.Tensor] | None:
    """The parameter shards this rank holds between steps: FSDP2's DTensors (local shards), FSDP1's
    flat parameters (their local shards), ZeRO-3's ``ds_tensor`` partitions. None for another
    framework or when they cannot be read."""
    try:
        if framework == "fsdp2":
            return [p for p in root.parameters()]
        if framework == "fsdp1":
            from torch.distributed.fsdp import FullyShardedDataParallel

            shards = []
            for module in root.modules():
                handle = getattr(module, "_handle", None) if isinstance(module, FullyShardedDataParallel) else None
                if handle is not None:
                    flat = handle.flat_param
                    shards.append(getattr(flat, "_local_shard", flat))
            return shards
        if framework == "zero3":
            return [p.ds_tensor for p in root.module.parameters() if hasattr(p, "ds_tensor")]
    except (AttributeError, RuntimeError):
        return None
    return None


def master_params(framework: str, root: Any) -> list[torch.Tensor] | None:
    """ZeRO-3's fp32 partitioned copy of the parameters that its optimizer steps on (DeepSpeed's
    ``fp32_partitioned_groups_flat``, one flat tensor per parameter group); None for another
    framework or when it cannot be read."""
    if framework != "zero3":
        return None
    try:
        flat = getattr(root.optimizer, "fp32_partitioned_groups_flat", None)
    except AttributeError:
        return None
    return [t for t in flat if isinstance(t, torch.Tensor)] if isinstance(flat, list) else None


def zero3_gradient_partitions(framework: str, root: Any) -> list[torch.Tensor] | None:
    """ZeRO-3's gradient partitions: the flat buffer its stage-3 optimizer makes when it is built
    (DeepSpeed's ``grad_partitions_flat_buffer``: this rank's partition of every parameter's gradient,
    in the gradient accumulation dtype), which each backward's reductions fill in place and nothing
    frees. None for another framework, or a DeepSpeed without it (an offloaded optimizer's)."""
    if framework != "zero3":
        return None
    try:
        flat = getattr(root.optimizer, "grad_partitions_flat_buffer", None)
    except AttributeError:
        return None
    return [flat] if isinstance(flat, torch.Tensor) else None


def gradients(framework: str, root: Any) -> list[torch.Tensor] | None:
    """The gradients the parameters hold now (FSDP2: sharded DTensors; FSDP1: the flat parameters'
    sharded gradients); None for ZeRO-3, which keeps them in its own partitions
    (:func:`zero3_gradient_partitions`)."""
    try:
        if framework == "fsdp2":
            return [p.grad for p in root.parameters() if p.grad is not None]
        if framework == "fsdp1":
            from torch.distributed.fsdp import FullyShardedDataParallel

            return [m._handle.flat_param.grad for m in root.modules()
                    if isinstance(m, FullyShardedDataParallel) and m._handle is not None
                    and m._handle.flat_param.grad is not None]
    except (AttributeError, RuntimeError):
        return None
    return None


class MemoryProbe:
    """The measurements of one rank (see the module docstring)."""

    def __init__(self) -> None:
        self.optimizers: weakref.WeakSet[Any] = weakref.WeakSet()
        self.trace_start: TraceStartMemory | None = None
        self.after_step: dict[int, OptimizerMemory] = {}  # id(optimizer) -> its state after its last step
        self._grads: list[weakref.ref[torch.Tensor]] | None = None  # gradients alive at the trace start

    def seen(self, optimizer: Any) -> None:
        """An optimizer is about to step: it is measured from now on."""
        self.optimizers.add(optimizer)

    def at_trace_start(self, framework: str, root: Any, device: str, step: int) -> None:
        """The trace begins now: measure what is alive (once)."""
        if self.trace_start is not None:
            return
        params = sharded_params(framework, root) if root is not None else None
        grads = gradients(framework, root) if root is not None else None
        states = [t for o in list(self.optimizers) for t in optimizer_tensors(o)]
        masters = master_params(framework, root) if root is not None else None
        partitions = zero3_gradient_partitions(framework, root) if root is not None else None
        self.trace_start = TraceStartMemory(
            step=step, device=device, sharded_param_bytes=nbytes(params, device) if params is not None else None,
            optimizer_state_bytes=nbytes(states, device),
            master_param_bytes=nbytes(masters, device) if masters is not None else None,
            # ZeRO-3's partitions are kept by construction: made once, filled in place every step
            gradient_bytes_kept=nbytes(partitions, device) if partitions is not None else None)
        if grads is not None:
            self._grads = [weakref.ref(g) for g in grads]

    def at_optimizer_step(self, optimizer: Any, device: str, step: int) -> None:
        """``optimizer`` stepped: its state now; the first time after the trace start, also which
        of the gradients alive then are still alive."""
        self.after_step[id(optimizer)] = optimizer_memory(optimizer, device, step)
        if self._grads is not None and self.trace_start is not None:
            alive = [g for g in (ref() for ref in self._grads) if g is not None]
            self.trace_start.gradient_bytes_kept = nbytes(alive, device)
            self._grads = None

    def facts(self) -> dict[str, Any] | None:
        """run.json's ``ranks[].memory`` of this rank (None when nothing was measured)."""
        if self.trace_start is None and not self.after_step:
            return None
        import msgspec

        return {"trace_start": msgspec.to_builtins(self.trace_start) if self.trace_start is not None else None,
                "optimizers": [msgspec.to_builtins(o) for o in self.after_step.values()]}
