"""Write simulated events as Kineto JSON (``rank{R}.trace.json.gz``), shaped like real GPU traces.

Field names and layouts follow real PyTorch profiler output (see ../shared/traces/gpu-real): a
header with ``schemaVersion``, ``deviceProperties``, ``distributedInfo`` (``pg_config``,
``nccl_version``), ``baseTimeNanoseconds``; ``ts``/``dur`` in microseconds after the base time with
nanosecond digits; ``process_name`` / ``thread_name`` metadata; ``ac2g`` flow events from each
launch to its kernel; ``[memory]`` instant events.

Per-rank differences (clock offset, pg names, rank) live in the header or are substituted while
writing, so ranks on a shared timeline serialise the event body once.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from helpers.kineto import complete, flow, instant, process_name, thread_name, write_trace

from .scenario import Scenario
from .timeline import AUTOGRAD, MAIN, STREAMS, Event

TRACE_FILE = "rank{rank}.trace.json.gz"
CPU_PID_BASE = 2_910_000
AUTOGRAD_TID_OFFSET = 9_503
DEVICE_PROPS = {"name": "NVIDIA H100 80GB HBM3", "totalGlobalMem": 85_031_714_816, "computeMajor": 9,
                "computeMinor": 0, "maxThreadsPerBlock": 1024, "maxThreadsPerMultiprocessor": 2048,
                "regsPerBlock": 65536, "warpSize": 32, "sharedMemPerBlock": 49152, "numSms": 132}


def rank_ids(sc: Scenario, rank: int, shared: bool) -> tuple[int, int, int]:
    """(CPU pid, autograd tid, GPU device) of ``rank``; identical for all ranks on a shared timeline."""
    r = 0 if shared else rank
    return CPU_PID_BASE + 97 * r, CPU_PID_BASE + 97 * r + AUTOGRAD_TID_OFFSET, r % 8


def process_groups(sc: Scenario, rank: int) -> dict[str, tuple[str, str, list[int]]]:
    """This rank's process groups: role ("shard" / "replica") -> (name, description, ranks)."""
    ws, size = sc.world_size, sc.shard_size
    if sc.hsdp_replicas == 1:
        return {"shard": ("0", "default_pg", list(range(ws)))}
    n_shard_groups = ws // size
    g, j = rank // size, rank % size
    return {
        "shard": (str(1 + g), "mesh_shard", list(range(g * size, (g + 1) * size))),
        "replica": (str(1 + n_shard_groups + j), "mesh_replicate", list(range(j, ws, size))),
    }


def header(sc: Scenario, rank: int, shared: bool) -> dict[str, Any]:
    """Everything but ``traceEvents`` for one rank's file."""
    groups = process_groups(sc, rank)
    pg_config = [{"pg_name": "0", "pg_desc": "default_pg", "backend_config": "cuda:nccl",
                  "pg_size": sc.world_size, "ranks": list(range(sc.world_size))}]
    for name, desc, ranks in groups.values():
        if name != "0":
            pg_config.append({"pg_name": name, "pg_desc": desc, "backend_config": "cuda:nccl",
                              "pg_size": len(ranks), "ranks": ranks})
    _, _, device = rank_ids(sc, rank, shared)
    return {
        "schemaVersion": 1,
        "deviceProperties": [{"id": device, **DEVICE_PROPS}],
        "cupti_version": 24,
        "cuda_runtime_version": 12080,
        "cuda_driver_version": 12080,
        "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": sc.world_size,
                            "pg_count": len(pg_config), "pg_config": pg_config, "nccl_version": "2.27.5"},
        "record_shapes": 1,
        "profile_memory": 1,
        "trace_id": f"{0xC0FFEE + rank:032X}",
        "displayTimeUnit": "ms",
        # A clock that runs ahead moves every timestamp of the rank: fold it into the base time.
        "baseTimeNanoseconds": sc.base_time_ns + sc.clock_offset_ns.get(rank, 0),
    }


def _us(ns: int) -> float:
    return ns / 1000.0


def _pick(value: Any, i: int) -> int:
    return int(value[i]) if isinstance(value, np.ndarray) else int(value)


def event_dicts(events: list[Event], sc: Scenario, rank: int, timeline: int, shared: bool) -> list[dict]:
    """The Kineto dicts of one rank, times taken from timeline ``timeline`` of the simulation."""
    pid, autograd_tid, device = rank_ids(sc, rank, shared)
    tids = {MAIN: pid, AUTOGRAD: autograd_tid}
    groups = process_groups(sc, rank)
    out: list[dict] = []
    append = out.append
    t0 = sc.start_ns
    for ev in events:
        ts = _us(_pick(ev.ts, timeline))
        if ev.lane[0] == "gpu":
            p, t = device, ev.lane[1]
        else:
            p, t = pid, tids[ev.lane]
        args = ev.args
        if args is not None and "device" in args:
            args = {**args, "device": device}
        if args is not None and "Process Group Name" in args and sc.hsdp_replicas > 1:
            role = "shard" if args["Process Group Name"] == "1" else "replica"
            name, desc, ranks = groups[role]
            args = {**args, "Process Group Name": name, "Process Group Description": desc,
                    "Process Group Ranks": str(ranks)}
        if ev.ph == "X":
            append(complete(ev.name, ev.cat, p, t, ts, _us(_pick(ev.dur, timeline)), args))
        else:
            append(instant(ev.name, ev.cat, p, t, ts, args))
        if ev.flow is not None:
            corr, lane, t_launch = ev.flow
            out.extend(flow(corr, pid, tids[lane], _us(_pick(t_launch, timeline)), p, t, ts))
    out.extend(_metadata(pid, autograd_tid, device, _us(t0)))
    return out


def _metadata(pid: int, autograd_tid: int, device: int, ts: float) -> list[dict]:
    meta = [*process_name(pid, "python3.11", "CPU", ts), *process_name(device, "python3.11", f"GPU {device}", ts),
            thread_name(pid, pid, f"thread {pid} (pt_main_thread)", ts),
            thread_name(pid, autograd_tid, f"thread {autograd_tid} (pt_autograd_0)", ts)]
    meta.extend(thread_name(device, stream, f"stream {stream} ", ts) for stream in STREAMS)
    return meta


def write_rank(path: Path, head: dict[str, Any], body: list[dict] | bytes, *, level: int = 6,
               body_gz: bytes | None = None) -> None:
    """Write one rank's ``.json.gz`` file: ``head`` plus the events (dicts, or their serialised JSON
    list, or ``body_gz``: the events compressed once for all ranks sharing them)."""
    write_trace(path, {**head, "traceName": str(path)}, body, compress=True, level=level, events_gz=body_gz)
