"""Kineto trace JSON for tests: the one place that knows the shapes PyTorch's profiler writes.

The event constructors (:func:`complete`, :func:`instant`, :func:`launch`, :func:`gpu_op`,
:func:`flow`, :func:`memory_sample`, :func:`thread_name`, :func:`process_name`) and
:func:`write_trace` are shared by the three kinds of test traces: ``TraceBuilder`` here (hand-written
traces whose answers are known by construction: "comm runs 100-200 µs, compute 150-300 µs" gives an
overlap of exactly 50 %), the simulator's writer (``tests/synth/kineto.py``) and the fuzzers'
timelines (``tests/robustness/tracefuzz.py``). Times are in microseconds, as in the files.
"""

from __future__ import annotations

import gzip
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

PID = 1000
MAIN_TID = 1000
GPU_PID = 0


def complete(name: str, cat: str, pid: int, tid: int, ts: float, dur: float,
             args: dict[str, Any] | None = None) -> dict[str, Any]:
    """A complete (``ph: X``) event: an op, an annotation, a kernel."""
    return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur,
            "args": {} if args is None else args}


def instant(name: str, cat: str, pid: int, tid: int, ts: float, args: dict[str, Any] | None) -> dict[str, Any]:
    """A thread-scoped instant (``ph: i``) event, e.g. a ``[memory]`` sample."""
    return {"ph": "i", "cat": cat, "s": "t", "name": name, "pid": pid, "tid": tid, "ts": ts, "args": args}


def launch(corr: int, pid: int, tid: int, ts: float, dur: float = 1.0) -> dict[str, Any]:
    """The ``cudaLaunchKernel`` that queues the GPU op with correlation id ``corr``."""
    return complete("cudaLaunchKernel", "cuda_runtime", pid, tid, ts, dur, {"correlation": corr, "External id": corr})


def gpu_op(name: str, ts: float, dur: float, *, corr: int, stream: int, device: int = 0, pid: int | None = None,
           cat: str = "kernel", **args: Any) -> dict[str, Any]:
    """A kernel / memcpy on ``stream`` of ``device`` (its process is the device number unless ``pid``)."""
    return complete(name, cat, device if pid is None else pid, stream, ts, dur,
                    {"device": device, "stream": stream, "correlation": corr, "External id": corr, **args})


def flow(corr: int, launch_pid: int, launch_tid: int, launch_ts: float, gpu_pid: int, stream: int,
         ts: float) -> list[dict[str, Any]]:
    """The ``ac2g`` flow pair from a launch to its GPU op."""
    return [{"ph": "s", "id": corr, "pid": launch_pid, "tid": launch_tid, "ts": launch_ts, "cat": "ac2g",
             "name": "ac2g"},
            {"ph": "f", "id": corr, "pid": gpu_pid, "tid": stream, "ts": ts, "cat": "ac2g", "name": "ac2g", "bp": "e"}]


def memory_sample(pid: int, tid: int, ts: float, *, allocated: int, reserved: int, delta: int,
                  device: int = 0, device_type: int | None = None) -> dict[str, Any]:
    """A ``[memory]`` instant: one allocation (``delta`` > 0) or free, with the totals after it.
    ``device_type``: 1 (CUDA) or 0 (CPU); by default CUDA for a device number >= 0."""
    kind = (1 if device >= 0 else 0) if device_type is None else device_type
    return instant("[memory]", "cpu_instant_event", pid, tid, ts,
                   {"Device Type": kind, "Device Id": device, "Bytes": delta,
                    "Total Allocated": allocated, "Total Reserved": reserved, "Addr": 1})


def thread_name(pid: int, tid: int, name: str, ts: float = 0) -> dict[str, Any]:
    """``thread_name`` metadata; ``name`` as the profiler writes it (``thread 7 (pt_main_thread)``)."""
    return {"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "ts": ts, "args": {"name": name}}


def process_name(pid: int, name: str, labels: str, ts: float = 0) -> list[dict[str, Any]]:
    """``process_name`` and ``process_labels`` metadata (labels ``CPU`` or ``GPU 3``)."""
    return [{"name": "process_name", "ph": "M", "ts": ts, "pid": pid, "tid": 0, "args": {"name": name}},
            {"name": "process_labels", "ph": "M", "ts": ts, "pid": pid, "tid": 0, "args": {"labels": labels}}]


def write_trace(path: Path, head: dict[str, Any], events: list[dict[str, Any]] | bytes, *,
                trailer: dict[str, Any] | None = None, compress: bool | None = None, level: int = 6,
                events_gz: bytes | None = None) -> Path:
    """Write ``head``, then ``traceEvents`` (dicts, or their serialised JSON list), then ``trailer``
    (keys after the events, as PyTorch writes ``distributedInfo`` and ``baseTimeNanoseconds``).

    Gzip when the name ends in ``.gz`` unless ``compress`` says otherwise. ``events_gz``: the events
    already compressed as a gzip member of their own; the file is then three concatenated gzip
    members (header, events, closing brace), which every gzip reader joins (RFC 1952), so ranks
    sharing one event body compress it once.
    """
    # '{...header..., "traceEvents": [events]}': splice the serialised list into the object.
    opening = orjson.dumps(head)[:-1] + (b',"traceEvents":' if head else b'"traceEvents":')
    closing = b"," + orjson.dumps(trailer)[1:] if trailer else b"}"
    if events_gz is not None:
        path.write_bytes(gzip.compress(opening, compresslevel=level) + events_gz + gzip.compress(closing))
        return path
    body = orjson.dumps(events) if isinstance(events, list) else events
    data = opening + body + closing
    path.write_bytes(gzip.compress(data, compresslevel=level)
                     if (compress if compress is not None else path.name.endswith(".gz")) else data)
    return path


@dataclass
class TraceBuilder:
    """One rank's trace written event by event (CPU process ``PID``, GPU ops on process ``device``)."""

    rank: int | None = 0
    world_size: int = 2
    backend: str = "nccl"
    base_time_ns: int | None = None
    events: list[dict[str, Any]] = field(default_factory=list)
    _next_corr: int = 1

    def thread(self, tid: int, name: str) -> TraceBuilder:
        self.events.append(thread_name(PID, tid, f"thread {tid} ({name})"))
        return self

    def step(self, number: int, start_us: float, dur_us: float, tid: int = MAIN_TID) -> TraceBuilder:
        return self.annotation(f"ProfilerStep#{number}", start_us, dur_us, tid=tid)

    def annotation(self, name: str, start_us: float, dur_us: float, tid: int = MAIN_TID, **args: Any) -> TraceBuilder:
        self.events.append(complete(name, "user_annotation", PID, tid, start_us, dur_us, dict(args)))
        return self

    def cpu_op(self, name: str, start_us: float, dur_us: float, tid: int = MAIN_TID, **args: Any) -> TraceBuilder:
        self.events.append(complete(name, "cpu_op", PID, tid, start_us, dur_us, dict(args)))
        return self

    def kernel(
        self, name: str, start_us: float, dur_us: float, *, stream: int = 7, device: int = 0,
        launch_us: float | None = None, cat: str = "kernel", launch_tid: int = MAIN_TID, **args: Any,
    ) -> TraceBuilder:
        """A GPU event; with ``launch_us`` also its cudaLaunchKernel on thread ``launch_tid``."""
        corr = self._next_corr
        self._next_corr += 1
        if launch_us is not None:
            self.events.append(launch(corr, PID, launch_tid, launch_us))
        self.events.append(gpu_op(name, start_us, dur_us, corr=corr, stream=stream, device=device,
                                  pid=GPU_PID + device, cat=cat, **args))
        return self

    def memory(self, t_us: float, allocated: int, reserved: int, delta: int, device: int = 0) -> TraceBuilder:
        self.events.append(memory_sample(PID, MAIN_TID, t_us, allocated=allocated, reserved=reserved, delta=delta,
                                         device=device))
        return self

    def trailer(self) -> dict[str, Any]:
        """The keys after ``traceEvents``."""
        tail: dict[str, Any] = {}
        if self.rank is not None:
            tail["distributedInfo"] = {"backend": self.backend, "rank": self.rank, "world_size": self.world_size}
        if self.base_time_ns is not None:
            tail["baseTimeNanoseconds"] = self.base_time_ns
        return tail

    def document(self) -> dict[str, Any]:
        """The whole trace as one JSON object (for tests that edit it before writing)."""
        return {"schemaVersion": 1, "traceEvents": self.events, **self.trailer()}

    def write(self, path: Path, *, compress: bool | None = None) -> Path:
        return write_trace(path, {"schemaVersion": 1}, self.events, trailer=self.trailer(), compress=compress)
