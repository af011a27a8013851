"""Decoded Kineto events -> numpy columns, batch by batch, with no Python loop per event.

Events arrive as lists of msgspec structs (a batch of a streamed file, or a whole file on the
slow path). Each field becomes a column in one C-level pass (``map`` of an ``attrgetter`` into
``np.fromiter``); names are factorised through a dict that grows across batches, so a name is a
small integer code from the first batch on. Per-event Python work is left to the few events that
need it: metadata (thread names), ``[memory]`` samples and communication events (their
``Collective name``, message sizes and process group).

What counts as usable, skipped or ignored (see ``kineto``): complete events (``ph: "X"``) of a
known category are tabled; those with missing, negative or absurd times, or with a string pid/tid, are
dropped and counted as skipped, as are complete events of unknown categories and events of
phases fsdpviz does not read (anything but X, i/I, M, C and flow events).
"""

from __future__ import annotations

import functools
from collections import Counter
from dataclasses import dataclass, field
from itertools import compress
from operator import attrgetter
from typing import Final, NamedTuple

import numpy as np

from fsdpviz import vocabulary
from fsdpviz.trace import comms, schema
from fsdpviz.trace.decode import NO_ARGS, EventArgs, TraceEvent

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
# ("fsdpviz": the unit tracks of fsdpviz's own Perfetto export, derived from the events it holds.)
IGNORED_CATEGORIES: Final = frozenset({"python_function", "trace", "overhead", "cuda_profiler_range", "fsdpviz"})
# Phases that carry nothing fsdpviz tables besides X (events) and i/I (memory samples).
IGNORED_PHASES: Final = frozenset({"M", "s", "f", "t", "C", "i", "I"})
MEMORY_EVENT: Final = "[memory]"

COMM_CATEGORIES: Final = ("",) + vocabulary.COLLECTIVES  # code 0 = not communication
NOT_AN_ID: Final = np.iinfo(np.int64).min  # a string pid/tid; real tids may be negative
# |ts| and dur beyond 3e15 µs (95 years; epoch µs of the year 2065) are no real event, and as
# int64 ns plus a base time they would overflow: such events are skipped like those without times.
MAX_TIME_US: Final = 3e15
IGNORED_CATEGORY: Final = -1
UNKNOWN_CATEGORY: Final = -2
GPU_KIND_MASK: Final = np.array([k in GPU_KINDS for k in schema.EVENT_KINDS], dtype=bool)
KERNEL_CODE: Final = schema.EVENT_KINDS.index(schema.KIND_KERNEL)

_PH = attrgetter("ph")
_CAT = attrgetter("cat")
_NAME = attrgetter("name")
_TS = attrgetter("ts")
_DUR = attrgetter("dur")
_PID = attrgetter("pid")
_TID = attrgetter("tid")
_ARGS = attrgetter("args")
_DEVICE = attrgetter("device")
_STREAM = attrgetter("stream")
_CORRELATION = attrgetter("correlation")
_EXTERNAL_ID = attrgetter("external_id")
_TOTAL_ALLOCATED = attrgetter("total_allocated")
_TOTAL_RESERVED = attrgetter("total_reserved")
_ALLOC_BYTES = attrgetter("alloc_bytes")
_DEVICE_TYPE = attrgetter("device_type")
_DEVICE_ID = attrgetter("device_id")
_ADDR = attrgetter("addr")
_INSTANT_PHASES = frozenset({"i", "I"})
_COLLECTIVE_NAME = attrgetter("collective")
_PG_NAME = attrgetter("pg_name")
_IN_NELEMS = attrgetter("in_nelems")
_OUT_NELEMS = attrgetter("out_nelems")
_DTYPE = attrgetter("dtype")
_GROUP_SIZE = attrgetter("group_size")
_INPUT_DIMS = attrgetter("input_dims")
_INPUT_TYPE = attrgetter("input_type")


def kind_code(category: str) -> int:
    """Index into schema.EVENT_KINDS; IGNORED_CATEGORY or UNKNOWN_CATEGORY otherwise."""
    kind = CATEGORY_KINDS.get(category.lower())
    if kind is not None:
        return schema.EVENT_KINDS.index(kind)
    return IGNORED_CATEGORY if category.lower() in IGNORED_CATEGORIES else UNKNOWN_CATEGORY


@functools.lru_cache(maxsize=4096)
def _collective(text: str) -> str:
    return comms.collective_from_text(text)


def _int_ids(events: list[TraceEvent], getter: attrgetter) -> np.ndarray:
    """pid/tid column; string ids (never on the events fsdpviz tables, but allowed) -> NOT_AN_ID."""
    try:
        return np.fromiter(map(getter, events), np.int64, len(events))
    except (TypeError, ValueError, OverflowError):
        return np.array([v if isinstance(v, int) else NOT_AN_ID for v in map(getter, events)], dtype=np.int64)


class CommArgs(NamedTuple):
    """What a communication event's name and args say; the same for most of a trace's collectives
    (a job repeats them every step), so sizes are worked out once per distinct value."""

    name: str
    comm: str
    pg: str | None
    in_nelems: int | None
    out_nelems: int | None
    dtype: str | None
    group_size: int | None
    input_dims: bytes
    input_type: bytes


@dataclass(slots=True)
class MemorySamples:
    """``[memory]`` instant events, batch by batch: times in µs, the allocator's numbers, devices."""

    ts_us: list[np.ndarray] = field(default_factory=list)
    allocated: list[np.ndarray] = field(default_factory=list)
    reserved: list[np.ndarray] = field(default_factory=list)
    delta: list[np.ndarray] = field(default_factory=list)
    addr: list[np.ndarray] = field(default_factory=list)  # the block's address (-1: not recorded)
    device: list[np.ndarray] = field(default_factory=list)  # codes into ``devices``
    devices: dict[tuple[int | None, int], int] = field(default_factory=dict)  # (type, id) -> code


def _ints(records: list[EventArgs], getter: attrgetter, missing: int) -> np.ndarray:
    """Integer column from an arg that may be absent (None -> ``missing``)."""
    try:
        return np.fromiter(map(getter, records), np.int64, len(records))
    except TypeError:
        return np.array([missing if v is None else v for v in map(getter, records)], dtype=np.int64)


class EventColumns:
    """Accumulates the columns of one trace's usable complete events over batches."""

    def __init__(self) -> None:
        self.names: dict[str, int] = {}  # name -> code, in first-seen order
        self._kernel_comm: list[int] = []  # per name code: COMM_CATEGORIES index if a kernel
        self._cpu_comm: list[int] = []  # per name code: ... if a CPU op
        self._kind_of_cat: dict[str, int] = {}
        self._parts: dict[str, list[np.ndarray]] = {
            k: [] for k in ("kind", "name", "ts", "dur", "correlation", "external_id", "key_a", "key_b", "comm")
        }
        self.comm_rows: list[int] = []  # rows of the communication events (numpy ints)
        self.comm_args: list[CommArgs] = []  # and their args, row by row
        self.thread_names: dict[tuple[int, int], list[str]] = {}
        self.memory = MemorySamples()
        self.n_rows = 0
        self.n_skipped = 0
        self.n_memory_bad = 0

    # --- per batch -----------------------------------------------------------------------------
    def add(self, events: list[TraceEvent]) -> None:
        """Take the usable events of one batch (file order is kept across batches)."""
        phases = list(map(_PH, events))
        complete = events
        if phases.count("X") != len(events):
            counts = Counter(compress(phases, map("X".__ne__, phases)))
            self.n_skipped += sum(n for ph, n in counts.items() if ph not in IGNORED_PHASES)
            self._add_others(events, phases)
            complete = list(compress(events, map("X".__eq__, phases)))
        if complete:
            self._add_complete(complete)

    def _add_complete(self, events: list[TraceEvent]) -> None:
        cats = list(map(_CAT, events))
        for cat in set(cats).difference(self._kind_of_cat):
            self._kind_of_cat[cat] = kind_code(cat)
        kind = np.fromiter(map(self._kind_of_cat.__getitem__, cats), np.int8, len(cats))
        self.n_skipped += int((kind == UNKNOWN_CATEGORY).sum())
        usable = kind >= 0
        if not usable.all():
            events = list(compress(events, usable.tolist()))
            kind = kind[usable]
        n = len(events)
        if n == 0:
            return
        names = list(map(_NAME, events))
        self._learn_names(names)
        name = np.fromiter(map(self.names.__getitem__, names), np.int32, n)
        args = list(map(_ARGS, events))
        if None in args:
            args = [a if a is not None else NO_ARGS for a in args]
        ts = np.fromiter(map(_TS, events), np.float64, n)
        dur = np.fromiter(map(_DUR, events), np.float64, n)
        pid = _int_ids(events, _PID)
        tid = _int_ids(events, _TID)
        device = np.fromiter(map(_DEVICE, args), np.int64, n)
        stream = np.fromiter(map(_STREAM, args), np.int64, n)
        is_gpu = GPU_KIND_MASK[kind]
        # GPU lanes are (device, stream); events without those args (gpu_user_annotation) use pid/tid.
        key_a = np.where(is_gpu & (device >= 0), device, pid)
        key_b = np.where(is_gpu & (stream >= 0), stream, tid)
        columns: dict[str, np.ndarray] = {
            "kind": kind,
            "name": name,
            "ts": ts,
            "dur": dur,
            "correlation": np.fromiter(map(_CORRELATION, args), np.int64, n),
            "external_id": np.fromiter(map(_EXTERNAL_ID, args), np.int64, n),
            "key_a": key_a,
            "key_b": key_b,
        }
        good = ((np.abs(ts) < MAX_TIME_US) & (dur >= 0) & (dur < MAX_TIME_US)  # also False for NaN
                & (key_a != NOT_AN_ID) & (key_b != NOT_AN_ID))
        if not good.all():
            self.n_skipped += int(n - good.sum())
            columns = {k: v[good] for k, v in columns.items()}
            args = list(compress(args, good.tolist()))
            names = list(compress(names, good.tolist()))
        columns["comm"] = self._comm_codes(columns["kind"], columns["name"], args, names)
        for key, values in columns.items():
            self._parts[key].append(values)
        self.n_rows += len(args)

    def _learn_names(self, names: list[str]) -> None:
        index = self.names
        for name in dict.fromkeys(names):
            if name not in index:
                index[name] = len(index)
                self._kernel_comm.append(COMM_CATEGORIES.index(comms.classify_kernel_name(name)))
                self._cpu_comm.append(COMM_CATEGORIES.index(comms.classify_cpu_name(name)))

    def _comm_codes(self, kind: np.ndarray, name: np.ndarray, args: list[EventArgs],
                    names: list[str]) -> np.ndarray:
        """Collective per event from its name; the few communication events' args are kept aside."""
        by_kernel = np.array(self._kernel_comm, dtype=np.int8)[name]
        by_cpu = np.array(self._cpu_comm, dtype=np.int8)[name]
        code = np.where(kind == KERNEL_CODE, by_kernel, np.where(GPU_KIND_MASK[kind], 0, by_cpu)).astype(np.int8)
        rows = np.flatnonzero(code)
        if len(rows) == 0:
            return code
        picked = rows.tolist()
        sub = [args[i] for i in picked]
        comm = [COMM_CATEGORIES[c] for c in code[rows].tolist()]
        for j, text in enumerate(map(_COLLECTIVE_NAME, sub)):
            if text:  # record_param_comms / NCCL kernels name their collective
                comm[j] = _collective(text)
                code[picked[j]] = COMM_CATEGORIES.index(comm[j])
        self.comm_rows.extend(self.n_rows + rows)
        self.comm_args.extend(map(CommArgs._make, zip(
            map(names.__getitem__, picked), comm, map(_PG_NAME, sub), map(_IN_NELEMS, sub),
            map(_OUT_NELEMS, sub), map(_DTYPE, sub), map(_GROUP_SIZE, sub),
            map(bytes, map(_INPUT_DIMS, sub)), map(bytes, map(_INPUT_TYPE, sub)),
        )))
        return code

    def _add_others(self, events: list[TraceEvent], phases: list[str]) -> None:
        """Thread names (metadata) and allocator samples from the non-complete events."""
        for e in compress(events, map("M".__eq__, phases)):
            a = e.args
            if (e.name == "thread_name" and a is not None and a.name
                    and isinstance(e.pid, int) and isinstance(e.tid, int)):
                self.thread_names.setdefault((e.pid, e.tid), []).append(a.name)
        instants = list(compress(events, map(_INSTANT_PHASES.__contains__, phases)))
        samples = list(compress(instants, map(MEMORY_EVENT.__eq__, map(_NAME, instants))))
        if samples:
            self._add_memory(samples)

    def _add_memory(self, samples: list[TraceEvent]) -> None:
        args = list(map(_ARGS, samples))
        if None in args:  # not a sample at all (neither counted nor tabled)
            samples = [e for e in samples if e.args is not None]
            args = list(map(_ARGS, samples))
        ts = np.fromiter(map(_TS, samples), np.float64, len(samples))
        allocated = _ints(args, _TOTAL_ALLOCATED, -1)
        good = np.abs(ts) < MAX_TIME_US  # False for NaN too
        if (allocated == -1).any():  # maybe absent: look again
            good &= np.fromiter((a.total_allocated is not None for a in args), bool, len(args))
        if not good.all():
            self.n_memory_bad += int(len(samples) - good.sum())
            ts, allocated, args = ts[good], allocated[good], list(compress(args, good.tolist()))
        mem = self.memory
        mem.ts_us.append(ts)
        mem.allocated.append(allocated)
        mem.reserved.append(_ints(args, _TOTAL_RESERVED, -1))
        mem.delta.append(_ints(args, _ALLOC_BYTES, 0))
        mem.addr.append(_ints(args, _ADDR, -1))
        types = list(map(_DEVICE_TYPE, args))
        ids = list(map(_DEVICE_ID, args))
        one_type, one_id = set(types), set(ids)
        if len(one_type) == 1 and len(one_id) == 1:  # the usual case: one device per rank
            (device_type,), (device_id,) = one_type, one_id
            code = mem.devices.setdefault((device_type, device_id or 0), len(mem.devices))
            mem.device.append(np.full(len(args), code, dtype=np.int32))
            return
        pairs = list(zip(types, [0 if i is None else i for i in ids]))
        for pair in dict.fromkeys(pairs):
            mem.devices.setdefault(pair, len(mem.devices))
        mem.device.append(np.fromiter(map(mem.devices.__getitem__, pairs), np.int32, len(pairs)))

    # --- at the end ----------------------------------------------------------------------------
    def column(self, key: str) -> np.ndarray:
        """One column over every batch so far (the batches' parts are released)."""
        parts = self._parts[key]
        if not parts:
            dtype = {"kind": np.int8, "comm": np.int8, "name": np.int32, "ts": np.float64, "dur": np.float64}
            return np.zeros(0, dtype=dtype.get(key, np.int64))
        out = parts[0] if len(parts) == 1 else np.concatenate(parts)
        parts.clear()
        return out
