"""One Chrome-trace JSON for the whole run, with FSDP units as tracks: ``fsdpviz export --format perfetto``.

Perfetto (ui.perfetto.dev, the trace processor) and chrome://tracing open it. Per rank it holds:

- the rank's original events of the kept steps (those that start within them, those the steps launched
  that ran after them, the device work of an earlier step that runs into them; ``--no-raw`` leaves them
  out), its processes named ``rank R`` and
  ``rank R · GPU d``, its threads and streams named as in the trace, on the analysis' aligned clock;
  launch -> kernel flow arrows; the allocator samples as ``[memory]`` events and as a counter;
- a process ``rank R · FSDP units`` with a track per kind of work (all-gather, copy-in, compute,
  copy-out, reduce-scatter, all-reduce) holding one slice per unit span, named by unit and phase; a
  track of exposed-communication slices; flow arrows from each all-gather to the compute it fed.

Perfetto nests the complete events of one track and drops those that overlap partially. The raw
traces break this (``Optimizer.step`` crossing a ``ProfilerStep#N`` boundary on one thread, prefetched
all-gathers on one stream), so every track is checked and an event that would cross its parent moves
to an extra track of the same name with ``(overlapping)`` appended.

The file also lists which process belongs to which rank (``fsdpvizRanks``, with each rank's timers
from the run folder, and on the first rank the timer files whose torn last line was left out) and carries the run folder's run.json (``fsdpvizRun``): fsdpviz's loader reads an
export back as the run it came from, with the same units, parameters, step times and memory (the raw
events keep their collectives' element counts and types and their allocator blocks' addresses).
"""

from __future__ import annotations

import gzip
import json
import os
import re
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import numpy as np
import pandas as pd

from fsdpviz.analysis.pipeline import RunResult
from fsdpviz.errors import RunFolderError, UsageError
from fsdpviz.formatting import MIB
from fsdpviz.runfolder import to_builtins
from fsdpviz.structure.intervals import subtract_intervals, union_intervals
from fsdpviz.structure.parallelism import parse_groups
from fsdpviz.trace import comms, schema
from fsdpviz.trace.frames import CPU_DEVICE, measured_baseline
from fsdpviz.vocabulary import (
    ALL_GATHER,
    ALL_REDUCE,
    COMPUTE,
    COPY_IN,
    COPY_OUT,
    REDUCE_SCATTER,
    UNIT_COLLECTIVES,
)

EXPORT_KEY: Final = "fsdpvizRanks"
RUN_KEY: Final = "fsdpvizRun"  # the run folder's run.json, read back as the run's (trace/onerun.py)
EXPORT_CATEGORY: Final = "fsdpviz"  # unit tracks: the loader knows the category and does not table it
CATEGORY_OF_KIND: Final = {
    schema.KIND_CPU_OP: "cpu_op", schema.KIND_ANNOTATION: "user_annotation",
    schema.KIND_GPU_ANNOTATION: "gpu_user_annotation", schema.KIND_KERNEL: "kernel",
    schema.KIND_MEMCPY: "gpu_memcpy", schema.KIND_MEMSET: "gpu_memset", schema.KIND_RUNTIME: "cuda_runtime",
}
_DEVICE_KINDS: Final = (schema.KIND_KERNEL, schema.KIND_MEMCPY, schema.KIND_MEMSET, schema.KIND_GPU_ANNOTATION)
UNIT_TRACKS: Final = (ALL_GATHER, COPY_IN, COMPUTE, COPY_OUT, REDUCE_SCATTER, ALL_REDUCE)
PID_BASE: Final = 1_000_000  # export pids: PID_BASE * (rank + 1) + the rank's process index
UNITS_PROCESS: Final = 999  # the rank's "FSDP units" process index
EXPOSED_TID: Final = 100
COUNTER_NAME: Final = "allocated (MiB)"


@dataclass(frozen=True, slots=True)
class PerfettoResult:
    path: Path
    size_bytes: int
    ranks: int
    events: int


def _us(ns: np.ndarray | float) -> Any:
    return np.round(np.asarray(ns, dtype=np.float64) / 1e3, 3)


class _Writer:
    """Collects events, then nests every track (see the module docstring)."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self.meta: list[dict[str, Any]] = []
        self.track_names: dict[tuple[int, int], str] = {}
        self.moved: dict[tuple[int, int], int] = {}  # overflow track -> the thread its events came from

    def process(self, pid: int, name: str, order: int) -> None:
        self.meta.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": name}})
        self.meta.append({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "args": {"sort_index": order}})

    def thread(self, pid: int, tid: int, name: str, order: int | None = None) -> None:
        self.track_names[(pid, tid)] = name
        self.meta.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": name}})
        if order is not None:
            self.meta.append({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid,
                              "args": {"sort_index": order}})

    def nested(self) -> list[dict[str, Any]]:
        """Every complete event on a track where it nests; crossing ones on overflow tracks."""
        by_track: dict[tuple[int, int], list[dict[str, Any]]] = defaultdict(list)
        others: list[dict[str, Any]] = []
        for e in self.events:
            (by_track[(e["pid"], e["tid"])] if e["ph"] == "X" else others).append(e)
        out: list[dict[str, Any]] = []
        for (pid, tid), events in by_track.items():
            events.sort(key=lambda e: (e["ts"], -e["dur"]))
            levels: list[list[float]] = []  # per overflow level: stack of open end times
            for e in events:
                start, end = e["ts"], e["ts"] + e["dur"]
                for level, stack in enumerate(levels):
                    while stack and stack[-1] <= start:
                        stack.pop()
                    if not stack or end <= stack[-1]:
                        stack.append(end)
                        break
                else:
                    level = len(levels)
                    levels.append([end])
                if level:
                    new_tid = tid * 1000 + level if tid > 0 else tid - 1000 * level
                    self.moved[(pid, new_tid)] = tid
                    if (pid, new_tid) not in self.track_names:
                        self.thread(pid, new_tid, f"{self.track_names.get((pid, tid), str(tid))} (overlapping)")
                    e = {**e, "tid": new_tid}
                out.append(e)
        return self.meta + out + others


def _rank_pids(lanes: pd.DataFrame, rank: int) -> dict[int, int]:
    """The rank's original pids -> export pids (CPU process first, then devices)."""
    mine = lanes[lanes["rank"] == rank]
    cpu = sorted(set(mine.loc[mine["device"] < 0, "pid"].astype(int)))
    gpu = sorted(set(mine.loc[mine["device"] >= 0, "pid"].astype(int)) - set(cpu))
    return {pid: PID_BASE * (rank + 1) + i for i, pid in enumerate(cpu + gpu)}


def export_perfetto(result: RunResult, output: str | Path, *, steps: Sequence[int] | None = None,
                    ranks: Sequence[int] | None = None, raw: bool = True) -> PerfettoResult:
    """Write the run as one Perfetto / chrome://tracing file (gzip when ``output`` ends in ``.gz``).

    Args:
        result: the analysed run.
        output: the file to write; its folder must exist.
        steps: analysed steps to keep (default: all analysed steps).
        ranks: ranks to keep (default: all).
        raw: also write the ranks' original events (False: unit tracks, memory and steps only).
    """
    out = Path(output)
    if not out.parent.is_dir():
        raise RunFolderError(f"{out}: cannot write the export: folder {out.parent} does not exist")
    analysis = result.analysis
    wanted_ranks = sorted(set(ranks) if ranks is not None else set(analysis.ranks))
    unknown = sorted(set(wanted_ranks) - set(analysis.ranks))
    if unknown:
        raise UsageError(f"--ranks: no analysed rank {', '.join(map(str, unknown))} (ranks: {analysis.ranks})")
    wanted_steps = sorted(set(steps) if steps is not None else set(analysis.steps))
    missing = sorted(set(wanted_steps) - set(analysis.steps))
    if missing:
        raise UsageError(f"--steps: {', '.join(map(str, missing))} not analysed (analysed: {analysis.steps})")
    traces = result.aligned_detail(wanted_ranks)
    times = analysis.step_times[analysis.step_times["step"].isin(wanted_steps)]
    base_ns = int(times["start_ns"].min()) if len(times) else 0
    writer = _Writer()
    ranks_info = []
    events = traces.events if raw else traces.events.iloc[:0]
    memory = traces.memory
    for rank in wanted_ranks:
        mine = times[times["rank"] == rank]
        if mine.empty:
            continue
        lo, hi = int(mine["start_ns"].min()), int(mine["end_ns"].max())
        pids = _rank_pids(traces.lanes, rank)
        ranks_info.append({"rank": rank, "world_size": analysis.world_size,
                           "pids": {str(v): k for k, v in pids.items()},
                           "complete_steps": sorted(int(s) for s in mine["step"]),
                           **_trace_facts(traces.ranks, rank),
                           # what reading the export back needs, which an export without the events is not
                           "timers": _timer_rows(result.traces.timers, rank) if raw else []})
        if raw:
            _raw(writer, events, traces.lanes, rank, pids, lo, hi, base_ns, wanted_steps)
        _memory(writer, memory if raw else None, analysis.memory, rank, pids, lo, hi, base_ns,
                baseline=measured_baseline(result.traces.run).get(rank, 0))
        _units(writer, analysis.spans, rank, wanted_steps, base_ns)
    trace_events = writer.nested()
    torn = _torn_timers(result.traces.torn_timers, result.traces.run_dir, wanted_ranks)
    if ranks_info and raw and torn:  # the timers' note travels with the timers
        ranks_info[0]["torn_timers"] = torn
    for info in ranks_info:  # the overflow tracks of the rank's processes, so that reading back undoes them
        info["tids"] = {f"{pid}:{tid}": back for (pid, tid), back in writer.moved.items() if str(pid) in info["pids"]}
    document: dict[str, Any] = {"traceEvents": trace_events, "displayTimeUnit": "ms",
                                "baseTimeNanoseconds": base_ns, EXPORT_KEY: ranks_info}
    if result.traces.run is not None and raw:
        document[RUN_KEY] = to_builtins(result.traces.run)
    # UTF-8 as is: Perfetto shows \uXXXX escapes in names literally
    data = json.dumps(document, separators=(",", ":"), ensure_ascii=False).encode()
    tmp = out.with_name(f".{out.name}.tmp")
    try:
        tmp.write_bytes(gzip.compress(data, compresslevel=6) if out.name.endswith(".gz") else data)
        os.replace(tmp, out)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise RunFolderError(f"{out}: cannot write the export: {exc.strerror or exc}") from exc
    return PerfettoResult(path=out, size_bytes=out.stat().st_size, ranks=len(ranks_info),
                          events=len(trace_events))


def _torn_timers(torn: Sequence[str], run_dir: str | None, ranks: Sequence[int]) -> list[str]:
    """The timer files whose torn last line the analysis left out, of the exported ``ranks`` (a file the
    run folder names ``timers/rank{R}.jsonl`` of another rank is not in the export; one named otherwise
    is kept, its rank unknown), named from the run folder (``timers/rank1.jsonl``): the export is read on
    other machines, where this one's paths mean nothing."""
    out = []
    for name in torn:
        path = Path(name)
        named = re.fullmatch(r"rank([0-9]+)\.jsonl", path.name)
        if named is not None and int(named.group(1)) not in ranks:
            continue
        if run_dir is not None and path.is_relative_to(run_dir):
            path = path.relative_to(run_dir)
        out.append(path.as_posix())
    return out


def _timer_rows(timers: pd.DataFrame, rank: int) -> list[dict[str, Any]]:
    """The rank's timer records as the run folder's ``timers/rank{R}.jsonl`` holds them (every step:
    the clean steps the run's step time is read from lie outside the profiled ones)."""
    mine = timers[timers["rank"] == rank]
    return [{"rank": int(r.rank), "step": int(r.step), "unit": str(r.unit), "phase": str(r.phase),
             "kind": str(r.kind), "ms": None if pd.isna(r.ms) else float(r.ms), "bytes": int(r.bytes)}
            for r in mine.itertuples(index=False)]


def _comm_args(nbytes: int, dtype: str, numel: int) -> dict[str, Any]:
    """A collective's size as the loader reads it back (trace/kineto.py): its element count and type
    where the type is known (the units' parameter counts are read from them), else its bytes as bytes;
    ``Input Dims`` carry the tensor a host backend ran it on (``comm_numel``)."""
    args: dict[str, Any] = {}
    size = comms.dtype_bytes(dtype) if dtype else None
    if nbytes > 0 and size and nbytes % size == 0:
        args.update({"In msg nelems": nbytes // size, "Out msg nelems": nbytes // size, "dtype": dtype})
    elif nbytes > 0:  # bytes as bytes: nelems of a one-byte dtype
        args.update({"In msg nelems": nbytes, "Out msg nelems": nbytes, "dtype": "Byte"})
    if numel >= 0:
        args["Input Dims"] = [[numel]]
    return args


def _trace_facts(ranks: pd.DataFrame, rank: int) -> dict[str, Any]:
    """What the rank's trace said of itself beside its events (RANKS): its backend, NCCL version,
    process groups (distributedInfo's ``pg_config``, from which the parallelism is read) and device."""
    row = ranks[ranks["rank"] == rank]
    if row.empty:
        return {}
    r = row.iloc[0]
    groups = [{"pg_desc": g.desc, "pg_size": g.size, "pg_name": g.name}
              for g in parse_groups(str(r["process_groups"] or ""))]
    facts: dict[str, Any] = {"backend": str(r["backend"] or ""), "nccl_version": str(r["nccl_version"] or ""),
                             "pg_config": groups, "run_id": str(r["run_id"] or "")}
    if str(r["device_name"] or ""):
        facts["device_name"] = str(r["device_name"])
        facts["device_memory_bytes"] = int(r["device_memory_bytes"])
    return facts


def _raw(writer: _Writer, events: pd.DataFrame, lanes: pd.DataFrame, rank: int, pids: dict[int, int],
         lo: int, hi: int, base_ns: int, steps: Sequence[int]) -> None:
    """The rank's events of the kept ``steps`` (from ``lo`` to ``hi``), with their lanes' names."""
    mine_lanes = lanes[lanes["rank"] == rank]
    lane_pid = dict(zip(mine_lanes["lane"].astype(str), mine_lanes["pid"].astype(int)))
    lane_tid = dict(zip(mine_lanes["lane"].astype(str), mine_lanes["tid"].astype(int)))
    for pid_orig, pid in pids.items():
        gpu = bool((mine_lanes.loc[mine_lanes["pid"] == pid_orig, "device"] >= 0).any())
        writer.process(pid, f"rank {rank}" + (f" · GPU {pid_orig}" if gpu else ""), (rank + 1) * 10 + (1 if gpu else 0))
    for row in mine_lanes.sort_values("order").itertuples():
        writer.thread(pids[int(row.pid)], int(row.tid), str(row.thread_name or row.lane), int(row.order))
    # the events that start within the kept steps, those of the kept steps that run after them, and the
    # device work of an earlier step that runs into them (a GPU lags its host): what the analysis of those
    # steps read. A host op of an earlier step is left out with that step's allocator samples.
    start = events["start_ns"]
    device = events["kind"].astype(str).isin(_DEVICE_KINDS) & (start + events["dur_ns"] > lo)
    ev = events[((events["rank"] == rank) & (((start < hi) & ((start >= lo) | device))
                                             | events["step"].isin(list(steps)))).to_numpy()]
    if ev.empty:
        return
    lane = ev["lane"].astype(str).to_numpy()
    ts = _us(ev["start_ns"].to_numpy(np.int64) - base_ns)
    dur = _us(ev["dur_ns"].to_numpy(np.int64))
    names = ev["name"].astype(str).to_numpy()
    kinds = ev["kind"].astype(str).to_numpy()
    corr = ev["correlation"].to_numpy(np.int64)
    ext = ev["external_id"].to_numpy(np.int64)
    comm = ev["comm"].astype(str).to_numpy()
    nbytes = ev["comm_bytes"].to_numpy(np.int64)
    dtypes = ev["comm_dtype"].astype(str).to_numpy()
    numels = ev["comm_numel"].to_numpy(np.int64)
    pg = ev["pg"].astype(str).to_numpy()
    launches: dict[int, tuple[int, int, float]] = {}
    kernels: dict[int, tuple[int, int, float]] = {}
    for i in range(len(ev)):
        pid, tid = pids[lane_pid[lane[i]]], lane_tid[lane[i]]
        args: dict[str, Any] = {}
        if corr[i] >= 0:
            args["correlation"] = int(corr[i])
        if ext[i] >= 0:
            args["External id"] = int(ext[i])
        if comm[i]:
            args["Collective name"] = comm[i]
            args.update(_comm_args(int(nbytes[i]), str(dtypes[i]), int(numels[i])))
            if pg[i]:
                args["Process Group Name"] = pg[i]
        writer.events.append({"ph": "X", "cat": CATEGORY_OF_KIND.get(kinds[i], "cpu_op"), "name": names[i],
                              "pid": pid, "tid": tid, "ts": float(ts[i]), "dur": float(dur[i]), "args": args})
        if corr[i] >= 0:
            (kernels if kinds[i] in (schema.KIND_KERNEL, schema.KIND_MEMCPY, schema.KIND_MEMSET)
             else launches if kinds[i] == schema.KIND_RUNTIME else {})[int(corr[i])] = (pid, tid, float(ts[i]))
    for c, (pid, tid, t) in launches.items():
        if c in kernels:
            kpid, ktid, kt = kernels[c]
            writer.events.append({"ph": "s", "cat": "ac2g", "name": "launch", "id": c, "pid": pid, "tid": tid, "ts": t})
            writer.events.append({"ph": "f", "bp": "e", "cat": "ac2g", "name": "launch", "id": c, "pid": kpid,
                                  "tid": ktid, "ts": kt})


def _memory(writer: _Writer, samples: pd.DataFrame | None, curve: pd.DataFrame, rank: int, pids: dict[int, int],
            lo: int, hi: int, base_ns: int, *, baseline: int = 0) -> None:
    """Every allocator sample as a ``[memory]`` event (what the loader reads back; only with the raw
    events), and the analysis' memory curve (thinned, peaks kept) as a counter track. ``baseline``:
    what the recorder measured alive on the rank's CPU when the trace began, which the run's level
    holds and the profiler's does not; the events keep the profiler's level, as run.json's
    measurement travels with the export and is added again when it is read back."""
    pid = PID_BASE * (rank + 1) + UNITS_PROCESS if not pids or samples is None else next(iter(pids.values()))
    if samples is not None:
        mem = samples[(samples["rank"] == rank) & (samples["t_ns"] >= lo) & (samples["t_ns"] <= hi)]
        ts = _us(mem["t_ns"].to_numpy(np.int64) - base_ns)
        for t, device, alloc, reserved, delta, addr in zip(ts, mem["device"].astype(str), mem["allocated_bytes"],
                                                           mem["reserved_bytes"], mem["delta_bytes"], mem["addr"]):
            kind, _, index = device.partition(":")
            args = {"Total Allocated": int(alloc) - (baseline if device == CPU_DEVICE else 0), "Total Reserved": int(reserved), "Bytes": int(delta),
                    "Device Type": 0 if kind == "cpu" else 1, "Device Id": int(index) if index.isdigit() else -1}
            if addr >= 0:  # pairs a free with its allocation, as in the trace
                args["Addr"] = int(addr)
            writer.events.append({"ph": "i", "s": "t", "cat": "cpu_instant_event", "name": "[memory]", "pid": pid,
                                  "tid": 0, "ts": float(t), "args": args})
    mem = curve[(curve["rank"] == rank) & (curve["t_ns"] >= lo) & (curve["t_ns"] <= hi)]
    ts = _us(mem["t_ns"].to_numpy(np.int64) - base_ns)
    for t, device, alloc in zip(ts, mem["device"].astype(str), mem["allocated_bytes"]):
        writer.events.append({"ph": "C", "name": f"{COUNTER_NAME} · {device}", "pid": pid, "ts": float(t),
                              "args": {"allocated": round(int(alloc) / MIB, 3)}})


def _units(writer: _Writer, spans: pd.DataFrame, rank: int, steps: Iterable[int], base_ns: int) -> None:
    """The rank's unit spans by kind of work, exposed communication, all-gather -> compute arrows."""
    sp = spans[(spans["rank"] == rank) & spans["step"].isin(list(steps)) & spans["kind"].isin(UNIT_TRACKS)]
    pid = PID_BASE * (rank + 1) + UNITS_PROCESS
    writer.process(pid, f"rank {rank} · FSDP units", (rank + 1) * 10 + 5)
    for i, kind in enumerate(UNIT_TRACKS):
        writer.thread(pid, i + 1, kind.replace("_", "-"), i)
    writer.thread(pid, EXPOSED_TID, "exposed communication", len(UNIT_TRACKS))
    if sp.empty:
        return
    tids = {k: i + 1 for i, k in enumerate(UNIT_TRACKS)}
    unit = sp["unit"].astype(str).where(sp["unit"].astype(str) != "", "(optimizer)").to_numpy()
    phase, kind = sp["phase"].astype(str).to_numpy(), sp["kind"].astype(str).to_numpy()
    start, end = sp["start_ns"].to_numpy(np.int64), sp["end_ns"].to_numpy(np.int64)
    step, micro = sp["step"].to_numpy(), sp["micro"].to_numpy()
    ts, dur = _us(start - base_ns), _us(end - start)
    flows: dict[tuple[Any, ...], dict[str, float]] = {}
    for i in range(len(sp)):
        writer.events.append({"ph": "X", "cat": EXPORT_CATEGORY, "name": f"{unit[i]} {kind[i].replace('_', '-')}",
                              "pid": pid, "tid": tids[kind[i]], "ts": float(ts[i]), "dur": float(dur[i]),
                              "args": {"unit": unit[i], "phase": phase[i], "step": int(step[i]),
                                       "micro": int(micro[i])}})
        key = (unit[i], phase[i], int(step[i]), int(micro[i]))
        if kind[i] == ALL_GATHER:
            flows.setdefault(key, {})["from"] = float(ts[i] + dur[i])
        elif kind[i] == COMPUTE:
            here = flows.setdefault(key, {})
            here["to"] = min(here.get("to", float(ts[i])), float(ts[i]))
    for n, (key, ends) in enumerate(sorted(flows.items(), key=lambda kv: str(kv[0]))):
        if "from" in ends and "to" in ends:
            fid = (rank + 1) * 10_000_000 + n
            writer.events.append({"ph": "s", "cat": EXPORT_CATEGORY, "name": "all-gather -> compute", "id": fid,
                                  "pid": pid, "tid": tids[ALL_GATHER], "ts": ends["from"]})
            writer.events.append({"ph": "f", "bp": "e", "cat": EXPORT_CATEGORY, "name": "all-gather -> compute",
                                  "id": fid, "pid": pid, "tid": tids[COMPUTE], "ts": max(ends["to"], ends["from"])})
    comm = sp["kind"].isin(list(UNIT_COLLECTIVES)).to_numpy()
    busy = union_intervals(start[~comm & (kind == COMPUTE)], end[~comm & (kind == COMPUTE)])
    exposed = subtract_intervals(union_intervals(start[comm], end[comm]), busy)
    for a, b in zip(*exposed):
        writer.events.append({"ph": "X", "cat": EXPORT_CATEGORY, "name": "exposed communication", "pid": pid,
                              "tid": EXPOSED_TID, "ts": float(_us(a - base_ns)), "dur": float(_us(b - a)),
                              "args": {}})
