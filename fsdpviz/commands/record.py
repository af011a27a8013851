"""``fsdpviz record [OPTIONS] -- COMMAND...``: record an unchanged training command on every rank."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from fsdpviz.commands.common import say
from fsdpviz.errors import EXIT_BAD_INPUT, FsdpvizError, UsageError
from fsdpviz.naming import list_units
from fsdpviz.record.options import DEFAULT_STEPS, DEFAULT_UNIT_TIMER_STEPS, DEFAULT_WARMUP

if TYPE_CHECKING:  # run.json's types load msgspec (and attrs): `fsdpviz --help` need not wait for them
    from fsdpviz.runfolder import RunInfo

CONTEXT_SETTINGS = {"allow_interspersed_args": False}  # options after COMMAND belong to COMMAND
MAX_UNITS_LISTED = 12  # the recording's line names this many units, then counts the rest
LAST_LINES_SHOWN = 5  # a command that failed before recording: its last stderr lines repeated
CANNOT_OPEN = "can't open file"  # python given a script that is not there
EXAMPLE = """
fsdpviz record -o runs/base -- torchrun --nproc_per_node 8 train.py
"""


def time_window_settings(env: Mapping[str, str]) -> dict[str, float]:
    """The time-window fallback's tuning, from ``FSDPVIZ_FALLBACK_AFTER_S`` / ``FSDPVIZ_WINDOW_S`` if set."""
    from fsdpviz.record.options import ENV_FALLBACK_AFTER_S, ENV_WINDOW_S

    names = {"fallback_after_s": ENV_FALLBACK_AFTER_S, "window_s": ENV_WINDOW_S}
    try:
        return {key: float(env[name]) for key, name in names.items() if env.get(name)}
    except ValueError as exc:
        raise UsageError(f"bad time-window setting in the environment: {exc}") from exc


def default_run_dir(now: datetime | None = None) -> Path:
    return Path("runs") / (now or datetime.now()).strftime("run-%Y%m%d-%H%M%S")


def record(
    command: list[str] = typer.Argument(  # noqa: B008 - typer declares parameters this way
        None, metavar="-- COMMAND...", show_default=False,
        help="The training command, unchanged: torchrun ..., python -m torch.distributed.run ..., "
             "deepspeed ..., accelerate launch ..., python train.py ..."),
    out: Path | None = typer.Option(  # noqa: B008
        None, "-o", "--out", "--output", metavar="DIR", help="Run folder to write. Default: runs/run-<date>-<time>.",
        show_default=False),
    steps: int = typer.Option(DEFAULT_STEPS, "--steps", min=1, metavar="N",
                              help="Optimizer steps to profile in full."),
    warmup: int = typer.Option(
        DEFAULT_WARMUP, "--warmup", min=0, metavar="N",
        help="Optimizer steps before profiling (the last warms the profiler up). The step time comes from the "
             "unprofiled steps timed after the profiled ones: a script of 8 steps or more gets it with the defaults."),
    mode: str = typer.Option(
        "both", "--mode", metavar="profile|timers|both", help="profile: torch.profiler traces; timers: per-step timers of every step; both."),
    memory: bool = typer.Option(True, "--memory/--no-memory",
                                help="Record allocator events and per-step peak memory."),
    stack: bool = typer.Option(False, "--stack/--no-stack",
                               help="Record each op's Python stack in the traces (where an op comes from, "
                                    "in Perfetto); the profiled steps run slower (1.3-1.8x their clean pace on "
                                    "the example trainer's CPU ranks, against 1.0-1.4x with --no-memory)."),
    unit_timer_steps: int = typer.Option(
        DEFAULT_UNIT_TIMER_STEPS, "--unit-timer-steps", min=0, metavar="N",
        help="Steps after the profiled ones whose units the timers clock (default: the step after the trace "
             "export). Other steps are left bare: the recorder marks only their ends and, on a CPU, their forward, "
             "backward and optimizer phases."),
    report: bool = typer.Option(True, "--report/--no-report", help="Write report.html after the run."),
    summary: bool = typer.Option(True, "--summary/--no-summary", help="Print the run's summary after it."),
    force: bool = typer.Option(False, "--force", help="Replace the recording in an existing run folder."),
    shared: bool = typer.Option(
        False, "--shared", help="Multi-node: the run folder is shared with the other nodes' fsdpviz record; "
                                "accept it as is and merge every rank found into run.json."),
    label: str | None = typer.Option(None, "--label", metavar="NAME", help="Name of the run in reports and comparisons "
                                                           "(default: the folder name).", show_default=False),
) -> int:
    """Record a training command on every rank.

    Runs COMMAND unchanged with recording on; its output passes through and its exit code is
    returned (fsdpviz's own lines and the summary go to stderr: stdout is the command's). The run
    folder gets run.json, traces/, timers/, logs/ and report.html."""
    from fsdpviz.record.launcher import record as run_record
    from fsdpviz.record.options import RecordOptions

    if not command:
        raise UsageError("no command to record: fsdpviz record [OPTIONS] -- COMMAND...")
    run_dir = (out or default_run_dir()).resolve()
    try:
        options = RecordOptions(run_dir=run_dir, steps=steps, warmup=warmup, mode=mode, memory=memory, stack=stack,  # type: ignore[arg-type]  # --mode is checked in __post_init__
                                unit_timer_steps=unit_timer_steps, **time_window_settings(os.environ))
    except ValueError as exc:
        raise UsageError(str(exc)) from exc
    what = []
    if options.profile:
        what.append(f"profile steps {warmup}-{warmup + steps - 1}" if steps > 1 else f"profile step {warmup}")
    if options.timers:
        first = warmup + steps
        extra = (f" and step {first}" if unit_timer_steps == 1 else
                 f" and steps {first}-{first + unit_timer_steps - 1}" if unit_timer_steps else "")
        what.append("step timers" + (f", unit timers in the profiled steps{extra}" if options.profile else
                                     f", unit timers in step{extra.removeprefix(' and step')}" if extra else ""))
    result = run_record(command, options, force=force, shared=shared, label=label, on_start=lambda: say(
        f"recording into {out or run_dir} ({', '.join(what)}): {' '.join(command)}"))
    print_recording(result.run, run_dir, result.last_lines)
    if result.error:  # the command ran, but its recording is incomplete: say so, keep a failing exit code
        print(f"error: {result.error}", file=sys.stderr, flush=True)
        return result.exit_code or EXIT_BAD_INPUT
    if result.run.ranks and options.profile and (summary or report):
        if any(r.trace for r in result.run.ranks):
            summarise_and_report(run_dir, summary=summary, report=report)
        else:  # the notes above say why (a script shorter than --warmup, a full disk)
            say(f"no {' or '.join(n for n, wanted in (('summary', summary), ('report', report)) if wanted)}: "
                "no rank wrote a trace")
    return result.exit_code


def print_recording(run: RunInfo, run_dir: Path, last_lines: Sequence[str] = ()) -> None:
    """What was recorded, in a few lines on stderr (also when nothing was). ``last_lines``: the
    command's last stderr lines, repeated when it failed before anything was recorded."""
    ranks = run.ranks
    status = run.status + (f" ({run.reason})" if run.reason else "")
    say(f"run {status}, exit code {run.exit_code}")
    if not ranks and run.exit_code:
        # the command failed before any FSDP forward (a mistyped script, an import error): its own
        # last words say why, so they come first, not fsdpviz's guess at what was missing
        say(f"nothing recorded: the command exited with code {run.exit_code} before any process ran the "
            f"forward of an FSDP / ZeRO-3 model" + ("; its last lines:" if last_lines else ""))
        # python's own word for a script it cannot open, where a launcher's report of the failure came after it
        cause = next((line for line in last_lines[:-LAST_LINES_SHOWN] if CANNOT_OPEN in line), None)
        if cause is not None:
            say(f"  | {cause}")
            say("  | ...")
        for line in last_lines[-LAST_LINES_SHOWN:]:
            say(f"  | {line}")
        if run.command_log:
            say(f"its last stderr lines are kept in {run_dir / run.command_log}")
    elif not ranks:
        say("nothing recorded: no process ran the forward of an FSDP / ZeRO-3 model (fsdpviz records the "
            "processes that run the forward of a model wrapped in fully_shard, FullyShardedDataParallel or "
            "a ZeRO-3 engine)")
    else:
        units = run.units
        unit_text = (f"{len(units)} unit{'' if len(units) == 1 else 's'} in run.json: "
                     f"{list_units((u.unit for u in units), MAX_UNITS_LISTED)}"
                     + (" (all in run.json)" if len(units) > MAX_UNITS_LISTED else "") if units else "no units")
        steps = run.profile.steps
        framework = run.framework
        if framework == "ddp":
            framework = "ddp (the model was wrapped in DistributedDataParallel, not FSDP)"
        say(f"{len(ranks)} rank(s) of world size {run.world_size}, framework {framework}, {unit_text}")
        traces = sum(1 for r in ranks if r.trace)
        timers = sum(1 for r in ranks if r.timers)
        step_text = (f"steps {steps[0]}-{steps[-1]}" if len(steps) > 1 else f"step {steps[0]}" if steps
                     else "no profiled step")
        say(f"traces: {traces} ({run.profile.schedule}, {step_text}); timers: {timers} "
             f"({max((r.timer_steps for r in ranks), default=0)} steps)")
    for note in run.notes:
        say(f"note: {note}")
    if ranks and run.command_log:  # it failed after recording began: the reason is in run.json, the words here
        say(f"the command's last stderr lines are kept in {run_dir / run.command_log}")
    say(f"run folder: {run_dir}")


def _import_report() -> None:
    """While the traces are parsed: the report's libraries. A failure is the report's to say, after
    the summary."""
    try:
        from fsdpviz.report.build import import_report_modules
    except ImportError:
        return
    import_report_modules()


def summarise_and_report(run_dir: Path, *, summary: bool, report: bool) -> Path | None:
    """After a recording: the terminal summary and ``run_dir/report.html``, from one load and one
    analysis of the traces (:func:`fsdpviz.analysis.pipeline.analyse`). Each failure is one line,
    never a lost exit code; returns the report's path when it was written."""
    outputs = [name for name, wanted in (("summary", summary), ("report", report)) if wanted]
    failure: str | None = None
    result = None
    try:
        from fsdpviz.analysis.pipeline import analyse

        result = analyse([run_dir], meanwhile=_import_report if report else None)
        from fsdpviz.commands.common import warn_gaps

        warn_gaps(result.traces)  # e.g. ranks that never communicated
    except FsdpvizError as exc:
        failure = str(exc)
    except Exception as exc:  # noqa: BLE001 - the recording is complete: report, keep the exit code
        failure = f"(internal error, please report): {exc!r}"
    written: Path | None = None
    for name in outputs:
        try:
            if result is None:
                raise _Failed(failure or "")
            if name == "summary":
                from fsdpviz.commands.summary import print_summary
                from fsdpviz.whatif.gains import completed_summary

                # as `fsdpviz summary` prints it, on stderr with fsdpviz's other lines: stdout is the command's
                print_summary(completed_summary(result), stderr=True)
            else:
                from fsdpviz.report.build import build_report
                from fsdpviz.runfolder import REPORT_HTML

                written = build_report(result, run_dir / REPORT_HTML).path
                say(f"report: {written}")
        except _Failed as exc:
            say(f"no {name}{'' if str(exc).startswith('(') else ':'} {exc}")
        except FsdpvizError as exc:
            say(f"no {name}: {exc}")
        except Exception as exc:  # noqa: BLE001 - as above: never lose the command's exit code
            say(f"no {name} (internal error, please report): {exc!r}")
    return written


class _Failed(Exception):
    """The traces could not be loaded or analysed: the reason, said once per wanted output."""
