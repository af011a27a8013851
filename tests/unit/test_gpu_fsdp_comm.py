"""Communication that is not an NCCL kernel, on a real GPU run: FSDP2 on two ranks sharing an H100
through gloo (``h100-fsdp2-gloo2-block``, see ../shared/traces/gpu-fsdp/README.md).

gloo moves CUDA tensors through host memory on its own CPU threads, so the collectives are
``gloo:*`` ranges there, not kernels. The independent side reads the raw JSON with plain Python:
the union of those ranges started inside the analysed ProfilerSteps, and the issuing ``c10d::*`` ops.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

RUN = "h100-fsdp2-gloo2-block"
STEPS = ("ProfilerStep#2", "ProfilerStep#3", "ProfilerStep#4")  # the analysed steps


def _events(folder: Path, rank: int) -> list[dict[str, Any]]:
    with gzip.open(folder / RUN / "traces" / f"rank{rank}.trace.json.gz", "rt") as f:
        return [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]


def _union_us(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for lo, hi in sorted(intervals):
        if lo > end:
            total += hi - lo
            end = hi
        elif hi > end:
            total += hi - end
            end = hi
    return total


def _window(events: list[dict[str, Any]]) -> tuple[float, float]:
    steps = [e for e in events if e.get("cat") == "user_annotation" and e["name"] in STEPS]
    assert len(steps) == len(STEPS)
    return min(e["ts"] for e in steps), max(e["ts"] + e["dur"] for e in steps)


@pytest.mark.parametrize("rank", [0, 1])
def test_gloo_on_cuda_is_communication_per_rank(rank: int, gpu_fsdp_dir: Path,
                                                gpu_fsdp_run: Callable[[str], Any]) -> None:
    events = _events(gpu_fsdp_dir, rank)
    lo, hi = _window(events)
    gloo = [(e["ts"], e["ts"] + e["dur"]) for e in events
            if e.get("cat") == "user_annotation" and e["name"].startswith("gloo:") and lo <= e["ts"] < hi]
    summary = gpu_fsdp_run(RUN).summary
    row = summary.overlap.per_rank[str(rank)]
    assert row.device == "gpu"
    assert row.comm_ms == pytest.approx(_union_us(gloo) / 1000 / len(STEPS), abs=2e-3)
    assert row.comm_ms > 1000  # most of a ~1.5 s step: before, all of it was "idle"
    assert row.idle_ms is not None and row.idle_ms < 0.1 * summary.traced_step_time_ms
    assert row.overlap_pct is not None and 0 < row.overlap_pct < 20  # gloo on CUDA hides little


@pytest.mark.parametrize("rank", [0, 1])
def test_gloo_on_cuda_collectives_belong_to_units(rank: int, gpu_fsdp_dir: Path,
                                                  gpu_fsdp_run: Callable[[str], Any]) -> None:
    events = _events(gpu_fsdp_dir, rank)
    lo, hi = _window(events)
    result = gpu_fsdp_run(RUN)
    spans = result.analysis.spans
    mine = spans[spans["rank"] == rank]
    for run_name, issue_name, kind in (("gloo:all_gather", "c10d::_allgather_base_", "all_gather"),
                                       ("gloo:all_reduce", "c10d::_reduce_scatter_base_", "reduce_scatter")):
        runs = [e for e in events if e.get("cat") == "user_annotation" and e["name"] == run_name and lo <= e["ts"] < hi]
        issued = [e for e in events if e.get("cat") == "cpu_op" and e["name"] == issue_name and lo <= e["ts"] < hi]
        spanned = mine[mine["kind"] == kind]
        assert len(spanned) == len(runs) == len(issued) > 0, kind
        assert (spanned["unit"] != "").all()
        total_ms = sum(e["dur"] for e in runs) / 1000
        assert (spanned["end_ns"] - spanned["start_ns"]).sum() / 1e6 == pytest.approx(total_ms, rel=1e-6)
    units = {u.name: u for u in result.summary.units}
    assert set(units) == {"(root)", *(f"blocks.{i}" for i in range(8))}
    assert all(u.all_gather_ms and u.reduce_scatter_ms and u.exposed_comm_ms for u in units.values())
