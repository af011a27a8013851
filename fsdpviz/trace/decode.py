"""Bytes on disk -> typed Kineto events, decoding only the fields fsdpviz uses.

A GPU trace of one rank is tens of MB of JSON with hundreds of thousands of events, most of whose
``args`` (shapes, strides, occupancy, call stacks) fsdpviz never reads. Decoding into msgspec
Structs that declare only the needed fields skips the rest inside the C decoder: on a 54 MB trace
(HTA's ``df_index_resolver``) typed decoding takes ~0.5 s against ~1.3 s for ``orjson.loads``
into dicts, and the result needs no per-event dictionary lookups afterwards.

Large or rarely needed values (``Input Dims``, ``Input type``) are kept as ``msgspec.Raw`` byte
slices and decoded only for the few communication events that need them. The structs are untracked
by Python's cycle collector (``gc=False``: they hold no cycles); otherwise the collector walks the
growing heap again and again while hundreds of thousands of them are created, which more than
doubled the decoding time. Gzip is inflated with ISA-L (``isal``, ~2x zlib's speed) when installed.

Every way a file can fail to be a trace (missing, empty, corrupt gzip, truncated or invalid JSON,
JSON that is not a Kineto trace) becomes a :class:`fsdpviz.errors.TraceError` naming the file.
A trace whose known fields have unexpected types is not an error: it is decoded again without
types and converted event by event, skipping (and counting) the events that do not fit. So is a
trace with the non-standard ``NaN`` / ``Infinity`` literals some JSON writers emit.
"""

from __future__ import annotations

import gzip
import json
import math
import re
import types
import zlib
from pathlib import Path
from typing import Annotated, Final, Protocol, TypeVar

import msgspec

from fsdpviz.errors import TraceError

T = TypeVar("T")

_fast_gzip: types.ModuleType
_fast_zlib: types.ModuleType
try:  # ISA-L's inflate: same format, about twice as fast as zlib's
    from isal import igzip as _fast_gzip
    from isal import isal_zlib as _fast_zlib
except ImportError:  # pragma: no cover - isal is a dependency, but the stdlib suffices
    _fast_gzip = gzip
    _fast_zlib = zlib

GZIP_MAGIC = b"\x1f\x8b"
_BOM: Final = b"\xef\xbb\xbf"  # UTF-8's byte order mark, which Python's json reads past
_NON_STANDARD_NUMBER_RE = re.compile(rb"[:\[,]\s*-?(?:NaN|Infinity)\b")


# Integers beyond int64 (JSON allows any size) fail validation like any other oddly typed field:
# the event is skipped and counted instead of overflowing a numpy column later.
Int64 = Annotated[int, msgspec.Meta(ge=-(2**63), le=2**63 - 1)]


class NotKinetoError(TraceError):
    """Valid JSON that is not a Kineto trace (a config, a run.json...): a folder scan skips these."""


class EventArgs(msgspec.Struct, gc=False):
    """The ``args`` keys fsdpviz reads; every other key is skipped by the decoder."""

    # -1 (schema.NO_ID) when absent: plain ints keep the column building free of None checks.
    external_id: Int64 = msgspec.field(default=-1, name="External id")
    correlation: Int64 = -1
    stream: Int64 = -1
    device: Int64 = -1
    name: str | None = None  # thread_name / process_name metadata
    labels: str | None = None  # process_labels metadata ("CPU", "GPU 0")
    collective: str | None = msgspec.field(default=None, name="Collective name")
    in_nelems: Int64 | None = msgspec.field(default=None, name="In msg nelems")
    out_nelems: Int64 | None = msgspec.field(default=None, name="Out msg nelems")
    dtype: str | None = None
    group_size: Int64 | None = msgspec.field(default=None, name="Group size")
    pg_name: str | None = msgspec.field(default=None, name="Process Group Name")
    # Raw cannot sit in a union with None: an empty Raw means "absent".
    input_dims: msgspec.Raw = msgspec.field(default=msgspec.Raw(b""), name="Input Dims")
    input_type: msgspec.Raw = msgspec.field(default=msgspec.Raw(b""), name="Input type")
    total_allocated: Int64 | None = msgspec.field(default=None, name="Total Allocated")
    total_reserved: Int64 | None = msgspec.field(default=None, name="Total Reserved")
    alloc_bytes: Int64 | None = msgspec.field(default=None, name="Bytes")
    device_type: Int64 | None = msgspec.field(default=None, name="Device Type")
    device_id: Int64 | None = msgspec.field(default=None, name="Device Id")
    addr: Int64 | None = msgspec.field(default=None, name="Addr")


class TraceEvent(msgspec.Struct, gc=False):
    """One Chrome-trace event; ``ts``/``dur`` in microseconds as Kineto writes them."""

    ph: str = ""
    cat: str = ""
    name: str = ""
    pid: Int64 | str = 0
    tid: Int64 | str = 0
    ts: float = math.nan  # NaN when absent: such events are skipped and counted
    dur: float = math.nan
    args: EventArgs | None = None


class DistributedInfo(msgspec.Struct, gc=False):
    rank: Int64 | None = None
    world_size: Int64 | None = None
    backend: str | None = None
    nccl_version: str | None = None
    # the process groups as torch lists them ({"pg_desc": "mesh_tp", "pg_size": 2, ...}); raw, read
    # field by field (trace/kineto.py: process_groups), so that an odd entry costs only itself
    pg_config: msgspec.Raw = msgspec.Raw(b"")


class DeviceProperties(msgspec.Struct, gc=False):
    id: Int64 | None = None
    name: str | None = None
    totalGlobalMem: Int64 | None = None


class ExportRank(msgspec.Struct, gc=False):
    """One rank of an fsdpviz Perfetto export (``fsdpviz export --format perfetto``)."""

    rank: int
    world_size: int | None = None
    backend: str | None = None
    pids: dict[str, int] = {}  # export pid -> the rank's original pid
    complete_steps: list[int] = []  # the steps the export holds, every one complete in its source
    timers: msgspec.Raw = msgspec.Raw(b"")  # the rank's timer records (the run folder's timers/rank{R}.jsonl)
    # the run's timer files whose torn last line was left out when the export was made (its first rank)
    torn_timers: msgspec.Raw = msgspec.Raw(b"")
    # what the rank's trace said of itself beside its events (its distributedInfo and device), raw: a
    # value of another type is left out (trace/kineto.py), not the whole export with it
    nccl_version: msgspec.Raw = msgspec.Raw(b"")
    pg_config: msgspec.Raw = msgspec.Raw(b"")
    device_name: msgspec.Raw = msgspec.Raw(b"")
    device_memory_bytes: msgspec.Raw = msgspec.Raw(b"")
    run_id: msgspec.Raw = msgspec.Raw(b"")  # the recording's (fsdpvizRunId)
    # the export's overflow tracks ("pid:tid", report/perfetto.py) -> the thread they were moved from
    tids: dict[str, int] = {}


class KinetoTrace(msgspec.Struct, gc=False):
    """The top level of a Kineto trace file (unknown keys are skipped)."""

    traceEvents: list[TraceEvent]
    distributedInfo: DistributedInfo | None = None
    baseTimeNanoseconds: Int64 | None = None
    deviceProperties: list[DeviceProperties] | None = None
    fsdpvizRanks: list[ExportRank] | None = None  # several ranks in one file: an fsdpviz export
    fsdpvizRun: msgspec.Raw = msgspec.Raw(b"")  # an export's run.json (report/perfetto.py)
    fsdpvizRunId: str | None = None  # the recording that wrote it (fsdpviz record; runfolder.TRACE_RUN_ID_KEY)


class _LooseTrace(msgspec.Struct):
    """Same top level, events left untyped: the fallback when typed decoding meets odd values."""

    traceEvents: list[msgspec.Raw]
    distributedInfo: msgspec.Raw = msgspec.Raw(b"")
    baseTimeNanoseconds: msgspec.Raw = msgspec.Raw(b"")
    deviceProperties: msgspec.Raw = msgspec.Raw(b"")
    fsdpvizRanks: msgspec.Raw = msgspec.Raw(b"")
    fsdpvizRun: msgspec.Raw = msgspec.Raw(b"")


NO_ARGS = EventArgs()  # shared stand-in for events without ``args``
_TYPED_DECODER = msgspec.json.Decoder(KinetoTrace)
_LOOSE_DECODER = msgspec.json.Decoder(_LooseTrace)
_EVENT_DECODER = msgspec.json.Decoder(TraceEvent)


class Inflater(Protocol):
    """What the batch reader uses of a streaming gzip inflater (zlib's or ISA-L's ``decompressobj``)."""

    eof: bool
    unused_data: bytes

    def decompress(self, data: bytes, /) -> bytes: ...


def decompressor() -> Inflater:
    """A streaming gzip inflater, ISA-L's when available."""
    inflater: Inflater = _fast_zlib.decompressobj(16 + 15)
    return inflater


def read_trace_bytes(path: Path) -> bytes:
    """Return the JSON bytes of ``path``, gunzipped when the content is gzip (whatever its suffix)."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise TraceError(path, "no such file") from None
    except IsADirectoryError:
        raise TraceError(path, "is a folder, expected a trace file") from None
    except OSError as exc:
        raise TraceError(path, f"cannot read ({exc.strerror or exc})") from None
    if not raw:
        raise TraceError(path, "empty file")
    if raw[:2] != GZIP_MAGIC:
        return raw
    try:
        data = _fast_gzip.decompress(raw)
    except Exception:  # noqa: BLE001 - isal's own error types: let the stdlib name the problem
        data = None
    if data:
        return data
    try:
        data = gzip.decompress(raw)
    except EOFError:
        raise TraceError(path, "truncated gzip (the file ends before the compressed stream does)") from None
    except (OSError, zlib.error) as exc:
        raise TraceError(path, f"corrupt gzip ({exc})") from None
    if not data:
        raise TraceError(path, "empty file (gzip of nothing)")
    return data


def decode_trace(data: bytes, path: Path) -> tuple[KinetoTrace, int]:
    """Decode Kineto JSON into typed events; return the trace and the number of events dropped.

    Events are only dropped on the slow path, when some known field has an unexpected type. A UTF-8 byte
    order mark before the document (an editor's save) is read past, as Python's json reads past it.
    """
    if data[:3] == _BOM:
        data = data[3:]
    try:
        return _TYPED_DECODER.decode(data), 0
    except msgspec.ValidationError as exc:
        _raise_if_not_kineto(data, path, exc)
        try:
            return _decode_loose(data, path)
        except msgspec.DecodeError:  # an oddly typed field before a NaN / Infinity literal
            return _decode_with_nan(data, path)
    except msgspec.DecodeError as exc:
        # NaN / Infinity in a JSON document; not in an HTML page or other text that happens to hold the words
        if (data.lstrip()[:1] in (b"{", b"[") and _NON_STANDARD_NUMBER_RE.search(data)
                and "truncated" not in str(exc)):
            return _decode_with_nan(data, path)
        raise TraceError(path, _describe_decode_error(data, exc)) from None


def _decode_with_nan(data: bytes, path: Path) -> tuple[KinetoTrace, int]:
    """Python's json accepts the NaN / Infinity some writers emit (strict JSON does not). Slow,
    rare: events are converted one by one, and those whose known fields do not fit are dropped."""
    try:
        top = json.loads(data)
    except (ValueError, RecursionError) as exc:
        raise TraceError(path, f"invalid JSON ({exc})") from None
    if not isinstance(top, dict) or not isinstance(top.get("traceEvents"), list):
        raise NotKinetoError(path, "not a Kineto trace (expected a JSON object with traceEvents)")
    events: list[TraceEvent] = []
    n_bad = 0
    for raw_event in top["traceEvents"]:
        try:
            events.append(msgspec.convert(raw_event, TraceEvent))
        except msgspec.ValidationError:
            n_bad += 1
    info = _convert_obj_or_none(top.get("distributedInfo"), DistributedInfo)
    devices = _convert_obj_or_none(top.get("deviceProperties"), list[DeviceProperties])
    base = _convert_obj_or_none(top.get("baseTimeNanoseconds"), Int64)
    ranks = _export_ranks(top.get("fsdpvizRanks"), path)
    run = msgspec.Raw(msgspec.json.encode(top["fsdpvizRun"])) if top.get("fsdpvizRun") is not None else msgspec.Raw(b"")
    return KinetoTrace(events, info, base, devices, fsdpvizRanks=ranks, fsdpvizRun=run), n_bad


def _convert_obj_or_none(obj: object, kind: type[T]) -> T | None:
    if obj is None:
        return None
    try:
        return msgspec.convert(obj, kind)
    except msgspec.ValidationError:
        return None


def _describe_decode_error(data: bytes, exc: msgspec.DecodeError) -> str:
    text = str(exc)
    if "truncated" in text:
        return "truncated JSON (the file ends in the middle of the trace)"
    head = data.lstrip()[:1]
    if head not in (b"{", b"["):
        return "not a JSON trace (the content is neither JSON nor gzip)"
    return f"invalid JSON ({text})"


def _raise_if_not_kineto(data: bytes, path: Path, exc: msgspec.ValidationError) -> None:
    """Tell "not a Kineto trace at all" apart from "a trace with some oddly typed field"."""
    try:
        top = msgspec.json.decode(data, type=msgspec.Raw)
        kind = bytes(top).lstrip()[:1]
    except msgspec.DecodeError:  # e.g. NaN literals further on: the typed decoder got past the start
        kind = data.lstrip()[:1]
    if kind == b"[":
        raise NotKinetoError(path, "not a Kineto trace (a JSON list, expected an object with traceEvents)")
    if kind != b"{":
        raise NotKinetoError(path, "not a Kineto trace (expected a JSON object with traceEvents)")
    if "traceEvents" in str(exc) and "missing required field" in str(exc):
        raise NotKinetoError(path, "not a Kineto trace (no traceEvents)")
    if str(exc).endswith("`$.traceEvents`"):
        raise NotKinetoError(path, "not a Kineto trace (traceEvents is not a list)")


def _decode_loose(data: bytes, path: Path) -> tuple[KinetoTrace, int]:
    try:
        loose = _LOOSE_DECODER.decode(data)
    except msgspec.ValidationError as exc:
        raise NotKinetoError(path, f"not a Kineto trace ({exc})") from None
    events: list[TraceEvent] = []
    n_bad = 0
    for raw_event in loose.traceEvents:
        try:
            events.append(_EVENT_DECODER.decode(raw_event))
        except msgspec.ValidationError:
            n_bad += 1
    info = _convert_or_none(loose.distributedInfo, DistributedInfo)
    devices = _convert_or_none(loose.deviceProperties, list[DeviceProperties])
    base = _convert_or_none(loose.baseTimeNanoseconds, Int64)
    ranks = _export_ranks(decode_raw_json(loose.fsdpvizRanks), path)
    return KinetoTrace(events, info, base, devices, fsdpvizRanks=ranks, fsdpvizRun=loose.fsdpvizRun), n_bad


def _export_ranks(obj: object, path: Path) -> list[ExportRank] | None:
    """An export's rank list found by a fallback decoder; one error line where it is not one (read as a
    plain trace, an export's ranks would run together as one)."""
    if obj is None:
        return None
    try:
        return msgspec.convert(obj, list[ExportRank])
    except msgspec.ValidationError as exc:
        raise TraceError(path, f"an fsdpviz export whose list of ranks (fsdpvizRanks) cannot be read ({exc})") from None


def _convert_or_none(raw: msgspec.Raw, kind: type[T]) -> T | None:
    if not raw:
        return None
    try:
        return msgspec.json.decode(raw, type=kind)
    except (msgspec.ValidationError, msgspec.DecodeError):
        return None


def decode_raw_json(raw: msgspec.Raw | bytes) -> object:
    """Decode one ``msgspec.Raw`` value kept aside by the typed decoder (None when absent)."""
    if not raw:
        return None
    try:
        return msgspec.json.decode(raw)
    except msgspec.DecodeError:
        return None
