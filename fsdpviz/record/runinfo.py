"""run.json: what the launcher knows about the command, merged with what every rank wrote.

Each recording rank leaves ``ranks/rank{R}.json`` (framework, units, versions, which steps it
profiled, how it ended). After the command exits the launcher keeps what a killed rank could not
finish (complete lines of a ``.partial`` timers file), drops unusable half-written traces, and
assembles run.json from these facts. Pure functions on dicts and paths: no torch.

Field reference: docs/run-folder.md.
"""

from __future__ import annotations

import json
import os
import platform
import re
import signal
import socket
from collections import Counter
from datetime import datetime
from importlib import metadata
from pathlib import Path
from typing import Any

from fsdpviz import __version__
from fsdpviz.record.options import RecordOptions
from fsdpviz.record.timers import salvage_partial
from fsdpviz.runfolder import (
    FORMAT_VERSION,
    PARTIAL_SUFFIX,
    RANKS_DIR,
    SCHEDULE_OPTIMIZER_STEPS,
    TIMERS_DIR,
    TRACES_DIR,
    RunInfo,
    encode_run_json,
    number_ranges,
    run_info_from,
)

STATUS_OK = "ok"
STATUS_FAILED = "failed"
STATUS_INTERRUPTED = "interrupted"


def read_rank_infos(run_dir: Path) -> tuple[list[dict[str, Any]], list[str]]:
    """The ranks' facts, sorted by rank, and notes about files that could not be read."""
    infos, notes = [], []
    for path in sorted((run_dir / RANKS_DIR).glob("rank*.json")):
        try:
            infos.append(json.loads(path.read_text(encoding="utf-8")))
        except (OSError, ValueError) as exc:
            notes.append(f"{path.relative_to(run_dir)}: unreadable ({exc})")
    return sorted(infos, key=lambda info: info.get("rank", 0)), notes


def _rank_of(path: Path) -> int | None:
    match = re.match(r"rank(\d+)\.", path.name)
    return int(match.group(1)) if match else None


def _is_running(info: dict[str, Any] | None, host: str) -> bool:
    """Whether the process behind a rank file may still be writing (it is alive, or on another host)."""
    if info is None:
        return False
    if info.get("host") != host:
        return True  # another node of a shared (multi-node) folder: not ours to tidy
    try:
        os.kill(int(info.get("pid", -1)), 0)
    except (OSError, ValueError):
        return False
    return True


# Failures of a training script whose fix fsdpviz can name: (what the command's stderr says, the fix).
KNOWN_FAILURES: tuple[tuple[str, str], ...] = (
    ("FSDP needs a non-CPU accelerator device",
     ('FSDP1 on CPU needs device_id=torch.device("cpu") in FullyShardedDataParallel(...): without it, '
      "FSDP1 looks for a GPU and stops before the first forward (FSDP2's fully_shard runs on CPU as it is)")),
)


def failure_notes(last_lines: list[str]) -> list[str]:
    """A note with the fix of each known failure (:data:`KNOWN_FAILURES`) that the command's last
    stderr lines show, once each."""
    return [fix for said, fix in KNOWN_FAILURES if any(said in line for line in last_lines)]


def tidy_partial_files(run_dir: Path, rank_infos: list[dict[str, Any]]) -> list[str]:
    """Keep complete timer lines of killed ranks; remove trace files that were never finished.

    Files of ranks still running -- on another node sharing the folder, or orphans -- are left alone.
    """
    by_rank = {info.get("rank"): info for info in rank_infos}
    host = socket.gethostname()
    notes = []
    for partial in sorted((run_dir / TIMERS_DIR).glob(f"*{PARTIAL_SUFFIX}")):
        if _is_running(by_rank.get(_rank_of(partial)), host):
            continue
        final = salvage_partial(partial)
        notes.append(f"{final.relative_to(run_dir)}: kept the complete lines of an unfinished file")
    # *.partial.tmp: the profiler's own temporary file, when the rank stopped while it exported
    for partial in sorted((run_dir / TRACES_DIR).glob(f"*{PARTIAL_SUFFIX}*")):
        if _is_running(by_rank.get(_rank_of(partial)), host):
            continue
        partial.unlink()
        notes.append(f"{partial.relative_to(run_dir)}: removed (the rank stopped while writing it)")
    for partial in sorted((run_dir / RANKS_DIR).glob(f"*{PARTIAL_SUFFIX}")):  # a rank file never renamed
        if not _is_running(by_rank.get(_rank_of(partial)), host):
            partial.unlink()
    return notes


def mark_vanished_ranks(rank_infos: list[dict[str, Any]]) -> None:
    """A rank that never finished its recording (SIGKILL, out of memory) is marked ``killed``."""
    host = socket.gethostname()
    for info in rank_infos:
        if info.get("status") == "running" and not _is_running(info, host):
            info["status"] = "killed"
            info["reason"] = ("the rank ended without finishing its recording (killed by SIGKILL or out of "
                              "memory? or its disk was full: see the rank's fsdpviz lines in the output)")


def exit_code_of(returncode: int) -> int:
    """A shell-style exit code: 128 + N for a child killed by signal N."""
    return 128 - returncode if returncode < 0 else returncode


def decide_status(exit_code: int, forwarded_signal: int | None, rank_infos: list[dict[str, Any]]) -> tuple[str, str]:
    """``(status, reason)`` of the run from its exit code, a signal the user sent, and the ranks. The reason
    names the rank that failed first (its ``end_time``, as torchrun names its root cause): the others
    often fail only because it did (gloo's "Connection closed by peer")."""
    failed = sorted((i for i in rank_infos if i.get("status") == STATUS_FAILED and i.get("reason")),
                    key=lambda i: (_when(i.get("end_time")) is None, _when(i.get("end_time")) or 0.0, i.get("rank") or 0))
    failures = [f"rank {i.get('rank')}: {i['reason']}" for i in failed]
    if forwarded_signal is not None:
        return STATUS_INTERRUPTED, f"{signal.Signals(forwarded_signal).name} sent to fsdpviz record"
    if exit_code == 0:
        return STATUS_OK, ""
    if exit_code > 128 and exit_code - 128 in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        return STATUS_INTERRUPTED, f"command killed by {signal.Signals(exit_code - 128).name}"
    if any(i.get("status") == STATUS_INTERRUPTED for i in rank_infos) and not failures:
        return STATUS_INTERRUPTED, f"command exited with code {exit_code} after its ranks were interrupted"
    reason = f"command exited with code {exit_code}"
    return STATUS_FAILED, f"{reason}; {failures[0]}" if failures else reason


def _when(iso: Any) -> float | None:
    """A rank file's timestamp as seconds since the epoch (its offset honoured: nodes of one run may keep
    different time zones); None where it is missing or unreadable."""
    try:
        return datetime.fromisoformat(str(iso)).timestamp() if iso else None
    except ValueError:
        return None


def launcher_versions() -> dict[str, str | None]:
    """Versions as installed where the launcher runs (ranks report what they actually imported)."""
    found: dict[str, str | None] = {"python": platform.python_version(), "fsdpviz": __version__}
    for package in ("torch", "deepspeed"):
        try:
            found[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            found[package] = None
    return found


def _rank_summary(info: dict[str, Any]) -> dict[str, Any]:
    profile = info.get("profile") or {}
    timers = info.get("timers") or {}
    return {
        "rank": info.get("rank"),
        "local_rank": info.get("local_rank"),
        "host": info.get("host"),
        "pid": info.get("pid"),
        "device": info.get("device"),
        "backend": info.get("backend"),
        "framework": info.get("framework"),
        "status": info.get("status"),
        "reason": info.get("reason"),
        "trace": profile.get("trace"),
        "log": profile.get("log"),  # the profiler's own log lines, when it wrote any
        "profiled_steps": profile.get("steps", []),
        "timers": timers.get("file"),
        "timer_steps": timers.get("steps", 0),
        "steps_seen": info.get("steps_seen"),
        "partial_step": info.get("partial_step"),
        "start_time": info.get("start_time"),
        "end_time": info.get("end_time"),
        "cpu_count": info.get("cpu_count"),
        "memory": info.get("memory"),
        "unit_timed_steps": info.get("unit_timed_steps"),
        "script_profiled_steps": profile.get("script_profiled"),
        "observer": info.get("observer"),
    }


def build_run_json(
    *,
    command: list[str],
    cwd: str,
    label: str,
    start_time: str,
    end_time: str,
    exit_code: int,
    status: str,
    reason: str,
    options: RecordOptions,
    rank_infos: list[dict[str, Any]],
    notes: list[str],
    run_id: str = "",
    command_log: str | None = None,
) -> RunInfo:
    """Assemble run.json (see docs/run-folder.md for every field)."""
    first = rank_infos[0] if rank_infos else {}
    frameworks = Counter(i.get("framework", "unknown") for i in rank_infos)
    framework = frameworks.most_common(1)[0][0] if frameworks else "unknown"
    if len(frameworks) > 1:
        notes = [*notes, f"ranks disagree on the framework: {dict(frameworks)}"]
    world_sizes = {int(i["world_size"]) for i in rank_infos if i.get("world_size")}
    world_size = max(world_sizes) if world_sizes else None
    if world_size is not None and len(rank_infos) < world_size:
        missing = sorted(set(range(world_size)) - {i.get("rank") for i in rank_infos})
        notes = [*notes, f"no recording from rank(s) {missing} (another node, or they never ran a sharded forward)"]
    for info in rank_infos:  # e.g. a disk that filled up during the run: the training went on
        for part in ("profile", "timers"):
            error = (info.get(part) or {}).get("error")
            if error:
                notes = [*notes, f"rank {info.get('rank')}: {error}"]
    no_trace = Counter((info.get("profile") or {}).get("note") for info in rank_infos)
    no_trace.pop(None, None)
    for note, count in no_trace.items():  # e.g. a script shorter than --warmup: once, not once per rank
        notes = [*notes, f"{'every rank' if count == len(rank_infos) else f'{count} rank(s)'}: {note}"]
    profiled_by_script: dict[tuple[tuple[int, ...], int | None], list[int]] = {}
    for info in rank_infos:  # a script may profile on some ranks only: named, once per set of steps
        profile = info.get("profile") or {}
        steps = tuple(profile.get("script_profiled") or ())
        if steps:
            profiled_by_script.setdefault((steps, profile.get("profiler_left_on_from")), []).append(
                int(info.get("rank", -1)))
    for (steps, left_on), ranks in profiled_by_script.items():
        who = "every rank" if len(ranks) == len(rank_infos) else f"rank(s) {number_ranges(ranks)}"
        why = ("a profiler was on: the script's own, then, from step "
               f"{left_on}, fsdpviz's, which the script's profiler started on another thread stopped there and "
               "left on in the training thread to the end (it cannot be ended from there)" if left_on is not None
               else "the script's own torch.profiler was on")
        notes = [*notes, (f"{who}: in step(s) {number_ranges(steps)} {why}: they are not clean steps (a profiler "
                          "slows them), so neither the step time nor the units' timed passes are read from them")]
    versions: dict[str, str | None] = {"cuda": None, "nccl": None, **launcher_versions()}
    # what the ranks imported wins over what the launcher finds installed
    versions.update({k: v for k, v in (first.get("versions") or {}).items() if v is not None or k not in versions})
    profile = first.get("profile") or {}
    return run_info_from({
        "fsdpviz_version": __version__,
        "format": FORMAT_VERSION,
        "label": label,
        "command": command,
        "cwd": cwd,
        "start_time": start_time,
        "end_time": end_time,
        "exit_code": exit_code,
        "status": status,
        "reason": reason,
        "run_id": run_id,
        "command_log": command_log,
        "world_size": world_size,
        "hosts": sorted({i["host"] for i in rank_infos if i.get("host")}) or [socket.gethostname()],
        "framework": framework,
        "units": first.get("units", []),
        "parallelism": first.get("parallelism"),
        "versions": versions,
        "options": options.to_json(),
        "profile": {
            "schedule": profile.get("schedule", SCHEDULE_OPTIMIZER_STEPS),
            "steps": profile.get("steps", []),
            "warmup": options.warmup,
            "requested_steps": options.steps,
            **({"window_s": profile["window_s"]} if "window_s" in profile else {}),
            "unit_timed_steps": first.get("unit_timed_steps"),
            "unit_timer_steps": options.unit_timer_steps,
        },
        "ranks": [_rank_summary(info) for info in rank_infos],
        "notes": notes,
    })


def write_run_json(path: Path, run: RunInfo) -> None:
    """Write run.json under a temporary name, then rename it (readers never see half a file)."""
    # a name of its own: with --shared, every node's launcher writes run.json into the same folder
    tmp = path.with_name(f"{path.name}.{socket.gethostname()}.{os.getpid()}{PARTIAL_SUFFIX}")
    try:
        tmp.write_bytes(encode_run_json(run))
        tmp.replace(path)
    except OSError:  # a full disk: leave no half-written file behind
        tmp.unlink(missing_ok=True)
        raise
