"""Hand-written Kineto traces for tests whose answers are known by construction.

``TraceBuilder`` writes the same JSON shapes PyTorch's profiler writes (complete events with
``cat``/``args``, ``thread_name`` metadata, ``[memory]`` instant events, ``distributedInfo``), with
times given in microseconds, so a test can state "comm runs 100-200 µs, compute 150-300 µs" and
assert an overlap of exactly 50 %.
"""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PID = 1000
MAIN_TID = 1000
GPU_PID = 0


@dataclass
class TraceBuilder:
    rank: int | None = 0
    world_size: int = 2
    backend: str = "nccl"
    base_time_ns: int | None = None
    events: list[dict[str, Any]] = field(default_factory=list)
    _next_corr: int = 1

    def thread(self, tid: int, name: str) -> TraceBuilder:
        self.events.append(
            {"ph": "M", "name": "thread_name", "pid": PID, "tid": tid, "ts": 0,
             "args": {"name": f"thread {tid} ({name})"}}
        )
        return self

    def step(self, number: int, start_us: float, dur_us: float, tid: int = MAIN_TID) -> TraceBuilder:
        return self.annotation(f"ProfilerStep#{number}", start_us, dur_us, tid=tid)

    def annotation(self, name: str, start_us: float, dur_us: float, tid: int = MAIN_TID, **args: Any) -> TraceBuilder:
        self.events.append(
            {"ph": "X", "cat": "user_annotation", "name": name, "pid": PID, "tid": tid,
             "ts": start_us, "dur": dur_us, "args": dict(args)}
        )
        return self

    def cpu_op(self, name: str, start_us: float, dur_us: float, tid: int = MAIN_TID, **args: Any) -> TraceBuilder:
        self.events.append(
            {"ph": "X", "cat": "cpu_op", "name": name, "pid": PID, "tid": tid,
             "ts": start_us, "dur": dur_us, "args": dict(args)}
        )
        return self

    def kernel(
        self, name: str, start_us: float, dur_us: float, *, stream: int = 7, device: int = 0,
        launch_us: float | None = None, cat: str = "kernel", **args: Any,
    ) -> TraceBuilder:
        """A GPU event; with ``launch_us`` also its cudaLaunchKernel on the main thread."""
        corr = self._next_corr
        self._next_corr += 1
        if launch_us is not None:
            self.events.append(
                {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": PID,
                 "tid": MAIN_TID, "ts": launch_us, "dur": 1, "args": {"correlation": corr, "External id": corr}}
            )
        self.events.append(
            {"ph": "X", "cat": cat, "name": name, "pid": GPU_PID + device, "tid": stream,
             "ts": start_us, "dur": dur_us,
             "args": {"device": device, "stream": stream, "correlation": corr, "External id": corr, **args}}
        )
        return self

    def memory(self, t_us: float, allocated: int, reserved: int, delta: int, device: int = 0) -> TraceBuilder:
        self.events.append(
            {"ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]", "pid": PID,
             "tid": MAIN_TID, "ts": t_us,
             "args": {"Device Type": 1 if device >= 0 else 0, "Device Id": device, "Bytes": delta,
                      "Total Allocated": allocated, "Total Reserved": reserved, "Addr": 1}}
        )
        return self

    def document(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"schemaVersion": 1, "traceEvents": self.events}
        if self.rank is not None:
            doc["distributedInfo"] = {"backend": self.backend, "rank": self.rank, "world_size": self.world_size}
        if self.base_time_ns is not None:
            doc["baseTimeNanoseconds"] = self.base_time_ns
        return doc

    def write(self, path: Path, *, compress: bool | None = None) -> Path:
        data = json.dumps(self.document()).encode()
        if compress if compress is not None else path.name.endswith(".gz"):
            data = gzip.compress(data)
        path.write_bytes(data)
        return path
