"""The parent side of ``fsdpviz record``: prepare the run folder, run the command, write run.json.

The command runs unchanged in its own process group, with ``FSDPVIZ_*`` variables and the
bootstrap folder first on ``PYTHONPATH`` (see ``activation.py`` for which of its processes
record). Ctrl-C / SIGTERM / SIGHUP sent to ``fsdpviz record`` are forwarded to that process group
-- torchrun then stops its ranks, whose agents flush what they captured -- and the command's exit
code becomes ours. Errors the user can fix (an existing or unwritable folder, a command that does
not exist) are raised before the command starts, so nothing runs for nothing.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from fsdpviz.errors import RunFolderError, UsageError
from fsdpviz.record import runinfo
from fsdpviz.record.environment import without_own_defaults
from fsdpviz.record.options import ENV_BOOTSTRAP, ENV_OWNER_PID, ENV_RUN_ID, RecordOptions
from fsdpviz.record.tail import StderrTail
from fsdpviz.runfolder import (
    COMMAND_LOG,
    OWNED_ENTRIES,
    RANKS_DIR,
    RUN_ID_FILE,
    RUN_JSON,
    TIMERS_DIR,
    TRACES_DIR,
    RunInfo,
    recording_entries,
)

BOOTSTRAP_DIR = Path(__file__).resolve().parent / "bootstrap"
FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
# Ranks export their traces uncompressed before gzipping them (tens to hundreds of MB each on a
# GPU): below this much free space a recording is likely to fail at its very end.
ENV_MIN_FREE_MB = "FSDPVIZ_MIN_FREE_MB"
DEFAULT_MIN_FREE_MB = 100
SHARED_WAIT_S = 60.0  # --shared: how long a node's launcher waits for the other nodes' ranks


@dataclass(frozen=True, slots=True)
class RecordResult:
    run_dir: Path
    exit_code: int
    run: RunInfo
    error: str | None = None  # run.json could not be written (e.g. the disk filled up during the run)
    last_lines: list[str] = field(default_factory=list)  # the command's last stderr lines


def _now_iso() -> str:
    return datetime.now(timezone.utc).astimezone().isoformat(timespec="milliseconds")


def check_command(command: list[str]) -> None:
    """Fail early, with one clear line, when the command cannot be started."""
    if not command:
        raise UsageError("no command to record: fsdpviz record [OPTIONS] -- COMMAND...")
    program = command[0]
    if os.sep in program:
        if not os.access(program, os.X_OK):
            raise UsageError(f"{program}: not an executable file")
    elif shutil.which(program) is None:
        raise UsageError(f"{program}: command not found")


def prepare_run_dir(run_dir: Path, *, force: bool, shared: bool) -> None:
    """Create the run folder; refuse to overwrite a recording unless ``force``; check it is writable
    and has room (:func:`check_free_space`) before anything is created or replaced.

    ``force`` removes only what a recording writes (run.json, report.html, the caches, the files a
    recording writes in traces/, timers/, ranks/, logs/ and predictions/), never another file; a file of
    the user's that the next recording's readers would take as its own (a trace by the loader's name check
    in traces/, a ``*.jsonl`` in timers/, a ``rank*.json`` in ranks/) is refused before anything is
    removed. ``shared`` (multi-node) accepts an existing folder as is.
    """
    if run_dir.exists() and not run_dir.is_dir():
        raise RunFolderError(f"{run_dir}: exists and is not a folder")
    existing = [p.name for p in run_dir.iterdir()] if run_dir.is_dir() else []
    if existing and not shared and not force:
        raise RunFolderError(f"{run_dir}: run folder exists and is not empty (use --force to replace it)")
    remove, foreign = recording_entries(run_dir) if existing and not shared else ([], [])
    if foreign:
        names = ", ".join(str(p.relative_to(run_dir)) for p in foreign[:3]) + (
            f" and {len(foreign) - 3} more" if len(foreign) > 3 else "")
        is_, it = ("is", "it") if len(foreign) == 1 else ("are", "them")
        raise RunFolderError(f"{run_dir}: --force removes only fsdpviz's files, and {names} {is_} not: the next "
                             f"recording would read {it} as its own; move {it} out, or record into another folder")
    _probe_writable(run_dir)
    check_free_space(run_dir)
    for path in remove:
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)
    for name in OWNED_ENTRIES:  # a folder of fsdpviz's left empty goes too; one with the user's files stays
        with contextlib.suppress(OSError):
            (run_dir / name).rmdir()
    try:
        for sub in (TRACES_DIR, TIMERS_DIR, RANKS_DIR):
            (run_dir / sub).mkdir(parents=True, exist_ok=True)
        probe = run_dir / RANKS_DIR / f".write-test-{os.getpid()}"
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        raise RunFolderError(f"{run_dir}: cannot write the run folder ({exc.strerror or exc})") from exc


def _nearest_folder(run_dir: Path) -> Path | None:
    return next((p for p in (run_dir, *run_dir.parents) if p.is_dir()), None)


def _probe_writable(run_dir: Path) -> None:
    """Write and remove a file where the run folder is (or will be) created: a read-only mount or
    a system folder is reported before anything else is touched."""
    folder = _nearest_folder(run_dir)
    if folder is None:
        return
    probe = folder / f".fsdpviz-write-test-{os.getpid()}"
    try:
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        raise RunFolderError(f"{run_dir}: cannot write the run folder ({exc.strerror or exc})") from exc


def check_free_space(run_dir: Path, env: Mapping[str, str] | None = None) -> None:
    """Refuse to start when the run folder's disk has less than ``FSDPVIZ_MIN_FREE_MB`` free
    (default 100; 0 turns the check off): a full disk is better reported before the training."""
    env = os.environ if env is None else env
    try:
        min_free_mb = float(env.get(ENV_MIN_FREE_MB) or DEFAULT_MIN_FREE_MB)
    except ValueError:
        raise UsageError(f"{ENV_MIN_FREE_MB}={env.get(ENV_MIN_FREE_MB)!r}: not a number of MB") from None
    folder = _nearest_folder(run_dir)
    if min_free_mb <= 0 or folder is None:
        return
    free_bytes = shutil.disk_usage(folder).free
    if free_bytes < min_free_mb * 2**20:
        raise RunFolderError(
            f"{run_dir}: only {free_bytes / 2**20:.1f} MB free on its disk, a recording needs at least "
            f"{min_free_mb:g} MB (free some space, choose another --out, or set {ENV_MIN_FREE_MB})")


def child_env(options: RecordOptions, base: dict[str, str] | None = None, run_id: str = "") -> dict[str, str]:
    """The command's environment: ours plus the options (and the run id the ranks write into their
    traces), with the bootstrap first on PYTHONPATH."""
    env = without_own_defaults(dict(os.environ if base is None else base))
    env.update(options.to_env())
    if run_id:
        env[ENV_RUN_ID] = run_id
    env.pop(ENV_OWNER_PID, None)  # a recording started from inside another one starts afresh
    old = env.get("PYTHONPATH")
    env["PYTHONPATH"] = str(BOOTSTRAP_DIR) + (os.pathsep + old if old else "")
    env[ENV_BOOTSTRAP] = str(BOOTSTRAP_DIR)
    return env


def run_command(command: list[str], env: dict[str, str], tail: StderrTail | None = None) -> tuple[int, int | None]:
    """Run ``command`` in its own process group, forwarding signals; return (exit code, signal sent).
    ``tail``: passes the command's stderr through and keeps its last lines (:mod:`.tail`)."""
    group_kwargs: dict[str, Any] = (
        {"process_group": 0} if sys.version_info >= (3, 11) else {"preexec_fn": os.setpgrp}
    )
    stderr_fd = tail.start() if tail is not None else None
    try:
        stdout_fd = stderr_fd if tail is not None and tail.stdout_too else None
        proc = subprocess.Popen(command, env=env, stdout=stdout_fd, stderr=stderr_fd, **group_kwargs)
    except OSError as exc:
        if tail is not None:
            tail.finish()
        raise UsageError(f"{command[0]}: cannot start ({exc.strerror or exc})") from exc
    if tail is not None:
        tail.child_started()
    forwarded: list[int] = []

    def forward(signum: int, frame: Any) -> None:
        forwarded.append(signum)
        try:
            os.killpg(proc.pid, signum)
        except ProcessLookupError:
            pass

    previous = {sig: signal.signal(sig, forward) for sig in FORWARDED_SIGNALS}
    try:
        returncode = proc.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return runinfo.exit_code_of(returncode), (forwarded[0] if forwarded else None)


def wait_for_other_nodes(run_dir: Path, timeout_s: float = SHARED_WAIT_S, poll_s: float = 0.5) -> bool:
    """Multi-node: wait until every rank of the world has written its final rank file.

    Each node's launcher writes run.json when its own command ends; waiting for the other nodes'
    ranks (bounded by ``timeout_s``) lets every launcher write the complete file. True if complete.
    """
    deadline = time.monotonic() + timeout_s
    announced = False
    while True:
        infos, _ = runinfo.read_rank_infos(run_dir)
        runinfo.mark_vanished_ranks(infos)  # a killed rank of this host will not finish
        world = max((i.get("world_size") or 0 for i in infos), default=0)
        done = len(infos) >= world and all(i.get("status") != "running" for i in infos)
        if done or time.monotonic() >= deadline:
            return done
        if not announced:
            print(f"fsdpviz: waiting up to {timeout_s:.0f} s for the other nodes' ranks to finish",
                  file=sys.stderr, flush=True)
            announced = True
        time.sleep(poll_s)


def new_run_id(run_dir: Path, *, shared: bool) -> str:
    """A fresh id for this recording; with ``shared`` (multi-node), the one the first node's launcher
    put in the folder, so that every node's ranks write the same one."""
    run_id = uuid.uuid4().hex[:16]
    if not shared:
        return run_id
    path = run_dir / RUN_ID_FILE
    # written whole under a name of its own, then linked into place: the link fails if another node
    # was first, and a node that reads the file never reads it half-written
    tmp = path.with_name(f".{path.name}.{socket.gethostname()}.{os.getpid()}")
    try:
        tmp.write_text(run_id + "\n")
        os.link(tmp, path)
    except FileExistsError:
        with contextlib.suppress(OSError):
            run_id = path.read_text().strip() or run_id
    except OSError:  # a file system without hard links: this node's own id
        pass
    finally:
        tmp.unlink(missing_ok=True)
    return run_id


def write_command_log(run_dir: Path, lines: list[str]) -> str | None:
    """``logs/command.log`` with the command's last stderr lines; its name in the run folder, or
    None when there is nothing to write or it cannot be written."""
    if not lines:
        return None
    path = run_dir / COMMAND_LOG
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    except OSError:
        return None
    return COMMAND_LOG


def record(command: list[str], options: RecordOptions, *, force: bool = False, shared: bool = False,
           label: str | None = None, on_start: Callable[[], None] | None = None) -> RecordResult:
    """Run ``command`` with recording on and write run.json; returns the command's exit code.

    ``on_start`` is called once the run folder is ready, just before the command starts.
    """
    check_command(command)
    run_dir = options.run_dir
    prepare_run_dir(run_dir, force=force, shared=shared)
    if on_start is not None:
        on_start()
    run_id = new_run_id(run_dir, shared=shared)
    start_time = _now_iso()
    tail = StderrTail()
    try:
        exit_code, forwarded = run_command(command, child_env(options, run_id=run_id), tail)
    finally:
        last_lines = tail.finish()
    end_time = _now_iso()
    if shared:
        wait_for_other_nodes(run_dir)
    rank_infos, unreadable = runinfo.read_rank_infos(run_dir)
    notes = runinfo.tidy_partial_files(run_dir, rank_infos) + (runinfo.failure_notes(last_lines) if exit_code else [])
    runinfo.mark_vanished_ranks(rank_infos)
    status, reason = runinfo.decide_status(exit_code, forwarded, rank_infos)
    command_log = write_command_log(run_dir, last_lines) if exit_code != 0 else None
    run = runinfo.build_run_json(
        command=command, cwd=os.getcwd(), label=label or run_dir.name, start_time=start_time,
        end_time=end_time, exit_code=exit_code, status=status, reason=reason, options=options,
        rank_infos=rank_infos, notes=notes + unreadable, run_id=run_id, command_log=command_log,
    )
    try:
        runinfo.write_run_json(run_dir / RUN_JSON, run)
    except OSError as exc:
        return RecordResult(run_dir=run_dir, exit_code=exit_code, run=run, error=(
            f"{run_dir / RUN_JSON}: cannot write run.json ({exc.strerror or exc}); the traces and timers "
            "written so far are kept"), last_lines=last_lines)
    return RecordResult(run_dir=run_dir, exit_code=exit_code, run=run, last_lines=last_lines)
