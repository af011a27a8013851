"""The rank-side agent: finds the sharded model, drives torch.profiler by optimizer steps, keeps timers.

Armed in each candidate process right after ``import torch`` (see ``activation.py``). Until the
first forward of a sharded root it costs one global forward pre-hook, which returns at once for
module types it has already seen. At that forward it:

1. names the framework (FSDP2 ``FSDPModule``, FSDP1 ``FullyShardedDataParallel``, a DeepSpeed
   engine with ZeRO stage 3) and removes the detection hook;
2. builds the unit table (``units.py``) and instruments the framework (``instrument.py``);
   the wrappers work only in the steps that need them (``observer.py``): the first step (the units'
   order), the profiled steps (trace labels) and the unit-timed steps; in the clean steps every
   wrapped call passes straight through;
3. starts torch.profiler with a schedule that global optimizer step hooks advance
   (``profiling.py``, ``schedule.py``);
4. registers flushing at exit, on uncaught exceptions and on SIGTERM (``rankfacts.py``).

Step N runs from the end of optimizer step N-1 (or the first forward) to the end of optimizer step
N; several optimizer steps with no forward between them (several optimizers, DeepSpeed's
sub-groups) end one step. Outputs: ``traces/rank{R}.trace.json.gz``, ``timers/rank{R}.jsonl`` and
``ranks/rank{R}.json`` (facts the launcher merges into run.json), each written under a temporary
name and renamed when complete.

Nothing the script can read is changed: the peak-memory counters are read, never reset
(``clock.py``), and once the agent records, the ``FSDPVIZ_*`` variables and the bootstrap's
``PYTHONPATH`` entry leave the process's environment (``environment.leave_environment``).
"""

from __future__ import annotations

import functools
import os
import socket
import sys
import time
from collections.abc import Callable
from typing import Any

import torch

from fsdpviz.record.clock import StepClock
from fsdpviz.record.environment import launch_environment, leave_environment
from fsdpviz.record.groups import GroupLabels
from fsdpviz.record.memory import MemoryProbe
from fsdpviz.record.observer import Observer, pass_through_ns
from fsdpviz.record.options import ENV_OWNER_PID, RecordOptions, options_from_env
from fsdpviz.record.profiling import ProfilerDriver
from fsdpviz.record.rankfacts import ExitHooks, now_iso, usable_cpus, versions, write_json_atomic
from fsdpviz.record.schedule import unit_timed_steps
from fsdpviz.record.timers import KIND_TOTAL, PHASE_STEP, WHOLE_STEP, Interval, TimersWriter
from fsdpviz.record.units import Unit, assign_order, refresh_fsdp2_settings
from fsdpviz.runfolder import RANK_FILE, SCHEDULE_OPTIMIZER_STEPS, TIMERS_FILE, clean_steps, rank_path

_AGENT: Agent | None = None
_RECOMPUTE = "recompute"  # key of a unit's forward recomputed inside backward (activation checkpointing)


def arm(role: str) -> None:
    """Create this process's agent (once) and install its detection hooks."""
    global _AGENT
    options = options_from_env(launch_environment())
    if _AGENT is None and options is not None:
        _AGENT = Agent(options, role)
        _AGENT.arm()


def current() -> Agent | None:
    """The agent of this process, if any (tests and the instrumentation use it)."""
    return _AGENT


class Agent:
    """Recording state of one process. All hooks return at once unless this process records."""

    def __init__(self, options: RecordOptions, role: str) -> None:
        self.options = options
        self.role = role
        self.pid = os.getpid()
        self.rank = int(os.environ.get("RANK", "0") or 0)
        self.recording = False
        self.finished = False
        self.framework = "unknown"
        self.root: Any = None
        self.units: list[Unit] = []
        self.instrumentation: Any = None
        self.step = 0
        self.phase = "idle"  # idle -> forward -> backward -> optimizer -> (step end) idle
        self._plain_types: set[type] = set()
        self._detect_handle: Any = None
        self._hooks: list[Any] = []
        self._first_seen: list[str] = []
        self._open: dict[tuple[str, str], tuple[Interval | None, Any]] = {}
        self._comm_depth = 0
        self._backward_callback_queued = False
        self._step_holds = 0  # inside the framework's own optimizer call (DeepSpeed engine.step)
        self._step_end_pending = False
        self.clock = StepClock()
        self._step_start: Interval | None = None
        self._whole: dict[str, Interval | None] = {}  # None: timers are off
        self._use_cuda_events = False
        self.profiler = ProfilerDriver(options)
        self._exit_hooks = ExitHooks(self.finish)
        self._forwards = 0
        self._optimizer_stepped = False
        self._detect_time = 0.0
        self._start_time = ""
        self._order_assigned = False
        self._world_size = int(os.environ.get("WORLD_SIZE", "1") or 1)
        self._backend = ""
        self.memory = MemoryProbe()
        self.observer = Observer()
        self.groups = GroupLabels(self.enter_range, self.observer)
        self._unit_timed = set(unit_timed_steps(options.warmup, options.steps, options.unit_timer_steps)
                               if options.timers else ())
        self._unit_timed_done: list[int] = []
        self._phase_timing = False

    # --- arming and detection ------------------------------------------------------------------
    def arm(self) -> None:
        from torch.nn.modules import module as nn_module
        from torch.optim import optimizer as optim_module

        self._detect_handle = nn_module.register_module_forward_pre_hook(self._on_any_forward)
        self._hooks.append(optim_module.register_optimizer_step_pre_hook(self._on_optimizer_pre))
        self._hooks.append(optim_module.register_optimizer_step_post_hook(self._on_optimizer_post))
        try:
            self.groups.install()  # before the script creates its process groups
        except Exception as exc:  # noqa: BLE001 - an unexpected torch: record without group labels
            self._warn(f"could not label process groups: {exc!r}")
        os.register_at_fork(after_in_child=self._disable_in_forked_child)

    def _disable_in_forked_child(self) -> None:
        # A forked dataloader worker inherits this object: it must neither record nor flush.
        self.finished = True
        self.recording = False
        self.pid = -1

    def _on_any_forward(self, module: torch.nn.Module, args: Any) -> None:
        if self.recording or self.finished or type(module) in self._plain_types:
            return
        from fsdpviz.record.instrument import detect_framework

        framework = detect_framework(module)
        if framework is None:
            self._plain_types.add(type(module))
            return
        self._start(framework, module)

    def _start(self, framework: str, root: Any) -> None:
        from fsdpviz.record.instrument import build_units, instrument

        self.recording = True
        if self._detect_handle is not None:
            self._detect_handle.remove()  # safe: the caller iterates over a copy of the hooks
            self._detect_handle = None
        os.environ[ENV_OWNER_PID] = str(self.pid)  # processes started from now on don't record
        dist = torch.distributed
        if dist.is_available() and dist.is_initialized():  # read now: scripts destroy the group at the end
            self.rank = dist.get_rank()
            self._world_size = dist.get_world_size()
            self._backend = str(dist.get_backend())
        self.framework = framework
        self.root = root
        self._detect_time = time.monotonic()
        self._start_time = now_iso()
        self._use_cuda_events = torch.cuda.is_available() and torch.cuda.is_initialized()
        try:
            self.units = build_units(framework, root) if root is not None else []
        except Exception as exc:  # noqa: BLE001 - an unexpected framework version: record without units
            self._warn(f"could not read the {framework} units: {exc!r}")
            self.units = []
        writer = TimersWriter(rank_path(self.options.run_dir, TIMERS_FILE, self.rank)) if self.options.timers else None
        self.clock.start(writer, rank=self.rank, step=self.step, memory=self.options.memory,
                         use_cuda=self._use_cuda_events)
        self.observer.pass_ns = pass_through_ns()
        if root is not None:
            try:
                self.instrumentation = instrument(framework, self, root, self.units)
            except Exception as exc:  # noqa: BLE001 - same: the run must go on
                self._warn(f"could not instrument {framework}; traces keep only its own labels: {exc!r}")
            # after the instrumentation's, so that, prepended, the step's forward begins before the root
            # unit's hook opens its forward (FSDP1): a later micro-batch's forward is then not taken for
            # a recomputation inside the backward before it
            self._hooks.append(root.register_forward_pre_hook(self._on_root_forward_pre, prepend=True))
            self._hooks.append(root.register_forward_hook(self._on_root_forward_post))
        if self.options.profile:
            self.groups.name_workers()  # before the profiler meets the gloo threads: they name their group
            self.profiler.start(self.rank, self.step)
            self._measure_trace_start()
        self._exit_hooks.install()
        self._write_rank_file(status="running")
        leave_environment()  # a candidate's children no longer need it: from now on they do not record
        self._begin_step()
        self._step_start = self.clock.mark(WHOLE_STEP, PHASE_STEP, KIND_TOTAL)
        if root is not None:  # this forward's pre-hooks were collected before ours existed
            self._on_root_forward_pre(root, ())
            if self.instrumentation is not None:
                self.instrumentation.entered_root_forward(root)

    # --- step structure ------------------------------------------------------------------------
    def _begin_step(self) -> None:
        """Set what the recorder does in the step that begins now (``observer.py``): the unit-timed
        steps time units and phases; the profiled steps label, and time units too (they may cost: the
        trace's per-unit figures can then be checked against the timers of the same step); the first step
        notes the units' order. Every other step is clean: its wrapped calls pass straight through."""
        observer = self.observer
        observer.labels = self.profiler.labels_on
        by_steps = not self.profiler.time_window and self.profiler.schedule_kind == SCHEDULE_OPTIMIZER_STEPS
        dedicated = by_steps and self.step in self._unit_timed
        if dedicated:
            self._unit_timed_done.append(self.step)
        observer.unit_timing = dedicated or (by_steps and observer.labels and self.options.timers)
        observer.active = observer.labels or observer.unit_timing or not self._order_assigned
        # every CPU step times its phases: three host timestamps, and in a clean step they are what checks
        # where the profiler's share came out (replay/phases.py) on the run's own clock. On a GPU a phase
        # is a CUDA event pair, and a clean step holds one (its ends): there only the profiled and the
        # unit-timed steps time phases. Not before an optimizer has stepped: a script that never steps
        # one stays in its first step, whose marks would pile up
        self._phase_timing = (by_steps and self.options.timers and self._optimizer_stepped
                              and (observer.unit_timing or not self._use_cuda_events))

    def _mark_phase(self, phase: str) -> Interval | None:
        """A whole-step phase interval (forward, backward, optimizer), in every step the timers clock by
        optimizer steps (a GPU's clean steps excepted: :meth:`_begin_step`): a clean CPU step marks its
        ends and its phases, nothing of its units."""
        return self.clock.mark(WHOLE_STEP, phase, KIND_TOTAL) if self._phase_timing else None

    def _on_root_forward_pre(self, module: Any, args: Any) -> None:
        if not self.recording or self.finished:
            return
        started = time.perf_counter_ns()
        self._forwards += 1
        if self.profiler.time_window or not self._optimizer_stepped:
            self.profiler.check_time_window(optimizer_stepped=self._optimizer_stepped, forwards=self._forwards,
                                            elapsed_s=time.monotonic() - self._detect_time)
            self.observer.labels = self.profiler.labels_on
            self.observer.active = self.observer.active or self.observer.labels
            if self.profiler.time_window and self.profiler.prof is None:  # the window's trace is written
                self.groups.remove()
        if self.profiler.time_window and self.phase != "idle":
            self._end_step(advance_profiler=False, started_ns=started)  # without optimizer steps, a step is a forward
            started = time.perf_counter_ns()
        self.phase = "forward"
        self._whole["forward"] = self._mark_phase("forward")
        self.observer.add(started)

    def _on_root_forward_post(self, module: Any, args: Any, output: Any) -> None:
        started = time.perf_counter_ns()
        interval = self._whole.pop("forward", None)
        if interval is not None and not self.finished:
            self.clock.close(interval)
        self.observer.add(started)

    def enter_backward(self) -> None:
        """Called by the instrumentation from backward hooks: the step is now in backward."""
        if self.phase != "backward" and not self.finished:
            self.phase = "backward"
            self._whole["backward"] = self._mark_phase("backward")

    def pass_backward(self, *, queue: bool = True) -> bool:
        """A backward hook of a step whose wrapped calls pass straight through: the step enters its
        backward phase once (its mark, and with ``queue`` the autograd callback that ends it, else the
        caller queues it once the framework queued its own), on the agent's cost. Whether it entered."""
        if self.phase == "backward" or self.finished or not self._phase_timing:
            return False
        started = time.perf_counter_ns()
        self.enter_backward()
        self.observer.add(started)
        if queue:
            self.queue_backward_end()
        return True

    def queue_backward_end(self) -> None:
        """Called from a backward hook: close this backward's intervals when autograd finishes.

        Callbacks run in the order queued; the instrumentation calls this after the framework
        queued its own end-of-backward work, so that work counts as backward.
        """
        if not self._backward_callback_queued and not self.finished:
            started = time.perf_counter_ns()
            self._backward_callback_queued = True
            torch.autograd.Variable._execution_engine.queue_callback(self._on_backward_end)
            self.observer.add(started)

    def _on_backward_end(self) -> None:
        started = time.perf_counter_ns()
        self._backward_callback_queued = False
        if self.finished:
            return
        for key in [k for k in self._open if k[1] == _RECOMPUTE] + [k for k in self._open if k[1] == "backward"]:
            self.close_unit(*key)
        interval = self._whole.pop("backward", None)
        if interval is not None:
            self.clock.close(interval)
        self.observer.add(started)

    def _on_optimizer_pre(self, optimizer: Any, args: Any, kwargs: Any) -> tuple[Any, Any] | None:
        if self.finished:
            return None
        started = time.perf_counter_ns()
        self.memory.seen(optimizer)
        if not self.recording:
            # the first sharded forward may run in this call's closure (automatic optimization), where
            # recording begins: watched, step 0 ends with this call as every later step does (in a rank
            # or in a candidate such as Lightning's launcher, which becomes rank 0 by that forward)
            if os.getpid() == self.pid:
                return _with_closure_watched(args, kwargs, self._on_closure_returned)
            return None
        # a step given a closure runs the (last) forward and backward inside the call: its optimizer
        # phase begins when the closure returns, not here (where an earlier micro-batch's backward ended)
        calls = _with_closure_watched(args, kwargs, self._on_closure_returned)
        if calls is None:
            self._begin_optimizer_phase()
        self.observer.add(started)
        return calls

    def _begin_optimizer_phase(self) -> None:
        if self.phase in ("forward", "backward") or (self.root is None and self.phase == "idle"):
            if "optimizer" not in self._whole:  # a closure called again (LBFGS): one optimizer phase a step
                self._whole["optimizer"] = self._mark_phase("optimizer")
            self.phase = "optimizer"

    def _on_closure_returned(self) -> None:
        """The closure an optimizer step was given (``optimizer.step(closure)``: Lightning's automatic
        optimization) returned: its forward and backward ran inside the step, which now updates the
        parameters. The step's optimizer phase begins here, and the step ends with the call. An optimizer
        that calls its closure again (LBFGS) is timed from the first return, its later passes inside."""
        if self.finished or not self.recording:
            return
        started = time.perf_counter_ns()
        self._begin_optimizer_phase()
        self.observer.add(started)

    def _on_optimizer_post(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if self.finished:
            return
        started = time.perf_counter_ns()
        if not self.recording:
            if self.role == "rank" and os.getpid() == self.pid:
                self.step = 1  # step 0 ran before anything sharded was seen: record as "unknown"
                self._start("unknown", None)
                self._optimizer_stepped = True
            return
        # in the profiled steps only (record/memory.py): a clean step walks no optimizer state
        if self.profiler.labels_on and self.options.memory:
            try:
                self.memory.at_optimizer_step(optimizer, self._device(), self.step)
            except Exception as exc:  # noqa: BLE001 - a measurement must never stop the training
                self._warn(f"could not measure the optimizer's state: {exc!r}")
        if self.phase != "optimizer":
            self.observer.add(started)
            return
        self._optimizer_stepped = True
        if self._step_holds:
            self._step_end_pending = True  # the framework's optimizer call ends the step (release_step_end)
            self.observer.add(started)
            return
        self._end_optimizer_step(started)

    def hold_step_end(self) -> None:
        """The framework's own optimizer call began (DeepSpeed ``engine.step``, which keeps working
        after the torch optimizer's step): an optimizer step inside it ends the step at its end."""
        started = time.perf_counter_ns()
        self._step_holds += 1
        self.observer.add(started)

    def release_step_end(self, *, end_step: bool = True) -> None:
        """That call returned (``end_step``) or raised: end the step now if an optimizer stepped."""
        started = time.perf_counter_ns()
        self._step_holds = max(0, self._step_holds - 1)
        if not self._step_holds and self._step_end_pending:
            self._step_end_pending = False
            if end_step and not self.finished and self.phase == "optimizer":
                self._end_optimizer_step(started)
                return
        self.observer.add(started)

    def _end_optimizer_step(self, started_ns: int) -> None:
        interval = self._whole.pop("optimizer", None)
        if interval is not None:
            self.clock.close(interval)
        self._end_step(advance_profiler=not self.profiler.time_window, started_ns=started_ns)

    def _end_step(self, *, advance_profiler: bool, started_ns: int) -> None:
        """End the running step and begin the next. The agent's work here, from ``started_ns`` (the
        hook that ended the step) to the next step's first mark, counts as the ending step's."""
        if self._step_start is not None:
            self.clock.close(self._step_start)
        ending, times = self.step, self.clock.running
        if not self._order_assigned:
            assign_order(self.units, self._first_seen)
            if self.framework == "fsdp2":
                refresh_fsdp2_settings(self.units)  # after FSDP2's lazy init, which ran in this step
            self._order_assigned = True
        self.step += 1
        self.clock.end_step(self.step, hold=self.profiler.labels_on)  # written after the profiled steps
        self.phase = "idle"
        self.profiler.step_ended(ending)
        if advance_profiler:
            self.profiler.advance()  # may write the trace: between steps, not inside one
            self._measure_trace_start()
            if self.profiler.prof is None:  # the trace is written (or fsdpviz stood aside): done with groups
                self.groups.remove()
        self._begin_step()
        self.observer.add(started_ns)
        self.observer.end_step(ending, unit_intervals=times.unit_intervals(), cuda_events=times.cuda_events)
        self._step_start = self.clock.mark(WHOLE_STEP, PHASE_STEP, KIND_TOTAL)

    def _device(self) -> str:
        return "cuda" if self._use_cuda_events else "cpu"

    def _measure_trace_start(self) -> None:
        """The profiler records from now on: measure what it cannot see (record/memory.py)."""
        if self.profiler.labels_on and self.options.memory:
            try:
                self.memory.at_trace_start(self.framework, self.root, self._device(), self.step)
            except Exception as exc:  # noqa: BLE001 - a measurement must never stop the training
                self._warn(f"could not measure the memory at the trace start: {exc!r}")

    # --- the instrumentation's interface -------------------------------------------------------
    def open_unit(self, unit: str, phase: str, label: str | None) -> None:
        """Start ``unit``'s interval of ``phase`` (and its trace range); a no-op if already open.

        A forward during backward is activation-checkpoint recomputation: its trace range marks it,
        but its time already counts in the unit's backward interval, so it gets no timer of its own.
        Non-reentrant checkpointing may stop recomputing before the forward returns (the post-hook
        never runs): the range then closes with the unit's backward, never with a later forward.
        """
        if self.finished:
            return
        if phase == "forward" and self.phase == "backward":
            if (unit, _RECOMPUTE) not in self._open:
                self._open[(unit, _RECOMPUTE)] = (None, self.enter_range(label) if label else None)
            return
        if (unit, phase) in self._open:
            return
        if phase == "forward" and not self._order_assigned:
            self._first_seen.append(unit)
        rng = self.enter_range(label) if label else None
        interval = self.clock.mark(unit, phase, KIND_TOTAL) if self.observer.unit_timing else None
        self._open[(unit, phase)] = (interval, rng)

    def close_unit(self, unit: str, phase: str) -> None:
        if phase in ("forward", "backward") and (unit, _RECOMPUTE) in self._open:
            self.close_unit(unit, _RECOMPUTE)  # the recomputed forward ended, or its unit's backward did
            if phase == "forward":
                return
        entry = self._open.pop((unit, phase), None)
        if entry is None:
            return
        interval, rng = entry
        if interval is not None:
            self.clock.close(interval)
        if rng is not None:
            self.exit_range(rng)

    def begin_comm(self, unit: str, kind: str, label: str | None) -> tuple[Interval | None, Any]:
        """Start timing a gather or reduction (outermost only) and its trace range."""
        self._comm_depth += 1
        timed = self._comm_depth == 1 and self.observer.unit_timing
        interval = self.clock.mark(unit, self.phase_for_comm(), kind) if timed else None
        return interval, self.enter_range(label) if label else None

    def end_comm(self, token: tuple[Interval | None, Any]) -> None:
        self._comm_depth -= 1
        interval, rng = token
        if rng is not None:
            self.exit_range(rng)
        if interval is not None:
            self.clock.close(interval)

    def phase_for_comm(self) -> str:
        return "backward" if self.phase == "backward" else "forward"

    def enter_range(self, label: str) -> Any:
        return self.profiler.enter_range(label)

    def exit_range(self, rng: Any) -> None:
        rng.__exit__(None, None, None)

    # --- exit ----------------------------------------------------------------------------------
    def finish(self, status: str, reason: str | None = None) -> None:
        """Write everything captured so far. Idempotent; safe from atexit and signal handlers."""
        if self.finished or os.getpid() != self.pid or not self.recording:
            return
        self.finished = True
        ignoring = self._exit_hooks.ignore_sigterm()
        try:
            partial = self.phase != "idle" or bool(self._open)
            if not self._order_assigned:
                assign_order(self.units, self._first_seen)
                if self.framework == "fsdp2":
                    refresh_fsdp2_settings(self.units)
            for key in list(self._open):
                self.close_unit(*key)
            for interval in list(self._whole.values()):
                self.clock.close(interval)
            if partial and self._step_start is not None:
                self.clock.close(self._step_start)
                self.clock.end_step(self.step + 1, partial=True)
            # exports the trace if a recorded step ran: this step too if it began
            self.profiler.finish(self.step + (1 if partial else 0), failed=status != "ok")
            self.clock.flush(block=True)
            self.clock.close_writer()
            self.clock.remove()
            self.groups.remove()
            if self.instrumentation is not None:
                self.instrumentation.remove()
            for hook in self._hooks:
                hook.remove()
            # A rank that fails or is stopped between two optimizer steps ended inside the next one
            # (its data loader or the top of its loop raised): the profiler already records it as a
            # step, which must not pass for a complete one.
            ended_inside = partial or (status != "ok" and self.step > 0)
            self._write_rank_file(status=status, reason=reason, partial_step=self.step if ended_inside else None)
        except Exception as exc:  # noqa: BLE001 - at exit or in a signal handler: report, never raise
            self._warn(f"could not write everything: {exc!r}")
        finally:
            if ignoring:
                self._exit_hooks.restore_sigterm()

    # --- facts for run.json --------------------------------------------------------------------
    def _write_rank_file(self, *, status: str, reason: str | None = None, partial_step: int | None = None) -> None:
        data = {
            "rank": self.rank,
            "local_rank": int(os.environ.get("LOCAL_RANK", "0") or 0),
            "world_size": self._world_size,
            "backend": self._backend,
            "host": socket.gethostname(),
            "pid": self.pid,
            "role": self.role,
            "framework": self.framework,
            "root": f"{type(self.root).__module__}.{type(self.root).__qualname__}" if self.root is not None else "",
            "device": "cuda" if self._use_cuda_events else "cpu",
            "units": [u.to_json() for u in sorted(self.units, key=lambda u: u.order)],
            "parallelism": self._parallelism(),
            "versions": versions(),
            "profile": self.profiler.facts(),
            "timers": {"file": TIMERS_FILE.format(rank=self.rank) if self.clock.steps_written else None,
                       "steps": self.clock.steps_written,
                       **({"error": self.clock.error} if self.clock.error else {})},
            "unit_timed_steps": list(self._unit_timed_done),
            "observer": self._observer_facts(partial_step),
            "steps_seen": self.step,
            "status": status,
            "reason": reason,
            "partial_step": partial_step,
            "start_time": self._start_time,
            "cpu_count": usable_cpus(),
            "memory": self.memory.facts(),
            "end_time": now_iso() if status != "running" else None,
        }
        try:
            write_json_atomic(rank_path(self.options.run_dir, RANK_FILE, self.rank), data)
        except OSError as exc:  # a full disk must not stop the training (the launcher notes the rank)
            self._warn(f"could not write {RANK_FILE.format(rank=self.rank)}: {exc}")

    def _observer_facts(self, partial_step: int | None) -> dict[str, Any] | None:
        """What the agent itself spent in the rank's clean steps (``observer.py``), or None."""
        profiled = sorted(self.profiler.recorded_steps)
        if not profiled or self.profiler.time_window:
            return None
        timed = sorted(self.clock.step_ms)
        clean = clean_steps(timed, profiled=profiled, unit_timed=self._unit_timed_done, partial=partial_step,
                            script_profiled=self.profiler.script_profiled)
        return self.observer.facts(clean, self.clock.step_ms)

    def _parallelism(self) -> dict[str, int | None] | None:
        """The FSDP mesh and TP degree, read from FSDP2's or FSDP1's own state (None for ZeRO-3)."""
        from fsdpviz.record.units import fsdp1_parallelism, fsdp2_parallelism

        readers = {"fsdp2": fsdp2_parallelism, "fsdp1": fsdp1_parallelism}
        try:
            return readers[self.framework](self.units) if self.framework in readers else None
        except (AttributeError, TypeError, RuntimeError):  # another torch's FSDP2 internals: unknown
            return None

    def _warn(self, message: str) -> None:
        print(f"fsdpviz: rank {self.rank}: {message}", file=sys.stderr, flush=True)


def _with_closure_watched(args: tuple[Any, ...], kwargs: dict[str, Any],
                          returned: Callable[[], None]) -> tuple[tuple[Any, ...], dict[str, Any]] | None:
    """``optimizer.step``'s arguments with its closure (``closure=`` or the first positional argument)
    calling ``returned`` after it returns, or None where the call has no closure. The closure's result
    and its exceptions pass through unchanged, so the optimizer sees what the script gave it."""
    keyword = "closure" in kwargs
    closure = kwargs["closure"] if keyword else (args[1] if len(args) > 1 else None)
    if not callable(closure):
        return None

    @functools.wraps(closure)  # a hook that reads the closure's name or attributes reads the script's
    def watched(*a: Any, **k: Any) -> Any:
        result = closure(*a, **k)
        returned()
        return result

    if keyword:
        return args, {**kwargs, "closure": watched}
    return (args[0], watched, *args[2:]), kwargs

