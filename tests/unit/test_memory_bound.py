"""Memory-bound: a run whose peak of allocated memory is within the margin of its device's memory.

Hand-built GPU traces fix both numbers: the device's memory in ``deviceProperties`` (as CUDA traces
state ``totalGlobalMem``) and the allocator's samples, so which run is memory-bound is known by
construction. CPU traces state no device memory: never memory-bound, and the summary says why.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from helpers.kineto import TraceBuilder, write_trace

from fsdpviz.analysis.bound import KIND_MEMORY, MEMORY_MARGIN
from fsdpviz.analysis.pipeline import RunResult, analyse
from fsdpviz.commands.summary import bound_text
from fsdpviz.report.headline import _bound_fact

GEMM = "volta_sgemm_128x64_nn"
DEVICE = 80 * (1 << 30)


def _run(tmp_path: Path, peak: int) -> Path:
    """Three 1 ms steps; the host launches a 20 µs kernel every 100 µs (launch-bound); the allocator
    climbs to ``peak`` in each step and frees back to half of it."""
    b = TraceBuilder()
    for n in (1, 2, 3):
        t0 = (n - 1) * 1000.0
        b.step(n, t0, 1000.0)
        for i in range(10):
            b.kernel(GEMM, t0 + 100 * i + 5, 20, launch_us=t0 + 100 * i)
        b.memory(t0 + 10, allocated=peak // 2, reserved=peak, delta=peak // 2)
        b.memory(t0 + 500, allocated=peak, reserved=peak, delta=peak // 2)
        b.memory(t0 + 900, allocated=peak // 2, reserved=peak, delta=-(peak // 2))
    head = {"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "NVIDIA H100 80GB HBM3",
                                                      "totalGlobalMem": DEVICE}]}
    return write_trace(tmp_path / "rank0.trace.json", head, b.events, trailer=b.trailer())


@pytest.mark.parametrize(("share", "memory_bound"), [(0.95, True), (1 - MEMORY_MARGIN + 0.01, True),
                                                      (1 - MEMORY_MARGIN - 0.01, False), (0.5, False)])
def test_a_peak_within_the_margin_of_the_device_is_memory_bound(tmp_path: Path, share: float,
                                                                memory_bound: bool) -> None:
    peak = int(share * DEVICE)
    summary = analyse([_run(tmp_path, peak)], cache=False).summary
    bound = summary.bound
    assert bound is not None
    assert bound.peak_allocated_bytes == peak == summary.memory.peak_allocated_bytes
    assert bound.device_memory_bytes == DEVICE
    assert bound.memory_bound is memory_bound
    assert bound.time_kind == "host"  # 20 µs of every 100 µs busy: the GPU waits for its launches
    assert bound.kind == (KIND_MEMORY if memory_bound else "host")
    causes = [a.cause for a in summary.actions]
    if memory_bound:
        first = summary.actions[0]
        assert first.cause == KIND_MEMORY and first.kind == "bound"
        assert "fsdpviz whatif RUN --explore --memory-budget 80GiB" in first.knob
        assert f"{100 * share:.0f} %" in first.message
        assert causes[1] == "host"  # the time's bound still follows, with its own knob
        assert summary.to_json()["bound"]["kind"] == KIND_MEMORY
        # the terminal and the report's headline say it with the peak against the device
        gib = f"{peak / (1 << 30):,.1f} of 80.0 GiB"
        fact = _bound_fact(summary)
        assert fact.value == f"memory-bound, peak {gib} ({100 * share:.0f} %)" and fact.hint.startswith("time: host; ")
        assert bound_text(summary).startswith(f"memory-bound, peak {gib} ({100 * share:.0f} %); time host-bound: "
                                              "compute ")
        assert bound_text(summary) == f"{fact.value}; time host-bound: {fact.hint.removeprefix('time: host; ')}"
    else:
        assert KIND_MEMORY not in causes and causes[0] == "host"
        fact = _bound_fact(summary)
        assert fact.value.startswith("host-bound, ") and bound_text(summary) == f"{fact.value}: {fact.hint}"


def test_cpu_runs_are_never_memory_bound_and_say_why(sample_run: Callable[[str], RunResult]) -> None:
    summary = sample_run("fsdp2-cpu-2rank").summary
    bound = summary.bound
    assert bound is not None and summary.memory.peak_allocated_bytes is not None
    assert bound.device_memory_bytes is None and bound.memory_bound is None
    assert bound.kind != KIND_MEMORY and bound.kind == bound.time_kind
    assert bound.note is not None and "do not state the device's memory" in bound.note
    assert all(a.cause != KIND_MEMORY for a in summary.actions)
