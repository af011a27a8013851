"""Per-unit markers for FSDP2, FSDP1 and DeepSpeed ZeRO-3: timers, and trace labels where missing.

Each framework has a few calls that bracket a unit's forward, backward, parameter gather and
gradient reduction. This module wraps exactly those calls -- on the framework's *instances*
(FSDP2 parameter groups, DeepSpeed's offload manager, coordinator and optimizer) or, for FSDP1,
on the functions of ``torch.distributed.fsdp._runtime_utils`` -- and reports to the agent. The
wrappers call the original with the same arguments and return its result unchanged; ``remove()``
puts everything back. Outside the steps that need them (``observer.py``: the first step, the profiled
and the unit-timed steps) every wrapper passes the call straight through after one flag check.

Trace labels (``record_function`` ranges, only while the profiler records):
- FSDP2 labels its units itself (``FSDP::pre_forward (blocks.0)``, ...): nothing is added.
- FSDP1 and ZeRO-3 carry no unit names, so fsdpviz adds ``fsdpviz::forward (fqn)``,
  ``fsdpviz::backward (fqn)``, ``fsdpviz::all_gather (fqn)`` and ``fsdpviz::reduce_scatter (fqn)``
  (ZeRO-3 gathers and reduces several units at once: then ``(fqn1, fqn2, ...)``).
- ZeRO-3 also: ``fsdpviz::fetch (fqn)`` / ``fsdpviz::release (fqn)`` around DeepSpeed's parameter
  fetch and release for a module, and ``fsdpviz::engine_forward`` / ``engine_backward`` /
  ``engine_step`` around the engine's own calls, so that DeepSpeed's work outside the units reads
  as framework (or optimizer) work rather than as nobody's.
See docs/recording.md, "Labels fsdpviz adds".
"""

from __future__ import annotations

import functools
import importlib
import sys
from collections.abc import Callable, Iterable
from typing import Any, Final

from fsdpviz.record.timers import KIND_ALL_GATHER, KIND_REDUCE_SCATTER
from fsdpviz.record.units import (
    ROOT_UNIT,
    Unit,
    build_fsdp1_units,
    build_fsdp2_units,
    build_zero3_units,
)

LABEL_PREFIX: Final = "fsdpviz::"
FETCH: Final = "fetch"
RELEASE: Final = "release"
ENGINE_CALLS: Final = ("forward", "backward", "step")  # DeepSpeed engine calls labelled engine_<call>


def unit_label(kind: str, units: Iterable[str]) -> str:
    """``fsdpviz::<kind> (<fqn>[, <fqn>...])`` -- the label format the analysis parses."""
    return f"{LABEL_PREFIX}{kind} ({', '.join(units)})"


# Where FSDP2 lives: ``torch.distributed.fsdp._fully_shard`` from torch 2.6, before it
# ``torch.distributed._composable.fsdp`` (whose ``fully_shard`` module 2.6+ keeps as an alias).
FSDP2_PACKAGES: Final = (
    ("torch.distributed.fsdp._fully_shard", "_fully_shard"),
    ("torch.distributed._composable.fsdp", "fully_shard"),
)


def _fsdp2_package(module: Any) -> str | None:
    """The package of the FSDP2 that sharded ``module``, None when it is no FSDP2 module."""
    for package, api in FSDP2_PACKAGES:
        fsdp2 = sys.modules.get(f"{package}.{api}")
        if fsdp2 is not None and isinstance(module, getattr(fsdp2, "FSDPModule", ())):
            return package
    return None


def detect_framework(module: Any) -> str | None:
    """The framework of a sharded root, or None for any other module. Imports nothing new."""
    mods = sys.modules
    if _fsdp2_package(module) is not None:
        return "fsdp2"
    fsdp1 = mods.get("torch.distributed.fsdp.fully_sharded_data_parallel")
    if fsdp1 is not None and isinstance(module, fsdp1.FullyShardedDataParallel):
        return "fsdp1"
    ds_engine = mods.get("deepspeed.runtime.engine")
    if ds_engine is not None and isinstance(module, ds_engine.DeepSpeedEngine):
        return "zero3" if module.zero_optimization_stage() == 3 else "unknown"
    ddp = mods.get("torch.nn.parallel.distributed")
    if ddp is not None and isinstance(module, ddp.DistributedDataParallel):
        return "ddp"  # replicated, not sharded: whole-step recording, no units
    return None


def build_units(framework: str, root: Any) -> list[Unit]:
    builders: dict[str, Callable[[Any], list[Unit]]] = {
        "fsdp2": build_fsdp2_units, "fsdp1": build_fsdp1_units, "zero3": build_zero3_units,
    }
    return builders[framework](root) if framework in builders else []


def instrument(framework: str, agent: Any, root: Any, units: list[Unit]) -> _Instrumentation | None:
    classes = {"fsdp2": Fsdp2Instrumentation, "fsdp1": Fsdp1Instrumentation, "zero3": Zero3Instrumentation}
    if framework not in classes:
        return None
    return classes[framework](agent, root, units)


class _Instrumentation:
    """Keeps every wrapper it installs so that :meth:`remove` can undo them."""

    def __init__(self, agent: Any) -> None:
        self.agent = agent
        self.observer = agent.observer
        self._undo: list[Callable[[], None]] = []

    def _wrap(self, owner: Any, name: str, make: Callable[[Callable[..., Any]], Callable[..., Any]]) -> None:
        """Replace ``owner.name`` by ``make(original)``; instances get an instance attribute."""
        original = getattr(owner, name)
        wrapper = functools.wraps(original)(make(original))
        is_module = isinstance(owner, type(sys))
        setattr(owner, name, wrapper)
        if is_module:
            self._undo.append(lambda: setattr(owner, name, original))
        else:
            self._undo.append(lambda: owner.__dict__.pop(name, None))

    def _comm(self, original: Callable[..., Any], unit_of: Callable[..., str | None], kind: str,
              labelled: bool, timer_unit: str | None = None, label_kind: str | None = None) -> Callable[..., Any]:
        """Wrap a gather or reduction: timed for ``unit_of(args)`` (or ``timer_unit``), labelled if asked.

        ``unit_of`` may return several units as ``"a, b"`` (ZeRO-3 buckets): they go into the label,
        while the timer then needs ``timer_unit`` ("" = the whole step). The label says ``label_kind``
        (default: the timer's ``kind``).
        """
        agent, observer = self.agent, self.observer

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if not observer.active:
                observer.passes += 1
                return original(*args, **kwargs)
            unit = unit_of(*args, **kwargs)
            if unit is None:
                return original(*args, **kwargs)
            label = unit_label(label_kind or kind, unit.split(", ")) if labelled and unit else None
            token = agent.begin_comm(unit if timer_unit is None else timer_unit, kind, label)
            try:
                return original(*args, **kwargs)
            finally:
                agent.end_comm(token)

        return wrapper

    def _ranged(self, original: Callable[..., Any], label_of: Callable[..., str | None]) -> Callable[..., Any]:
        """Wrap a call in the trace range ``label_of(args)`` (none when it returns None)."""
        agent, observer = self.agent, self.observer

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if not observer.active:
                observer.passes += 1
                return original(*args, **kwargs)
            label = label_of(*args, **kwargs)
            rng = agent.enter_range(label) if label else None
            try:
                return original(*args, **kwargs)
            finally:
                if rng is not None:
                    agent.exit_range(rng)

        return wrapper

    def entered_root_forward(self, root: Any) -> None:
        """The agent started inside the root's first forward, after its pre-hooks were collected."""

    def remove(self) -> None:
        while self._undo:
            self._undo.pop()()


class Fsdp2Instrumentation(_Instrumentation):
    """Timers from FSDP2's parameter-group calls; FSDP2's own labels name the units in traces."""

    def __init__(self, agent: Any, root: Any, units: list[Unit]) -> None:
        super().__init__(agent)
        package = _fsdp2_package(root) or FSDP2_PACKAGES[0][0]
        _fsdp_param_group = importlib.import_module(f"{package}._fsdp_param_group")
        self._reducing: str | None = None
        for unit in units:
            self._wrap_group(unit.key, unit.unit)
        self._wrap(_fsdp_param_group, "foreach_reduce",
                   lambda orig: self._comm(orig, lambda *a, **k: self._reducing, KIND_REDUCE_SCATTER, False))

    def _wrap_group(self, group: Any, name: str) -> None:
        agent, observer = self.agent, self.observer

        def pre_forward(orig: Callable[..., Any]) -> Callable[..., Any]:
            def wrapper(*args: Any, **kwargs: Any) -> Any:
                if not observer.active:
                    observer.passes += 1
                    return orig(*args, **kwargs)
                agent.open_unit(name, "forward", None)
                return orig(*args, **kwargs)
            return wrapper

        def post_forward(orig: Callable[..., Any]) -> Callable[..., Any]:
            def wrapper(*args: Any, **kwargs: Any) -> Any:
                if not observer.active:
                    observer.passes += 1
                    return orig(*args, **kwargs)
                result = orig(*args, **kwargs)
                agent.close_unit(name, "forward")
                return result
            return wrapper

        def pre_backward(orig: Callable[..., Any]) -> Callable[..., Any]:
            def wrapper(*args: Any, **kwargs: Any) -> Any:
                if not observer.active:
                    observer.passes += 1
                    agent.pass_backward()  # the step's backward phase, once
                    return orig(*args, **kwargs)
                agent.enter_backward()
                agent.open_unit(name, "backward", None)
                agent.queue_backward_end()  # after FSDP2's root_post_backward_callback
                return orig(*args, **kwargs)
            return wrapper

        def post_backward(orig: Callable[..., Any]) -> Callable[..., Any]:
            def wrapper(*args: Any, **kwargs: Any) -> Any:
                if not observer.active:
                    observer.passes += 1
                    return orig(*args, **kwargs)
                self._reducing = name
                try:
                    return orig(*args, **kwargs)
                finally:
                    self._reducing = None
                    agent.close_unit(name, "backward")
            return wrapper

        self._wrap(group, "pre_forward", pre_forward)
        self._wrap(group, "post_forward", post_forward)
        self._wrap(group, "pre_backward", pre_backward)
        self._wrap(group, "post_backward", post_backward)
        for method in ("unshard", "wait_for_unshard"):
            self._wrap(group, method, lambda orig: self._comm(orig, lambda *a, **k: name, KIND_ALL_GATHER, False))


class Fsdp1Instrumentation(_Instrumentation):
    """FSDP1: module hooks for forward, ``_runtime_utils`` wrappers for the rest, plus labels."""

    def __init__(self, agent: Any, root: Any, units: list[Unit]) -> None:
        super().__init__(agent)
        from torch.distributed.fsdp import _runtime_utils

        agent = self.agent
        self._names = {id(unit.key): unit.unit for unit in units}  # FlatParamHandle -> unit
        self._forward_hooks: dict[int, Callable[..., None]] = {}
        for unit in units:
            self._hook_forward(unit.modules[0], unit.unit)
        name_of_handle = self._names.get

        def gathering(state: Any, handle: Any, *args: Any, **kwargs: Any) -> str | None:
            # FSDP1 calls _unshard also for handles already unsharded (e.g. the root in backward)
            return name_of_handle(id(handle)) if handle is not None and handle.needs_unshard() else None

        self._wrap(_runtime_utils, "_unshard", lambda orig: self._comm(orig, gathering, KIND_ALL_GATHER, True))
        self._wrap(_runtime_utils, "_reduce_grad", lambda orig: self._comm(
            orig, lambda state, handle, *a, **k: name_of_handle(id(handle)), KIND_REDUCE_SCATTER, True))

        observer = self.observer

        def pre_backward_hook(orig: Callable[..., Any]) -> Callable[..., Any]:
            def wrapper(state: Any, module: Any, handle: Any, *args: Any) -> Any:
                if not observer.active:
                    observer.passes += 1
                    entered = agent.pass_backward(queue=False)  # the step's backward phase, once
                    result = orig(state, module, handle, *args)
                    if entered:
                        agent.queue_backward_end()  # after FSDP1's _post_backward_final_callback
                    return result
                name = name_of_handle(id(handle))
                if name is not None and not getattr(handle, "_ran_pre_backward_hook", False):
                    agent.enter_backward()
                    agent.open_unit(name, "backward", unit_label("backward", [name]))
                result = orig(state, module, handle, *args)
                agent.queue_backward_end()  # after FSDP1's _post_backward_final_callback
                return result
            return wrapper

        def post_backward_hook(orig: Callable[..., Any]) -> Callable[..., Any]:
            def wrapper(state: Any, handle: Any, *args: Any) -> Any:
                if not observer.active:
                    observer.passes += 1
                    return orig(state, handle, *args)
                try:
                    return orig(state, handle, *args)
                finally:
                    name = name_of_handle(id(handle))
                    if name is not None:
                        agent.close_unit(name, "backward")
            return wrapper

        self._wrap(_runtime_utils, "_pre_backward_hook", pre_backward_hook)
        self._wrap(_runtime_utils, "_post_backward_hook", post_backward_hook)

    def _hook_forward(self, module: Any, name: str) -> None:
        agent, observer = self.agent, self.observer
        label = unit_label("forward", [name])

        def pre(mod: Any, args: Any) -> None:
            if not observer.active:
                observer.passes += 1
                return
            agent.open_unit(name, "forward", label)

        def post(mod: Any, args: Any, output: Any) -> None:
            if not observer.active:
                observer.passes += 1
                return
            agent.close_unit(name, "forward")

        # prepend: before FSDP's own pre-forward work would run in hooks; FSDP1 does it in forward()
        pre_handle = module.register_forward_pre_hook(pre, prepend=True)
        post_handle = module.register_forward_hook(post)
        self._forward_hooks[id(module)] = pre
        self._undo.append(pre_handle.remove)
        self._undo.append(post_handle.remove)

    def entered_root_forward(self, root: Any) -> None:
        hook = self._forward_hooks.get(id(root))
        if hook is not None:
            hook(root, ())


class Zero3Instrumentation(_Instrumentation):
    """ZeRO-3: wrappers on the engine's offload manager, parameter coordinator and optimizer."""

    def __init__(self, agent: Any, engine: Any, units: list[Unit]) -> None:
        super().__init__(agent)
        from deepspeed.utils.z3_leaf_module import z3_leaf_module

        optimizer = engine.optimizer
        offload = optimizer.parameter_offload
        coordinator = offload.get_param_coordinator()
        names = {id(unit.key): unit.unit for unit in units}  # module -> unit
        param_units: dict[int, str] = {}
        for unit in units:
            module = unit.key
            for param in module.parameters(recurse=z3_leaf_module(module)):
                param_units[id(param)] = unit.unit

        module_order = {unit.unit: i for i, unit in enumerate(units)}
        observer = self.observer

        def units_of(params: Iterable[Any], *, sort: bool = False) -> str:
            found = [name for name in dict.fromkeys(param_units.get(id(p), "") for p in params) if name]
            if sort:  # a set of parameters: list its units in module order
                found.sort(key=module_order.__getitem__)
            return ", ".join(found) or ROOT_UNIT

        def phase_wrapper(phase: str, start: bool) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
            def make(orig: Callable[..., Any]) -> Callable[..., Any]:
                def wrapper(sub_module: Any, *args: Any, **kwargs: Any) -> Any:
                    if not observer.active:
                        observer.passes += 1
                        if phase == "backward" and start:
                            agent.pass_backward()  # the step's backward phase, once
                        return orig(sub_module, *args, **kwargs)
                    name = names.get(id(sub_module))
                    if name is None:
                        return orig(sub_module, *args, **kwargs)
                    if not start:
                        try:
                            return orig(sub_module, *args, **kwargs)
                        finally:
                            agent.close_unit(name, phase)
                    if phase == "backward":
                        agent.enter_backward()
                        agent.queue_backward_end()
                    agent.open_unit(name, phase, unit_label(phase, [name]))
                    return orig(sub_module, *args, **kwargs)
                return wrapper
            return make

        agent = self.agent
        self._wrap(offload, "pre_sub_module_forward_function", phase_wrapper("forward", True))
        self._wrap(offload, "post_sub_module_forward_function", phase_wrapper("forward", False))
        self._wrap(offload, "pre_sub_module_backward_function", phase_wrapper("backward", True))
        self._wrap(offload, "post_sub_module_backward_function", phase_wrapper("backward", False))
        # The whole fetch (gather, wait, prefetch issue) counts for the unit being fetched, as its
        # all_gather timer and as framework work in traces; so does the release after its pass.
        self._wrap(coordinator, "fetch_sub_module", lambda orig: self._comm(
            orig, lambda sub_module, *a, **k: names.get(id(sub_module)), KIND_ALL_GATHER, True, label_kind=FETCH))
        release_labels = {id(unit.key): unit_label(RELEASE, [unit.unit]) for unit in units}
        self._wrap(coordinator, "release_sub_module", lambda orig: self._ranged(
            orig, lambda sub_module, *a, **k: release_labels.get(id(sub_module))))
        for method in ENGINE_CALLS:
            self._wrap(engine, method, functools.partial(self._engine_call, method=method))
        # Label: each gather DeepSpeed issues, named by the units whose parameters it carries.
        gather = "_PartitionedParameterCoordinator__all_gather_params"
        if hasattr(coordinator, gather):
            self._wrap(coordinator, gather, lambda orig: self._comm(
                orig, lambda params, *a, **k: units_of(params, sort=True), KIND_ALL_GATHER, True, timer_unit=""))
        reduce = "_DeepSpeedZeroOptimizer_Stage3__reduce_and_partition_ipg_grads"
        if hasattr(optimizer, reduce):
            def bucket_units(communication_data_type: Any = None, *a: Any, **k: Any) -> str:
                buckets = getattr(optimizer, "ipg_buckets", {})
                bucket = buckets.get(communication_data_type) if isinstance(buckets, dict) else None
                return units_of(bucket.params) if bucket is not None and bucket.params else ""
            self._wrap(optimizer, reduce, lambda orig: self._comm(
                orig, bucket_units, KIND_REDUCE_SCATTER, True, timer_unit=""))

    def _engine_call(self, original: Callable[..., Any], method: str) -> Callable[..., Any]:
        """``fsdpviz::engine_<method>`` around a DeepSpeed engine call. ``engine.step`` runs code
        after the torch optimizer's step (copying updated partitions, zeroing gradients): the
        training step ends when ``engine.step`` returns, not when the optimizer step hook fires."""
        agent = self.agent
        label = f"{LABEL_PREFIX}engine_{method}"
        holds = method == "step"

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if holds:
                agent.hold_step_end()
            rng = agent.enter_range(label)
            done = False
            try:
                result = original(*args, **kwargs)
                done = True
                return result
            finally:
                if rng is not None:
                    agent.exit_range(rng)  # before the step ends: the range stays inside its step
                if holds:
                    agent.release_step_end(end_step=done)

        return wrapper
