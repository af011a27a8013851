"""torch.profiler on a rank, driven by training steps instead of by the user's loop.

The user's script never calls ``prof.step()``: the agent calls :meth:`ProfilerDriver.advance` at
the end of each training step (an optimizer step, see ``agent.py``), and the schedule in
``schedule.py`` says which steps are skipped, warmed up and recorded. A script that never steps a
torch optimizer falls back to one time window (:meth:`ProfilerDriver.check_time_window`).

The trace is written once, when the schedule ends (torch calls ``on_trace_ready``): exported to a
temporary file, gzipped under a temporary name and renamed, so a reader never sees half a trace.
Once written the profiler stops, so the rest of the run pays nothing for it. While it records, the
profiler's own log lines go to ``logs/rank{R}.log`` instead of the user's terminal (``stderrlog``).
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import sys
import threading
import time
import warnings
from typing import Any

import torch
import torch.autograd.profiler as autograd_profiler
from torch.profiler import ProfilerAction, ProfilerActivity

from fsdpviz.record import schedule
from fsdpviz.record.environment import launch_environment
from fsdpviz.record.options import ENV_RUN_ID, RecordOptions
from fsdpviz.record.stderrlog import ProfilerLogFilter
from fsdpviz.runfolder import (
    LOG_FILE,
    PARTIAL_SUFFIX,
    SCHEDULE_OPTIMIZER_STEPS,
    SCHEDULE_TIME_WINDOW,
    TRACE_RUN_ID_KEY,
    rank_path,
    trace_path,
)

_ACTIONS = {
    schedule.NONE: ProfilerAction.NONE,
    schedule.WARMUP: ProfilerAction.WARMUP,
    schedule.RECORD: ProfilerAction.RECORD,
    schedule.RECORD_AND_SAVE: ProfilerAction.RECORD_AND_SAVE,
}
_RECORDING_ACTIONS = (ProfilerAction.RECORD, ProfilerAction.RECORD_AND_SAVE)


class ProfilerDriver:
    """The profiler of one rank and its schedule. Inactive until :meth:`start`."""

    def __init__(self, options: RecordOptions) -> None:
        self.options = options
        self.rank = 0
        self.prof: Any = None
        self.schedule_kind = SCHEDULE_OPTIMIZER_STEPS
        self.window: dict[str, float] = {}  # time-window fallback: monotonic "start" and "end"
        self.recorded_steps: set[int] = set()
        self.trace_file: str | None = None  # relative to the run folder, once written
        self.trace_error: str | None = None  # why the trace could not be written (a full disk...)
        self.labels_on = False  # the profiler records now: fsdpviz's ranges are worth entering
        self.log_filter: ProfilerLogFilter | None = None  # the profiler's own stderr lines -> logs/
        self.steps_run: int | None = None  # set at the process's end: training steps that began
        self._discard = False  # the process ended before any recorded step began: write no trace
        self.failed = False  # the process ended by an exception or a signal (finish)
        self.stood_aside: str | None = None  # why fsdpviz left the thread's profiler to the script's own
        self._own_transition = False  # fsdpviz's profiler is starting its own trace (not the script's)
        self._tracing = False  # fsdpviz's profiler has started its trace (Kineto records for it)
        self._chained: Any = None  # torch's profiler-start callback, while fsdpviz's hook is in its place
        self.script_profiled: set[int] = set()  # steps the script's own profiler was on in: never clean steps
        self._step = 0  # the training step running now (step_ended)
        self.left_on_from: int | None = None  # fsdpviz's profiler left on in this thread from this step (orphaned)
        self._thread = threading.get_ident()  # the training thread (start)

    @property
    def time_window(self) -> bool:
        return self.schedule_kind == SCHEDULE_TIME_WINDOW

    def start(self, rank: int, step: int) -> None:
        """Start profiling at training step ``step`` (CPU, and CUDA when present)."""
        self.rank = rank
        self.log_filter = ProfilerLogFilter(rank_path(self.options.run_dir, LOG_FILE, rank))
        self.log_filter.start()
        activities = [ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(ProfilerActivity.CUDA)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # e.g. "no warmup" when --warmup 0
            self.prof = torch.profiler.profile(
                activities=activities,
                schedule=self.action,
                on_trace_ready=self._write_trace,
                record_shapes=True,  # gloo collectives' sizes come from their input shapes
                profile_memory=self.options.memory,
                # --stack: where each op comes from (its Python frames, and the nn.Module forwards among
                # them), at a cost per op the clean steps do not pay
                with_stack=self.options.stack,
            )
            run_id = launch_environment().get(ENV_RUN_ID, "")
            if run_id and hasattr(self.prof, "preset_metadata_json"):  # the trace names its recording
                self.prof.preset_metadata_json(TRACE_RUN_ID_KEY, json.dumps(run_id))
            self.prof.step_num = step
            self._step, self._thread = step, threading.get_ident()
            self.recorded_steps.clear()  # the constructor asked about step 0
            self.prof.current_action = self.action(step)
            self._hook_script_profilers()
            if not self._transit(self.prof.start, step):
                return
        self.labels_on = self.prof.current_action in _RECORDING_ACTIONS

    # One process runs one torch profiler (Kineto is one per process: two at once, even on two threads,
    # crash it): a script that profiles itself and fsdpviz's schedule meet. Where they meet, from the
    # profiler warm-up step to the trace's export, the script's own profiler keeps the process and fsdpviz
    # stands aside, with a note in run.json. Before its warm-up step fsdpviz's profiler is idle: it starts
    # nothing and opens no step range (ProfilerStep#N, which the script's trace would record), so a script's
    # profiler that is off again by then is left alone.

    def _idle(self, step: int) -> bool:
        """Whether fsdpviz's profiler does nothing at ``step``: no Kineto, no step range (the steps before
        its warm-up step, ``--warmup`` - 1)."""
        return not self.time_window and step < self.options.warmup - 1

    def step_ended(self, ending: int) -> None:
        """Training step ``ending`` ends (before :meth:`advance`): a script's profiler on now ran in it and
        runs into the next, whose pace is then the profiler's, not the bare run's (no clean steps)."""
        if self._script_profiler_on():
            self.script_profiled.update((ending, ending + 1))
        self._step = ending + 1

    def _script_profiler_on(self) -> bool:
        """Whether a profiler that is not fsdpviz's is on, in this thread or another: Kineto is one per
        process, and two profilers on two threads at once crash it."""
        if self._tracing:
            return False
        enabled = getattr(torch.autograd, "_profiler_enabled", None)  # this thread's
        return bool(enabled is not None and enabled()) or bool(getattr(autograd_profiler, "_is_profiler_enabled", False))

    def _transit(self, move: Any, step: int) -> bool:
        """Run ``move`` (the profiler's ``start`` or ``step`` into ``step``) unless the script's own profiler
        is on in this process; False when fsdpviz stood aside instead."""
        idle = self._idle(step)
        if self.prof is not None:
            # torch opens a step range at every start() and step() it is let: none while idle
            self.prof.record_steps = not idle
        if not idle and self._script_profiler_on():
            self._stand_aside(step, started=False)
            return False
        self._own_transition = True
        try:
            move()
        except RuntimeError:
            if not self._script_profiler_on():  # not the two profilers meeting: a failure of fsdpviz's own
                raise
            self._stand_aside(step, started=False)
            return False
        finally:
            self._own_transition = False
        self._tracing = self.prof is not None and self.prof.current_action in _RECORDING_ACTIONS
        return True

    def _hook_script_profilers(self) -> None:
        """Put a hook where torch starts any profiler of this process (``torch.autograd.profiler``'s
        ``_run_on_profiler_start``): a script's own that starts while fsdpviz's runs makes fsdpviz's stop
        first. Torch releases without that function keep only the checks at fsdpviz's own steps."""
        chained = getattr(autograd_profiler, "_run_on_profiler_start", None)
        if chained is None or self._chained is not None:
            return

        def on_profiler_start() -> None:
            # a script's profiler starting, on any thread, while fsdpviz's runs: Kineto is one per process
            if not self._own_transition:
                self.script_profiled.add(self._step)
                if self.prof is not None and not self._idle(self.prof.step_num):
                    self._stand_aside(self.prof.step_num, started=True)
            chained()

        self._chained = chained
        autograd_profiler._run_on_profiler_start = on_profiler_start

    def _unhook_script_profilers(self) -> None:
        if self._chained is not None:
            autograd_profiler._run_on_profiler_start = self._chained
            self._chained = None

    def _stand_aside(self, step: int, *, started: bool) -> None:
        """Leave the thread's profiler to the script's own: fsdpviz's is stopped (its trace discarded) if it
        had started its trace, else let go with its open step range closed, since stopping a profiler that
        never started its trace would stop the script's."""
        prof, tracing = self.prof, self._tracing
        self.prof = None
        self._tracing = False
        self._discard = True
        # stopped from another thread, fsdpviz's profiler stays on in the training thread's own state, to the
        # process's end (ending it from this thread crashes the backend): every step from here is slowed, and
        # the training thread's flag, read at each step's end, marks them all as not clean
        if tracing and threading.get_ident() != self._thread:
            self.left_on_from = step
        if prof is not None and tracing:
            try:
                prof.stop()  # closes its step range too
            except RuntimeError:
                pass
        elif prof is not None and getattr(prof, "step_rec_fn", None) is not None:
            try:
                prof.step_rec_fn.__exit__(None, None, None)
            except RuntimeError:
                pass
            prof.step_rec_fn = None
        first, last = self.options.warmup, self.options.warmup + self.options.steps - 1
        when = "started its own torch.profiler" if started else "ran its own torch.profiler"
        where = f"a {self.options.window_s:g} s window" if self.time_window else f"steps {first}-{last}"
        then = "the timers still ran" if self.options.timers else "no timers were asked for (--mode profile)"
        if self.time_window:
            advice = "with the script's profiler off"
        else:
            # busy from fsdpviz's warm-up step, which begins where optimizer step first - 2 ends; after the trace,
            # the unit-timed steps time the units without a profiler
            busy, after = max(0, first - 1), last + 1 + self.options.unit_timer_steps
            by = (f" (with this --warmup, off before optimizer step {first - 2} ends: whole steps 0-{first - 3})"
                  if first >= 3 else f" (with this --warmup, off before optimizer step {first - 2} ends)"
                  if first == 2 else "")
            advice = (f"with the script's profiler off, or on only outside fsdpviz's steps {busy}-{after - 1} (its "
                      f"{'warm-up step' if first >= 1 else 'first profiled step'} to its unit-timed steps after the "
                      f"trace): for whole steps 0-N, with --warmup N+3 or more{by}, or from step {after} on; the steps "
                      "it runs in are not clean steps")
        self.stood_aside = (f"no trace: the script {when} at step {step}, where fsdpviz profiles {where} (one process "
                            f"runs one profiler), so fsdpviz stood aside; {then}. Record again {advice}")
        self.stop()

    def action(self, step_num: int) -> ProfilerAction:
        """The schedule torch.profiler asks at every step."""
        action = self._scheduled(step_num)
        if action in (schedule.RECORD, schedule.RECORD_AND_SAVE):
            self.recorded_steps.add(step_num)
        return _ACTIONS[action]

    def _scheduled(self, step_num: int) -> str:
        if self.time_window:
            # One profiler step spans the whole window; torch saves a trace only after RECORD_AND_SAVE.
            return schedule.RECORD_AND_SAVE if self.window.get("end", 0.0) == 0.0 else schedule.NONE
        return schedule.profiler_action(step_num, self.options.warmup, self.options.steps)

    def _write_trace(self, prof: Any) -> None:
        if self._discard:
            return
        final = trace_path(self.options.run_dir, self.rank)
        raw = final.with_name(final.name.removesuffix(".gz") + PARTIAL_SUFFIX)
        packed = final.with_name(final.name + PARTIAL_SUFFIX)
        try:
            final.parent.mkdir(parents=True, exist_ok=True)
            prof.export_chrome_trace(str(raw))
            with open(raw, "rb") as src, gzip.open(packed, "wb", compresslevel=6) as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
            os.replace(packed, final)
            raw.unlink()
        except Exception as exc:  # noqa: BLE001 - a full disk must not stop the training: report it
            for leftover in (raw, packed, raw.with_name(raw.name + ".tmp")):  # .tmp: Kineto's own
                leftover.unlink(missing_ok=True)
            self.trace_error = f"could not write the trace: {exc}"
            print(f"fsdpviz: rank {self.rank}: {self.trace_error}", file=sys.stderr, flush=True)
            return
        self.trace_file = str(final.relative_to(self.options.run_dir))

    def advance(self) -> None:
        """One training step ended (may write the trace: call it between steps, not inside one)."""
        if self.prof is None:
            return
        if not self._transit(self.prof.step, self.prof.step_num + 1):
            return
        if self.trace_file is not None or self.trace_error is not None:  # the schedule is over: stop paying
            self.stop()
        else:
            self.labels_on = self.prof.current_action in _RECORDING_ACTIONS

    def finish(self, steps_run: int, *, failed: bool = False) -> None:
        """The process ends after ``steps_run`` training steps began (the last possibly cut short):
        stop, and export the trace only if a recorded step is among them. The profiler's schedule
        already asked about the step after the last one, which never ran: a trace of it would hold
        only the process's exit, labelled as a training step."""
        self.steps_run = steps_run
        self.failed = failed
        if not self.time_window and not any(step < steps_run for step in self.recorded_steps):
            self._discard = True
        self.stop()
        self._unhook_script_profilers()

    def stop(self) -> None:
        """Stop now (exports the trace if it was recording). The hook on torch's profiler start stays to
        the process's end (:meth:`finish`): a script's profiler after fsdpviz's trace makes steps unclean too."""
        if self.prof is not None:
            prof, self.prof = self.prof, None
            self._own_transition = True
            try:
                prof.stop()
            finally:
                self._own_transition = False
        self.labels_on = False
        if self.log_filter is not None:
            self.log_filter.stop()

    def check_time_window(self, *, optimizer_stepped: bool, elapsed_s: float, forwards: int) -> None:
        """At a forward of a script that has not stepped an optimizer (yet): switch to the
        time-window schedule when it looks like it never will, and close that window when due."""
        now = time.monotonic()
        if not self.time_window:
            if self.prof is not None and schedule.should_fall_back(
                optimizer_stepped=optimizer_stepped, elapsed_s=elapsed_s,
                forwards=forwards, fallback_after_s=self.options.fallback_after_s,
            ):
                self.schedule_kind = SCHEDULE_TIME_WINDOW
                self.recorded_steps.clear()
                self.window = {"start": now, "end": 0.0}
                self.advance()
        elif not self.window.get("end") and now - self.window["start"] >= self.options.window_s:
            self.window["end"] = now
            self.advance()

    def enter_range(self, label: str) -> Any:
        """Enter the trace range ``label`` (``record_function``) while the profiler records; None
        otherwise, so that fsdpviz's ranges cost nothing outside the profiled steps."""
        if not self.labels_on:
            return None
        rng = torch.autograd.profiler.record_function(label)
        rng.__enter__()
        return rng

    def facts(self) -> dict[str, Any]:
        """run.json's ``profile`` entry of this rank: the schedule and the steps the trace holds."""
        recorded = sorted(self.recorded_steps) if self.trace_file is not None else []
        if self.steps_run is not None and not self.time_window:  # only the steps that ran (see finish)
            recorded = [step for step in recorded if step < self.steps_run]
        log = self.log_filter
        return {"schedule": self.schedule_kind, "steps": recorded, "trace": self.trace_file,
                **({"log": LOG_FILE.format(rank=self.rank), "log_lines": log.captured} if log and log.captured else {}),
                **({"window_s": self.options.window_s} if self.window else {}),
                **({"error": self.trace_error} if self.trace_error else {}),
                **({"script_profiled": profiled} if (profiled := self.script_profiled_steps()) else {}),
                **({"profiler_left_on_from": self.left_on_from} if self.left_on_from is not None else {}),
                **({"note": note} if (note := self.no_trace_note()) else {})}

    def script_profiled_steps(self) -> list[int]:
        """The steps the script's own profiler was on in (that ran: a step after the last never did)."""
        ran = self.steps_run
        return sorted(s for s in self.script_profiled if ran is None or s < ran)

    def no_trace_note(self) -> str | None:
        """Why a process that was to profile wrote no trace: the script's own profiler held the thread, or
        the process ended before the first profiled step."""
        if self.stood_aside:
            return self.stood_aside
        if (not self.options.profile or self.steps_run is None or self.time_window or self.trace_file is not None
                or self.trace_error):
            return None
        first = self.options.warmup
        if self.steps_run > first:
            return None
        ended = (f"no trace: the script {'stopped' if self.failed else 'ended'} after {self.steps_run} training "
                 f"step(s), before step {first}, where profiling starts (--warmup {first})")
        if self.failed:  # the run's own failure is the thing to fix first; run.json's reason says it
            return ended
        return (f"{ended}; record it with --warmup {max(0, self.steps_run - 1)} to profile its last step, or let it "
                f"run {first + self.options.steps} steps for a full trace")
