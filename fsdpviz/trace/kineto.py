"""One Kineto trace file -> the columns of one rank's tables (events, lanes, steps, memory, rank).

Kineto writes Chrome-trace JSON: complete events (``ph: "X"``) for CPU ops, annotations, CUDA
runtime calls, kernels and copies; instant events for ``[memory]`` samples; metadata events naming
threads. The file is decoded in batches (``stream``; the whole file at once on the slow path,
``decode``), each batch turned into numpy columns (``columns``), and the rank's tables are built
from those columns with numpy alone: this runs in parser processes that never import pandas, and
what they send back is a few flat arrays per table (:class:`RankColumns`).

Clock: Kineto's ``ts`` is in microseconds, either since the epoch (older traces, integers) or since
``baseTimeNanoseconds`` (recent PyTorch, floats with ns digits). Times become ``int64`` ns on the
wall clock: ``base_time_ns + round(ts * 1000)``, computed from the integer and fractional parts
separately because ``ts * 1000`` for an epoch in µs (~1.7e15) exceeds float64's exact integers.
"""

from __future__ import annotations

import gc
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import numpy as np

from fsdpviz import vocabulary
from fsdpviz.errors import TraceError
from fsdpviz.trace import comms, schema
from fsdpviz.trace.decode import (
    DeviceProperties,
    DistributedInfo,
    ExportRank,
    KinetoTrace,
    TraceEvent,
    decode_raw_json,
    decode_trace,
    read_trace_bytes,
)
from fsdpviz.trace.event_columns import COMM_CATEGORIES, GPU_KIND_MASK, CommArgs, EventColumns, MemorySamples
from fsdpviz.trace.lanes import build_lanes, prefix_hits
from fsdpviz.trace.stream import StreamFallback, iter_event_batches

STEP_RE: Final = re.compile(r"^ProfilerStep#(\d+)$")
INT32_MAX: Final = 2**31 - 1  # ranks, world sizes and step numbers beyond it come from damaged traces
# baseTimeNanoseconds is wall-clock ns; 3e18 is the year 2065. With |ts|, dur < 3e15 µs (see
# columns.MAX_TIME_US) every start and end then fits in int64 ns.
MAX_BASE_TIME_NS: Final = 3 * 10**18
RANK_IN_NAME_RE: Final = re.compile(r"rank[-_]?(\d+)", re.IGNORECASE)
# Keys of an export's ranks' RANKS rows beside the schema's columns (which tables drop): what the run
# folder held beside the traces, read back by trace/onerun.py
EXPORT_RUN: Final = "export_run_json"
EXPORT_TIMERS: Final = "export_timers_json"
EXPORT_TORN: Final = "export_torn_timers_json"
_RUNTIME_CODE: Final = schema.EVENT_KINDS.index(schema.KIND_RUNTIME)
_KERNEL_CODE: Final = schema.EVENT_KINDS.index(schema.KIND_KERNEL)
# The CPU ops autograd runs in a backward pass: a trace that holds none holds no training step.
BACKWARD_PREFIX: Final = "autograd::engine::evaluate_function"
_CPU_STEP_KINDS: Final = np.array(
    [k in (schema.KIND_ANNOTATION, schema.KIND_CPU_OP) for k in schema.EVENT_KINDS], dtype=bool
)


@dataclass(kw_only=True, slots=True)
class RankColumns:
    """One rank's tables as plain columns: compact to send between processes, cheap to concatenate.

    ``events`` holds the EVENTS columns but ``rank``, sorted by start time; its categorical columns
    are integer codes: ``kind`` into ``schema.EVENT_KINDS``, ``comm`` into ``COMM_CATEGORIES``,
    ``lane`` / ``name`` / ``pg`` into ``categories``. ``memory["device"]`` codes into
    ``categories["device"]``. ``lanes``, ``steps`` and ``memory`` hold their schema's columns but
    ``rank``; ``rank`` is the RANKS row.
    """

    events: dict[str, np.ndarray]
    categories: dict[str, list[str]]
    lanes: dict[str, list[Any]]
    steps: dict[str, np.ndarray]
    memory: dict[str, np.ndarray]
    rank: dict[str, Any]

    @property
    def rank_id(self) -> int:
        return int(self.rank["rank"])

    @property
    def n_events(self) -> int:
        return len(self.events["start_ns"])


def rank_from_filename(path: Path) -> int | None:
    """Rank written in a file name (``rank3``, ``rank-3``, ``rank_3``), None if there is none."""
    matches = RANK_IN_NAME_RE.findall(path.name)
    return int(matches[-1]) if matches else None


def parse_trace_file(path: Path) -> RankColumns:
    """Read, decode and table one Kineto trace file. Raises TraceError for unreadable input."""
    # Parsing creates no reference cycles, but enough objects to set off full collections that
    # walk every list of events: ~10 % of the time on a trace of a million events.
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        return _parse(path)[0]
    finally:
        if was_enabled:
            gc.enable()


def parse_trace_ranks(path: Path) -> list[RankColumns]:
    """Like :func:`parse_trace_file`, for a file that may hold several ranks: an fsdpviz Perfetto
    export (``fsdpvizRanks``) gives one table set per rank it lists, any other trace one."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        tables, top = _parse(path)
        if not top.fsdpvizRanks:
            return [tables]
        del tables
        return _split_export(path)
    finally:
        if was_enabled:
            gc.enable()


def _split_export(path: Path) -> list[RankColumns]:
    """The ranks of an fsdpviz export, each with its own pids back and its distributedInfo."""
    trace, n_bad = decode_trace(read_trace_bytes(path), path)
    owners: dict[int, tuple[ExportRank, int]] = {}
    for info in trace.fsdpvizRanks or []:
        for export_pid, original in info.pids.items():
            owners[int(export_pid)] = (info, int(original))
    # an event the export moved to an overflow track (it crossed its parent there) goes back to its thread;
    # the overflow tracks' own names are the export's, not the trace's
    moved = {key: tid for info in trace.fsdpvizRanks or [] for key, tid in info.tids.items()}
    per_rank: dict[int, list[TraceEvent]] = {info.rank: [] for info in trace.fsdpvizRanks or []}
    for event in trace.traceEvents:
        owner = owners.get(event.pid) if isinstance(event.pid, int) else None
        if owner is not None:
            back = moved.get(f"{event.pid}:{event.tid}") if moved else None
            if back is not None:
                if event.ph == "M":
                    continue
                event.tid = back
            event.pid = owner[1]
            per_rank[owner[0].rank].append(event)
    out: list[RankColumns] = []
    for info in trace.fsdpvizRanks or []:
        columns = EventColumns()
        columns.add(per_rank[info.rank])
        name, memory = _raw_of(info.device_name, str), _raw_of(info.device_memory_bytes, int)
        device = [DeviceProperties(name=name, totalGlobalMem=memory)] if name else trace.deviceProperties
        top = KinetoTrace(traceEvents=[], baseTimeNanoseconds=trace.baseTimeNanoseconds, deviceProperties=device,
                          fsdpvizRunId=_raw_of(info.run_id, str),
                          distributedInfo=DistributedInfo(rank=info.rank, world_size=info.world_size,
                                                          backend=info.backend,
                                                          nccl_version=_raw_of(info.nccl_version, str),
                                                          pg_config=info.pg_config))
        tables = rank_columns(columns, top, path, n_skipped=n_bad, complete_steps=info.complete_steps,
                              export=True)
        # what the run folder held beside the traces, as text through the parse cache (trace/onerun.py);
        # run.json once per file, on its first rank
        tables.rank[EXPORT_TIMERS] = bytes(info.timers).decode() if info.timers else ""
        tables.rank[EXPORT_TORN] = bytes(info.torn_timers).decode() if info.torn_timers else ""
        tables.rank[EXPORT_RUN] = bytes(trace.fsdpvizRun).decode() if trace.fsdpvizRun and not out else ""
        out.append(tables)
    return out


def _raw_of(raw: Any, kind: type) -> Any:
    """An export's raw value if it is a ``kind`` (an int not a bool), else None."""
    value = decode_raw_json(raw)
    return value if isinstance(value, kind) and not isinstance(value, bool) else None


def _parse(path: Path) -> tuple[RankColumns, KinetoTrace]:
    columns = EventColumns()
    header: list[KinetoTrace] = []
    n_bad = 0
    try:
        for batch in iter_event_batches(path, header):
            columns.add(batch)
            del batch
    except StreamFallback:
        # Whatever stopped the batch reader, the whole-file decoder handles it or names the problem.
        trace, n_bad = decode_trace(read_trace_bytes(path), path)
        if not trace.traceEvents:
            raise TraceError(path, f"the trace holds no readable event: its {n_bad} event(s) are malformed (a field "
                                   "missing or of the wrong type)" if n_bad else
                                   "the trace holds no events (traceEvents is empty)") from None
        columns = EventColumns()
        columns.add(trace.traceEvents)
        trace.traceEvents = []
        header = [trace]
    return rank_columns(columns, header[0], path, n_skipped=n_bad), header[0]


def _count_named(name_codes: np.ndarray, names: list[str], prefix: str) -> int:
    """How many events have a name that starts with ``prefix``."""
    codes = [i for i, n in enumerate(names) if n.startswith(prefix)]
    return int(np.count_nonzero(np.isin(name_codes, codes))) if codes else 0


def us_to_ns(ts_us: np.ndarray) -> np.ndarray:
    """Microseconds (float64) -> int64 nanoseconds without losing the integer part's precision."""
    whole = np.floor(ts_us)
    return whole.astype(np.int64) * 1000 + np.rint((ts_us - whole) * 1000.0).astype(np.int64)


def rank_columns(columns: EventColumns, top: KinetoTrace, path: Path, *, n_skipped: int = 0,
                 complete_steps: list[int] | None = None, export: bool = False) -> RankColumns:
    """Build one rank's tables from its decoded events (pure; ``path`` only names the source)."""
    rank, rank_source = _rank_of(top, path)
    base_ns = int(top.baseTimeNanoseconds or 0)
    if abs(base_ns) > MAX_BASE_TIME_NS:  # a damaged header: times stay relative rather than overflow
        base_ns = 0
    info = top.distributedInfo
    world_size = info.world_size if info and info.world_size and 0 < info.world_size <= INT32_MAX else 0
    names = list(columns.names)

    kind = columns.column("kind")
    name = columns.column("name")
    start_ns = us_to_ns(columns.column("ts")) + base_ns
    dur_ns = np.rint(columns.column("dur") * 1000.0).astype(np.int64)
    correlation = columns.column("correlation")
    external_id = columns.column("external_id")
    is_gpu = GPU_KIND_MASK[kind]
    comm = columns.column("comm")
    comm_bytes, (pg, pg_names), (comm_dtype, dtype_names) = _comm_details(columns, len(kind), world_size)
    comm_numel = _comm_numels(columns, len(kind))

    steps = _steps(kind, name, names, start_ns, dur_ns)
    step, external_id = _assign_steps(start_ns, kind, is_gpu, correlation, external_id, steps)
    lane, lanes = build_lanes(is_gpu, columns.column("key_a"), columns.column("key_b"), name, names,
                              columns.thread_names)
    memory, device_names = _memory(columns.memory, base_ns)

    order = np.argsort(start_ns, kind="stable")
    events = {
        "lane": lane, "kind": kind, "name": name, "start_ns": start_ns, "dur_ns": dur_ns,
        "correlation": correlation, "external_id": external_id, "step": step, "comm": comm,
        "comm_bytes": comm_bytes, "pg": pg, "comm_dtype": comm_dtype, "comm_numel": comm_numel,
    }
    for key in events:  # one column at a time: at most one extra column in memory
        events[key] = events[key][order]
    n_events = len(start_ns)
    rank_row = {
        "rank": rank,
        "path": str(path),
        "world_size": world_size or -1,
        "backend": (info.backend or "") if info else "",
        "rank_source": rank_source,
        "base_time_ns": base_ns,
        "start_ns": int(start_ns.min()) if n_events else 0,
        "end_ns": int((start_ns + dur_ns).max()) if n_events else 0,
        "n_events": n_events,
        "n_skipped": n_skipped + columns.n_skipped + columns.n_memory_bad,
        # what the analysis asks of a rank it keeps no events of (framework.unconnected_ranks_note,
        # the GPU or CPU definitions): counted here once, from the codes
        "n_comm_events": int(np.count_nonzero(events["comm"])),
        "n_kernels": int(np.count_nonzero(events["kind"] == _KERNEL_CODE)),
        "n_backward_events": _count_named(events["name"], names, BACKWARD_PREFIX),
        "memory_device": _main_device(memory["device"], device_names),
        **dict(zip(("device_name", "device_memory_bytes"), _device(top, lanes))),
        "nccl_version": (info.nccl_version or "") if info else "",
        "process_groups": process_groups(info.pg_config) if info else "",
        "complete_steps": ",".join(map(str, complete_steps or [])),
        "run_id": top.fsdpvizRunId if isinstance(top.fsdpvizRunId, str) else "",
        "fsdpviz_export": export,
    }
    return RankColumns(
        events=events,
        categories={"lane": lanes.pop("lane"), "name": names, "pg": pg_names, "comm_dtype": dtype_names,
                    "device": device_names},
        lanes=lanes,
        steps=steps,
        memory=memory,
        rank=rank_row,
    )


def _rank_of(trace: KinetoTrace, path: Path) -> tuple[int, str]:
    info = trace.distributedInfo
    if info is not None and info.rank is not None and 0 <= info.rank <= INT32_MAX:
        return int(info.rank), "distributedInfo"
    from_name = rank_from_filename(path)
    if from_name is not None and from_name <= INT32_MAX:
        return from_name, "filename"
    return 0, "default"


def process_groups(raw: Any) -> str:
    """distributedInfo's ``pg_config`` as ``desc:size:name`` entries joined by ``;`` ("" if none is readable)."""
    groups = decode_raw_json(raw)
    if not isinstance(groups, list):
        return ""
    out = []
    for group in groups:
        if isinstance(group, dict) and isinstance(group.get("pg_size"), int):
            desc, name = (str(group.get(k) or "").replace(";", ",").replace(":", "_") for k in ("pg_desc", "pg_name"))
            out.append(f"{desc}:{group['pg_size']}:{name}")
    return ";".join(out)


def _comm_details(columns: EventColumns, n: int, world_size: int
                  ) -> tuple[np.ndarray, tuple[np.ndarray, list[str]], tuple[np.ndarray, list[str]]]:
    """``comm_bytes``, ``pg`` and ``comm_dtype`` (codes, names) from the communication events' args."""
    comm_bytes = np.full(n, schema.UNKNOWN_BYTES, dtype=np.int64)
    pg = np.zeros(n, dtype=np.int32)
    dtype = np.zeros(n, dtype=np.int32)
    pg_names: dict[str, int] = {"": 0}
    dtype_names: dict[str, int] = {"": 0}
    if not columns.comm_rows:
        return comm_bytes, (pg, list(pg_names)), (dtype, list(dtype_names))
    per_args = {c: (_comm_bytes(c, world_size), pg_names.setdefault(c.pg or "", len(pg_names)),
                    dtype_names.setdefault(_comm_dtype(c), len(dtype_names)))
                for c in dict.fromkeys(columns.comm_args)}
    rows = np.array(columns.comm_rows, dtype=np.int64)
    found = list(map(per_args.__getitem__, columns.comm_args))
    comm_bytes[rows] = np.fromiter((b for b, _, _ in found), np.int64, len(found))
    pg[rows] = np.fromiter((p for _, p, _ in found), np.int32, len(found))
    dtype[rows] = np.fromiter((d for _, _, d in found), np.int32, len(found))
    return comm_bytes, (pg, list(pg_names)), (dtype, list(dtype_names))


def _comm_numels(columns: EventColumns, n: int) -> np.ndarray:
    """``comm_numel`` of every event: the payload of each communication event (see comms.payload_numel)."""
    numel = np.full(n, -1, dtype=np.int64)
    if not columns.comm_rows:
        return numel
    per_args = {c: comms.payload_numel(c.name, c.comm, decode_raw_json(c.input_dims) if c.input_dims else None)
                for c in dict.fromkeys(columns.comm_args)}
    numel[np.array(columns.comm_rows, dtype=np.int64)] = np.fromiter(
        map(per_args.__getitem__, columns.comm_args), np.int64, len(columns.comm_args))
    return numel


def _comm_dtype(c: CommArgs) -> str:
    """The element type of a collective's data: record_param_comms' ``dtype``, else the type of the
    largest tensor in ``Input type`` (torch's names: ``bfloat16``, ``float32``...), "" if unknown."""
    if c.dtype:
        return comms.torch_dtype_name(c.dtype)
    if not c.input_dims:
        return ""
    return comms.largest_input_dtype(decode_raw_json(c.input_dims), decode_raw_json(c.input_type))


def _comm_bytes(c: CommArgs, world_size: int) -> int:
    nbytes = comms.bytes_from_nelems(c.in_nelems, c.out_nelems, c.dtype)
    if nbytes == schema.UNKNOWN_BYTES and c.input_dims:
        gathers = comms.is_gloo_op(c.name) and c.comm == vocabulary.ALL_GATHER
        nbytes = comms.bytes_from_inputs(
            decode_raw_json(c.input_dims),
            decode_raw_json(c.input_type),
            multiplier=(c.group_size or world_size) if gathers else 1,
        )
    return nbytes


def _steps(kind: np.ndarray, name: np.ndarray, names: list[str], start_ns: np.ndarray,
           dur_ns: np.ndarray) -> dict[str, np.ndarray]:
    """``ProfilerStep#N`` ranges from the CPU side (GPU-side copies would count steps twice)."""
    step_of_name = np.full(len(names), -1, dtype=np.int64)
    for code in np.flatnonzero(prefix_hits(names, "ProfilerStep#")).tolist():
        match = STEP_RE.match(names[code])
        if match and int(match.group(1)) <= INT32_MAX:  # the step column is int32
            step_of_name[code] = int(match.group(1))
    rows = np.flatnonzero(_CPU_STEP_KINDS[kind] & (step_of_name[name] >= 0)) if len(names) else np.zeros(0, int)
    numbers = step_of_name[name[rows]]
    found: dict[int, list[int]] = {}
    for number, start, end in zip(numbers.tolist(), start_ns[rows].tolist(),
                                  (start_ns[rows] + dur_ns[rows]).tolist()):
        lo_hi = found.setdefault(number, [start, end])
        lo_hi[0], lo_hi[1] = min(lo_hi[0], start), max(lo_hi[1], end)
    ordered = sorted(found.items(), key=lambda item: (item[1][0], item[0]))
    return {
        "step": np.array([s for s, _ in ordered], dtype=np.int32),
        "start_ns": np.array([se[0] for _, se in ordered], dtype=np.int64),
        "end_ns": np.array([se[1] for _, se in ordered], dtype=np.int64),
    }


def _step_of_times(t_ns: np.ndarray, steps: dict[str, np.ndarray]) -> np.ndarray:
    """Step number whose [start, end) contains each time, NO_STEP outside every step."""
    out = np.full(len(t_ns), schema.NO_STEP, dtype=np.int32)
    starts, ends = steps["start_ns"], steps["end_ns"]
    if len(starts) == 0:
        return out
    idx = np.searchsorted(starts, t_ns, side="right") - 1
    inside = (idx >= 0) & (t_ns < ends[np.clip(idx, 0, None)])
    out[inside] = steps["step"][idx[inside]]
    return out


def _assign_steps(
    start_ns: np.ndarray, kind: np.ndarray, is_gpu: np.ndarray, corr: np.ndarray, external_id: np.ndarray,
    steps: dict[str, np.ndarray],
) -> tuple[np.ndarray, np.ndarray]:
    """Step per event (and external ids completed); GPU events take their launch's step (they run
    later than they are issued).

    When the trace has launch records, a GPU event without one was launched before tracing began
    and gets NO_STEP (as in HTA); without any launch records GPU events fall back to the step by
    time. ROCm kernels carry no External id: they take their launching runtime call's.
    """
    step = _step_of_times(start_ns, steps)
    launches = np.flatnonzero((kind == _RUNTIME_CODE) & (corr >= 0))
    gpu_idx = np.flatnonzero(is_gpu)
    if len(launches) == 0 or len(gpu_idx) == 0:
        return step, external_id
    # The first launch of each correlation id (file order) is the one that counts.
    launch_corr, first = np.unique(corr[launches], return_index=True)
    first = launches[first]
    gpu_corr = corr[gpu_idx]
    pos = np.clip(np.searchsorted(launch_corr, gpu_corr), 0, len(launch_corr) - 1)
    known = launch_corr[pos] == gpu_corr
    launch_row = first[pos]
    step[gpu_idx] = np.where(known, step[launch_row], schema.NO_STEP)
    missing = known & (external_id[gpu_idx] < 0)
    if missing.any():
        external_id = external_id.copy()
        external_id[gpu_idx[missing]] = external_id[launch_row[missing]]
    return step, external_id


def _memory(samples: MemorySamples, base_ns: int) -> tuple[dict[str, np.ndarray], list[str]]:
    """MEMORY columns (but rank) sorted by time, and the device names their codes index."""

    def joined(parts: list[np.ndarray], dtype: type) -> np.ndarray:
        return np.concatenate(parts) if parts else np.zeros(0, dtype=dtype)

    t_ns = us_to_ns(joined(samples.ts_us, np.float64)) + base_ns
    order = np.argsort(t_ns, kind="stable")
    memory = {
        "device": joined(samples.device, np.int32),
        "t_ns": t_ns,
        "allocated_bytes": joined(samples.allocated, np.int64),
        "reserved_bytes": joined(samples.reserved, np.int64),
        "delta_bytes": joined(samples.delta, np.int64),
        "addr": joined(samples.addr, np.int64),
    }
    return {k: v[order] for k, v in memory.items()}, [_device_label(t, i) for t, i in samples.devices]


def _main_device(codes: np.ndarray, devices: list[str]) -> str:
    """The device a rank's memory is analysed on: the GPU with most samples (ties: the first name
    in order), else ``cpu``; "" without samples."""
    if not len(codes):
        return ""
    counts = np.bincount(codes, minlength=len(devices))
    ranked = sorted((name != "cpu", int(n), name) for name, n in zip(devices, counts) if n)
    best = max(ranked, key=lambda r: (r[0], r[1]))  # max keeps the first of equals: the smallest name
    return best[2]


def _device_label(device_type: int | None, device_id: int) -> str:
    # c10::DeviceType: 0 CPU, 1 CUDA (ROCm builds report HIP devices as CUDA too).
    if device_type in (None, 0):
        return "cpu"
    if device_type == 1:
        return f"cuda:{device_id}"
    return f"device{device_type}:{device_id}"


def _device(trace: KinetoTrace, lanes: dict[str, list[Any]]) -> tuple[str, int]:
    """Name and memory (bytes, -1 if unknown) of the device the rank used most."""
    props = [p for p in (trace.deviceProperties or []) if p.name]
    if not props:
        return "", -1
    gpu = [(n, d) for kind, n, d in zip(lanes["lane_kind"], lanes["n_events"], lanes["device"])
           if kind == schema.LANE_GPU_STREAM]
    used = max(gpu, key=lambda nd: nd[0])[1] if gpu else None  # the first of the busiest streams
    chosen = next((p for p in props if p.id == used), props[0])
    memory = int(chosen.totalGlobalMem) if chosen.totalGlobalMem and chosen.totalGlobalMem > 0 else -1
    return str(chosen.name), memory


__all__ = ["COMM_CATEGORIES", "RankColumns", "parse_trace_file", "parse_trace_ranks", "rank_columns",
           "rank_from_filename", "us_to_ns"]
