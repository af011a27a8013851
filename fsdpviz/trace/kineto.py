"""One Kineto trace file -> the typed tables of one rank (events, lanes, steps, memory, rank).

Kineto writes Chrome-trace JSON: complete events (``ph: "X"``) for CPU ops, annotations, CUDA
runtime calls, kernels and copies; instant events for ``[memory]`` samples; metadata events naming
threads. This module turns them into columns with numpy/pandas operations; per-event Python work
is limited to pulling fields out of the decoded structs and to the few communication events.

Clock: Kineto's ``ts`` is in microseconds, either since the epoch (older traces, integers) or since
``baseTimeNanoseconds`` (recent PyTorch, floats with ns digits). Times become ``int64`` ns on the
wall clock: ``base_time_ns + round(ts * 1000)``, computed from the integer and fractional parts
separately because ``ts * 1000`` for an epoch in µs (~1.7e15) exceeds float64's exact integers.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Final

import numpy as np
import pandas as pd

from fsdpviz.errors import TraceError
from fsdpviz.trace import comms, schema
from fsdpviz.trace.decode import (
    NO_ARGS,
    KinetoTrace,
    TraceEvent,
    decode_raw_json,
    decode_trace,
    read_trace_bytes,
)
from fsdpviz.trace.lanes import build_lanes, name_prefix_mask
from fsdpviz.trace.tables import RankTables

# Kineto categories (current and pre-2.0 spellings, lower-cased) -> event kind.
CATEGORY_KINDS: Final = {
    "cpu_op": schema.KIND_CPU_OP,
    "operator": schema.KIND_CPU_OP,
    "user_annotation": schema.KIND_ANNOTATION,
    "gpu_user_annotation": schema.KIND_GPU_ANNOTATION,
    "kernel": schema.KIND_KERNEL,
    "gpu_memcpy": schema.KIND_MEMCPY,
    "memcpy": schema.KIND_MEMCPY,
    "gpu_memset": schema.KIND_MEMSET,
    "memset": schema.KIND_MEMSET,
    "cuda_runtime": schema.KIND_RUNTIME,
    "cuda_driver": schema.KIND_RUNTIME,
    "runtime": schema.KIND_RUNTIME,
    "hip_runtime": schema.KIND_RUNTIME,
}
GPU_KINDS: Final = frozenset(
    {schema.KIND_KERNEL, schema.KIND_MEMCPY, schema.KIND_MEMSET, schema.KIND_GPU_ANNOTATION}
)
# Complete events of these categories are understood and deliberately not tabled (not "skipped").
IGNORED_CATEGORIES: Final = frozenset({"python_function", "trace", "overhead", "cuda_profiler_range"})
# Phases that carry nothing fsdpviz tables besides X (events) and i/I (memory samples).
IGNORED_PHASES: Final = frozenset({"M", "s", "f", "t", "C", "i", "I"})
STEP_RE: Final = re.compile(r"^ProfilerStep#(\d+)$")
RANK_IN_NAME_RE: Final = re.compile(r"rank[-_]?(\d+)", re.IGNORECASE)
MEMORY_EVENT: Final = "[memory]"


def rank_from_filename(path: Path) -> int | None:
    """Rank written in a file name (``rank3``, ``rank-3``, ``rank_3``), None if there is none."""
    matches = RANK_IN_NAME_RE.findall(path.name)
    return int(matches[-1]) if matches else None


def parse_trace_file(path: Path) -> RankTables:
    """Read, decode and table one Kineto trace file. Raises TraceError for unreadable input."""
    trace, n_bad = decode_trace(read_trace_bytes(path), path)
    if not trace.traceEvents:
        raise TraceError(path, "the trace holds no events (traceEvents is empty)")
    return tables_from_trace(trace, path, n_skipped=n_bad)


def us_to_ns(ts_us: np.ndarray) -> np.ndarray:
    """Microseconds (float64) -> int64 nanoseconds without losing the integer part's precision."""
    whole = np.floor(ts_us)
    return whole.astype(np.int64) * 1000 + np.rint((ts_us - whole) * 1000.0).astype(np.int64)


def tables_from_trace(trace: KinetoTrace, path: Path, *, n_skipped: int = 0) -> RankTables:
    """Build one rank's tables from a decoded trace (pure; ``path`` only names the source)."""
    rank, rank_source = _rank_of(trace, path)
    base_ns = int(trace.baseTimeNanoseconds or 0)
    events_all = trace.traceEvents

    complete = [e for e in events_all if e.ph == "X"]
    n_skipped += sum(1 for e in events_all if e.ph != "X" and e.ph not in IGNORED_PHASES)
    code_of_cat = {cat: _kind_code(cat) for cat in {e.cat for e in complete}}
    kind_codes = np.fromiter((code_of_cat[e.cat] for e in complete), np.int8, len(complete))
    n_skipped += int((kind_codes == _UNKNOWN_CATEGORY).sum())
    usable = np.flatnonzero(kind_codes >= 0)
    info = trace.distributedInfo
    world_size = info.world_size if info and info.world_size else 0
    events, n_bad = _event_columns(
        [complete[i] for i in usable], kind_codes[usable], base_ns, world_size
    )
    n_skipped += n_bad

    thread_names = _thread_names(events_all)
    steps = _steps(events, rank)
    events = _assign_steps(events, steps)
    events, lanes = build_lanes(events, thread_names, rank)
    memory, n_bad_mem = _memory(events_all, base_ns, rank)
    n_skipped += n_bad_mem

    rank_row = pd.DataFrame(
        {
            "rank": [rank],
            "path": [str(path)],
            "world_size": [info.world_size if info and info.world_size else -1],
            "backend": [(info.backend or "") if info else ""],
            "rank_source": [rank_source],
            "base_time_ns": [base_ns],
            "start_ns": [int(events["start_ns"].min()) if len(events) else 0],
            "end_ns": [int((events["start_ns"] + events["dur_ns"]).max()) if len(events) else 0],
            "n_events": [len(events)],
            "n_skipped": [n_skipped],
            "device_name": [_device_name(trace, lanes)],
            "nccl_version": [(info.nccl_version or "") if info else ""],
        }
    )
    events["rank"] = rank
    events = events.sort_values("start_ns", kind="stable", ignore_index=True)
    return RankTables(
        events=schema.conform(events, schema.EVENTS, table="events"),
        lanes=schema.conform(lanes, schema.LANES, table="lanes"),
        steps=schema.conform(steps, schema.STEPS, table="steps"),
        memory=schema.conform(memory, schema.MEMORY, table="memory"),
        rank=schema.conform(rank_row, schema.RANKS, table="ranks"),
    )


def _rank_of(trace: KinetoTrace, path: Path) -> tuple[int, str]:
    info = trace.distributedInfo
    if info is not None and info.rank is not None and info.rank >= 0:
        return int(info.rank), "distributedInfo"
    from_name = rank_from_filename(path)
    if from_name is not None:
        return from_name, "filename"
    return 0, "default"


_NOT_AN_ID: Final = np.iinfo(np.int64).min  # a string pid/tid; real tids may be negative
_IGNORED_CATEGORY: Final = -1
_UNKNOWN_CATEGORY: Final = -2
_GPU_KIND_MASK: Final = np.array([k in GPU_KINDS for k in schema.EVENT_KINDS], dtype=bool)


def _int_ids(values: list[int | str]) -> np.ndarray:
    """pid/tid column; string ids (never on the events fsdpviz tables, but allowed) -> _NOT_AN_ID."""
    try:
        return np.array(values, dtype=np.int64)
    except (TypeError, ValueError, OverflowError):
        return np.array([v if isinstance(v, int) else _NOT_AN_ID for v in values], dtype=np.int64)


def _kind_code(category: str) -> int:
    """Index into schema.EVENT_KINDS; _IGNORED_CATEGORY or _UNKNOWN_CATEGORY otherwise."""
    kind = CATEGORY_KINDS.get(category.lower())
    if kind is not None:
        return schema.EVENT_KINDS.index(kind)
    return _IGNORED_CATEGORY if category.lower() in IGNORED_CATEGORIES else _UNKNOWN_CATEGORY


def _factorize_names(events: list[TraceEvent]) -> tuple[np.ndarray, list[str]]:
    """Category codes of the event names (first-seen order) with one dict lookup per event."""
    index: dict[str, int] = {}
    codes = np.fromiter((index.setdefault(e.name, len(index)) for e in events), np.int32, len(events))
    return codes, list(index)


def _event_columns(
    events: list[TraceEvent], kind_codes: np.ndarray, base_ns: int, world_size: int
) -> tuple[pd.DataFrame, int]:
    """Columns of the usable complete events; drops (and counts) bad times or non-integer ids."""
    n = len(events)
    ts = np.fromiter((e.ts for e in events), np.float64, n)
    dur = np.fromiter((e.dur for e in events), np.float64, n)
    args = [e.args or NO_ARGS for e in events]
    is_gpu = _GPU_KIND_MASK[kind_codes] if n else np.zeros(0, bool)
    pid = _int_ids([e.pid for e in events])
    tid = _int_ids([e.tid for e in events])
    device = np.fromiter((a.device for a in args), np.int64, n)
    stream = np.fromiter((a.stream for a in args), np.int64, n)
    # GPU lanes are (device, stream); events without those args (gpu_user_annotation) use pid/tid.
    key_a = np.where(is_gpu & (device >= 0), device, pid)
    key_b = np.where(is_gpu & (stream >= 0), stream, tid)
    good = np.isfinite(ts) & np.isfinite(dur) & (dur >= 0) & (key_a != _NOT_AN_ID) & (key_b != _NOT_AN_ID)
    name_codes, names = _factorize_names(events)
    columns = {
        "kind": kind_codes,
        "name": name_codes,
        "ts": ts,
        "dur": dur,
        "correlation": np.fromiter((a.correlation for a in args), np.int64, n),
        "external_id": np.fromiter((a.external_id for a in args), np.int64, n),
        "is_gpu": is_gpu,
        "key_a": key_a,
        "key_b": key_b,
    }
    n_bad = int(n - good.sum())
    if n_bad:
        columns = {k: v[good] for k, v in columns.items()}
        args = [a for a, ok in zip(args, good) if ok]
    frame = pd.DataFrame(
        {
            "kind": pd.Categorical.from_codes(columns.pop("kind"), categories=schema.EVENT_KINDS),
            "name": pd.Categorical.from_codes(columns.pop("name"), categories=names),
            "start_ns": us_to_ns(columns.pop("ts")) + base_ns,
            "dur_ns": np.rint(columns.pop("dur") * 1000.0).astype(np.int64),
            **columns,
        }
    )
    _classify_comms(frame, args, world_size)
    return frame, n_bad


def _classify_comms(frame: pd.DataFrame, args: list, world_size: int) -> None:
    """Fill ``comm``, ``comm_bytes`` and ``pg``: names once per distinct name, sizes per comm event."""
    names = frame["name"].cat.categories
    kernel_comm = {n: comms.classify_kernel_name(n) for n in names}
    cpu_comm = {n: comms.classify_cpu_name(n) for n in names}
    is_kernel = (frame["kind"] == schema.KIND_KERNEL).to_numpy()
    by_kernel = frame["name"].map(kernel_comm).astype(object).to_numpy()
    by_cpu = frame["name"].map(cpu_comm).astype(object).to_numpy()
    comm = np.where(is_kernel, by_kernel, np.where(frame["is_gpu"].to_numpy(), "", by_cpu))
    comm_bytes = np.full(len(frame), schema.UNKNOWN_BYTES, dtype=np.int64)
    pg = np.full(len(frame), "", dtype=object)
    names_arr = frame["name"].to_numpy()
    for i in np.flatnonzero(comm != ""):
        a = args[i]
        if a is None:
            continue
        if a.collective:
            comm[i] = comms.collective_from_text(a.collective)
        if a.pg_name:
            pg[i] = a.pg_name
        nbytes = comms.bytes_from_nelems(a.in_nelems, a.out_nelems, a.dtype)
        if nbytes == schema.UNKNOWN_BYTES and a.input_dims:
            gathers = comms.is_gloo_op(names_arr[i]) and comm[i] == schema.COMM_ALL_GATHER
            nbytes = comms.bytes_from_inputs(
                decode_raw_json(a.input_dims),
                decode_raw_json(a.input_type),
                multiplier=(a.group_size or world_size) if gathers else 1,
            )
        comm_bytes[i] = nbytes
    frame["comm"] = pd.Categorical(comm, categories=("",) + schema.COMM_KINDS)
    frame["comm_bytes"] = comm_bytes
    frame["pg"] = pd.Categorical(pg)


def _thread_names(events_all: list[TraceEvent]) -> dict[tuple[int, int], list[str]]:
    """``thread_name`` metadata per (pid, tid), in file order (a thread may be named twice)."""
    names: dict[tuple[int, int], list[str]] = {}
    for e in events_all:
        if (e.ph == "M" and e.name == "thread_name" and e.args is not None and e.args.name
                and isinstance(e.pid, int) and isinstance(e.tid, int)):
            names.setdefault((e.pid, e.tid), []).append(e.args.name)
    return names


def _steps(events: pd.DataFrame, rank: int) -> pd.DataFrame:
    """``ProfilerStep#N`` ranges from the CPU side (GPU-side copies would count steps twice)."""
    cpu = events["kind"].isin([schema.KIND_ANNOTATION, schema.KIND_CPU_OP]).to_numpy()
    cand = events.loc[cpu & name_prefix_mask(events["name"], "ProfilerStep#")]
    step_no = pd.Series([STEP_RE.match(str(n)) for n in cand["name"]], index=cand.index, dtype=object)
    cand = cand.loc[step_no.notna()]
    step_no = step_no.dropna().map(lambda m: int(m.group(1)))  # a few rows: one per step
    steps = pd.DataFrame(
        {
            "rank": rank,
            "step": step_no.astype(np.int64).to_numpy(),
            "start_ns": cand["start_ns"].to_numpy(),
            "end_ns": (cand["start_ns"] + cand["dur_ns"]).to_numpy(),
        }
    )
    steps = steps.groupby("step", as_index=False).agg(
        rank=("rank", "first"), start_ns=("start_ns", "min"), end_ns=("end_ns", "max")
    )
    return steps.sort_values("start_ns", kind="stable").reset_index(drop=True)


def _step_of_times(t_ns: np.ndarray, steps: pd.DataFrame) -> np.ndarray:
    """Step number whose [start, end) contains each time, NO_STEP outside every step."""
    out = np.full(len(t_ns), schema.NO_STEP, dtype=np.int64)
    if steps.empty:
        return out
    starts = steps["start_ns"].to_numpy()
    ends = steps["end_ns"].to_numpy()
    idx = np.searchsorted(starts, t_ns, side="right") - 1
    inside = (idx >= 0) & (t_ns < ends[np.clip(idx, 0, None)])
    out[inside] = steps["step"].to_numpy()[idx[inside]]
    return out


def _assign_steps(events: pd.DataFrame, steps: pd.DataFrame) -> pd.DataFrame:
    """Step per event; GPU events take their launch's step (they run later than they are issued).

    When the trace has launch records, a GPU event without one was launched before tracing began
    and gets NO_STEP; without any launch records GPU events fall back to the step by time.
    """
    step = _step_of_times(events["start_ns"].to_numpy(), steps)
    is_gpu = events["is_gpu"].to_numpy()
    corr = events["correlation"].to_numpy()
    launches = (events["kind"] == schema.KIND_RUNTIME).to_numpy() & (corr >= 0)
    if launches.any() and is_gpu.any():
        launch_step = pd.Series(step[launches], index=corr[launches])
        launch_step = launch_step[~launch_step.index.duplicated()]
        launch_ext = pd.Series(events["external_id"].to_numpy()[launches], index=corr[launches])
        launch_ext = launch_ext[~launch_ext.index.duplicated()]
        gpu_corr = pd.Series(corr[is_gpu])
        mapped = gpu_corr.map(launch_step).to_numpy()
        known = ~np.isnan(mapped)
        gpu_idx = np.flatnonzero(is_gpu)
        # Work launched before the trace began belongs to no traced step (as in HTA).
        step[gpu_idx] = np.where(known, np.nan_to_num(mapped, nan=schema.NO_STEP), schema.NO_STEP)
        # ROCm kernels carry no External id: take the launching runtime call's.
        ext = events["external_id"].to_numpy().copy()
        missing = ext[gpu_idx] < 0
        if missing.any():
            ext_mapped = gpu_corr.map(launch_ext).to_numpy()
            fill = missing & ~np.isnan(ext_mapped)
            ext[gpu_idx[fill]] = ext_mapped[fill].astype(np.int64)
            events["external_id"] = ext
    events["step"] = step
    return events


def _memory(events_all: list[TraceEvent], base_ns: int, rank: int) -> tuple[pd.DataFrame, int]:
    samples = [
        e for e in events_all if e.name == MEMORY_EVENT and e.ph in ("i", "I") and e.args is not None
    ]
    good = [
        e for e in samples
        if e.ts is not None and e.args.total_allocated is not None and e.ts == e.ts
    ]
    if not good:
        return schema.make_empty(schema.MEMORY), len(samples)
    ts = np.array([e.ts for e in good], dtype=np.float64)
    dev_type = [e.args.device_type for e in good]
    dev_id = [e.args.device_id if e.args.device_id is not None else 0 for e in good]
    memory = pd.DataFrame(
        {
            "rank": rank,
            "device": [_device_label(t, i) for t, i in zip(dev_type, dev_id)],
            "t_ns": us_to_ns(ts) + base_ns,
            "allocated_bytes": [e.args.total_allocated for e in good],
            "reserved_bytes": [e.args.total_reserved if e.args.total_reserved is not None else -1 for e in good],
            "delta_bytes": [e.args.alloc_bytes if e.args.alloc_bytes is not None else 0 for e in good],
        }
    )
    return memory.sort_values("t_ns", kind="stable").reset_index(drop=True), len(samples) - len(good)


def _device_label(device_type: int | None, device_id: int) -> str:
    # c10::DeviceType: 0 CPU, 1 CUDA (ROCm builds report HIP devices as CUDA too).
    if device_type in (None, 0):
        return "cpu"
    if device_type == 1:
        return f"cuda:{device_id}"
    return f"device{device_type}:{device_id}"


def _device_name(trace: KinetoTrace, lanes: pd.DataFrame) -> str:
    props = [p for p in (trace.deviceProperties or []) if p.name]
    if not props:
        return ""
    gpu = lanes.loc[lanes["lane_kind"] == schema.LANE_GPU_STREAM]
    used = int(gpu["device"].iloc[gpu["n_events"].argmax()]) if len(gpu) else None
    for p in props:
        if p.id == used:
            return str(p.name)
    return str(props[0].name)
