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

import gzip
from pathlib import Path
from typing import Any

import numpy as np
import orjson

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
        ts = _pick(ev.ts, timeline)
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
            append({"ph": "X", "cat": ev.cat, "name": ev.name, "pid": p, "tid": t, "ts": _us(ts),
                    "dur": _us(_pick(ev.dur, timeline)), "args": args})
        else:
            append({"ph": "i", "cat": ev.cat, "s": "t", "name": ev.name, "pid": p, "tid": t, "ts": _us(ts),
                    "args": args})
        if ev.flow is not None:
            corr, lane, t_launch = ev.flow
            append({"ph": "s", "id": corr, "pid": pid, "tid": tids[lane], "ts": _us(_pick(t_launch, timeline)),
                    "cat": "ac2g", "name": "ac2g"})
            append({"ph": "f", "id": corr, "pid": p, "tid": t, "ts": _us(ts), "cat": "ac2g", "name": "ac2g",
                    "bp": "e"})
    meta_ts = _us(t0)
    out.extend(_metadata(pid, autograd_tid, device, meta_ts))
    return out


def _metadata(pid: int, autograd_tid: int, device: int, ts: float) -> list[dict]:
    meta = [
        {"name": "process_name", "ph": "M", "ts": ts, "pid": pid, "tid": 0, "args": {"name": "python3.11"}},
        {"name": "process_labels", "ph": "M", "ts": ts, "pid": pid, "tid": 0, "args": {"labels": "CPU"}},
        {"name": "process_name", "ph": "M", "ts": ts, "pid": device, "tid": 0, "args": {"name": "python3.11"}},
        {"name": "process_labels", "ph": "M", "ts": ts, "pid": device, "tid": 0,
         "args": {"labels": f"GPU {device}"}},
        {"name": "thread_name", "ph": "M", "ts": ts, "pid": pid, "tid": pid,
         "args": {"name": f"thread {pid} (pt_main_thread)"}},
        {"name": "thread_name", "ph": "M", "ts": ts, "pid": pid, "tid": autograd_tid,
         "args": {"name": f"thread {autograd_tid} (pt_autograd_0)"}},
    ]
    for stream in STREAMS:
        meta.append({"name": "thread_name", "ph": "M", "ts": ts, "pid": device, "tid": stream,
                     "args": {"name": f"stream {stream} "}})
    return meta


def write_rank(path: Path, head: dict[str, Any], body: list[dict] | bytes, *, level: int = 6,
               body_gz: bytes | None = None) -> None:
    """Write one ``.json.gz`` file: ``head`` plus the events (dicts, or their serialised JSON list).

    ``body_gz``: the body already compressed (a gzip member of its own). The file is then three
    concatenated gzip members — header, body, closing brace — which every gzip reader joins (RFC
    1952), so ranks sharing one event body compress it once.
    """
    head_bytes = orjson.dumps({**head, "traceName": str(path)})
    # '{...header..., "traceEvents": [events]}': splice the pre-serialised list into the object.
    opening = head_bytes[:-1] + b',"traceEvents":'
    if body_gz is not None:
        path.write_bytes(gzip.compress(opening, compresslevel=level) + body_gz + gzip.compress(b"}"))
        return
    if isinstance(body, list):
        body = orjson.dumps(body)
    path.write_bytes(gzip.compress(opening + body + b"}", compresslevel=level))
