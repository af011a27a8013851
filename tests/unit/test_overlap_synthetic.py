"""Whole-step overlap on hand-built traces whose answer is known by construction.

Times in the traces are microseconds; the analysis reports nanoseconds, so 100 µs = 100_000 ns.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from helpers.kineto import MAIN_TID, TraceBuilder
from hypothesis import given, settings
from hypothesis import strategies as st

from fsdpviz.analysis import overlap as ov
from fsdpviz.structure import intervals as iv
from fsdpviz.trace import load_traces

US = 1000
NCCL_AG = "ncclKernel_AllGather_RING_LL_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)"
NCCL_DEV_RS = "ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
GEMM = "volta_sgemm_128x64_nn"


def _gpu_trace(tmp_path: Path, kernels: list[tuple[str, float, float, int]], *, steps: int = 2) -> Path:
    """Kernels (name, start µs, dur µs, stream), all launched during step 1 of ``steps`` 1 ms steps."""
    b = TraceBuilder()
    for n in range(1, steps + 1):
        b.step(n, (n - 1) * 1000.0, 1000.0)
    for i, (name, start, dur, stream) in enumerate(kernels):
        b.kernel(name, start, dur, stream=stream, launch_us=10.0 + i)
    return b.write(tmp_path / "rank0.trace.json")


def _overlap(path: Path, **kwargs: object) -> dict:
    traces = load_traces([path], cache=False)
    return ov.compute_overlap(traces, **kwargs).iloc[0].to_dict()


def test_disjoint_comm_and_compute_do_not_overlap(tmp_path: Path) -> None:
    row = _overlap(_gpu_trace(tmp_path, [(NCCL_AG, 100, 100, 20), (GEMM, 300, 100, 7)]))
    assert row["device"] == "gpu"
    assert row["comm_ns"] == 100 * US and row["compute_ns"] == 100 * US
    assert row["overlap_ns"] == 0 and row["overlap_pct"] == 0.0
    assert row["exposed_comm_ns"] == 100 * US
    # Window = first to last analysed GPU event (100..400 µs); busy 200 µs; idle the gap between.
    assert row["window_ns"] == 300 * US and row["busy_ns"] == 200 * US and row["idle_ns"] == 100 * US


def test_compute_nested_inside_comm(tmp_path: Path) -> None:
    row = _overlap(_gpu_trace(tmp_path, [(NCCL_AG, 100, 300, 20), (GEMM, 200, 100, 7)]))
    assert row["overlap_ns"] == 100 * US
    assert row["overlap_pct"] == pytest.approx(100 / 3)
    assert row["exposed_comm_ns"] == 200 * US


def test_comm_nested_inside_compute_is_fully_hidden(tmp_path: Path) -> None:
    row = _overlap(_gpu_trace(tmp_path, [(GEMM, 100, 300, 7), (NCCL_AG, 200, 100, 20)]))
    assert row["overlap_pct"] == 100.0 and row["exposed_comm_ns"] == 0


def test_partial_overlap(tmp_path: Path) -> None:
    row = _overlap(_gpu_trace(tmp_path, [(NCCL_AG, 100, 100, 20), (GEMM, 150, 150, 7)]))
    assert row["overlap_ns"] == 50 * US and row["overlap_pct"] == 50.0
    assert row["non_compute_ns"] == 50 * US  # 100..150, comm alone


def test_concurrent_kernels_on_several_streams_are_merged(tmp_path: Path) -> None:
    kernels = [
        (GEMM, 100, 200, 7), (GEMM, 200, 200, 8),  # compute union 100..400
        (NCCL_AG, 250, 200, 20), (NCCL_DEV_RS, 300, 100, 28),  # comm union 250..450
    ]
    row = _overlap(_gpu_trace(tmp_path, kernels))
    assert row["compute_ns"] == 300 * US
    assert row["comm_ns"] == 200 * US
    assert row["overlap_ns"] == 150 * US and row["overlap_pct"] == 75.0


def test_copies_and_memsets_are_neither_comm_nor_compute(tmp_path: Path) -> None:
    b = TraceBuilder()
    b.step(1, 0, 1000).step(2, 1000, 1000)
    b.kernel(NCCL_AG, 100, 100, stream=20, launch_us=10)
    b.kernel("Memcpy DtoD (Device -> Device)", 100, 100, stream=7, launch_us=11, cat="gpu_memcpy")
    b.kernel("Memset (Device)", 250, 50, stream=7, launch_us=12, cat="gpu_memset")
    row = _overlap(b.write(tmp_path / "t.json"))
    assert row["overlap_pct"] == 0.0 and row["compute_ns"] == 0
    assert row["busy_ns"] == 150 * US and row["non_compute_ns"] == 150 * US


def test_last_step_is_dropped_unless_asked(tmp_path: Path) -> None:
    b = TraceBuilder()
    b.step(1, 0, 1000).step(2, 1000, 1000)
    b.kernel(NCCL_AG, 100, 100, stream=20, launch_us=10)
    b.kernel(GEMM, 1100, 100, stream=7, launch_us=1010)  # launched in the last step
    b.kernel(NCCL_AG, 1150, 100, stream=20, launch_us=1011)
    path = b.write(tmp_path / "t.json")
    default = _overlap(path)
    assert (default["first_step"], default["last_step"]) == (1, 1)
    assert default["comm_ns"] == 100 * US and default["overlap_pct"] == 0.0
    everything = _overlap(path, include_last_step=True)
    assert everything["comm_ns"] == 200 * US and everything["overlap_pct"] == 25.0
    only_two = _overlap(path, steps=[2])
    assert only_two["comm_ns"] == 100 * US and only_two["overlap_pct"] == 50.0


def test_work_launched_before_the_trace_belongs_to_no_step(tmp_path: Path) -> None:
    b = TraceBuilder()
    b.step(1, 0, 1000).step(2, 1000, 1000)
    b.kernel(GEMM, 50, 100, stream=7)  # no launch record: queued before profiling began
    b.kernel(NCCL_AG, 100, 100, stream=20, launch_us=10)
    row = _overlap(b.write(tmp_path / "t.json"))
    assert row["compute_ns"] == 0 and row["overlap_pct"] == 0.0


def test_trace_without_steps_is_analysed_whole(tmp_path: Path) -> None:
    b = TraceBuilder()
    b.kernel(NCCL_DEV_RS, 100, 100, stream=20, launch_us=10)
    b.kernel(GEMM, 150, 100, stream=7, launch_us=11)
    row = _overlap(b.write(tmp_path / "t.json"))
    assert row["n_steps"] == 0 and row["overlap_pct"] == 50.0


def test_gloo_cpu_overlap_excludes_issuing_ops_and_waits(tmp_path: Path) -> None:
    gloo_tid = 2001
    b = TraceBuilder(backend="gloo")
    b.thread(MAIN_TID, "python3").thread(gloo_tid, "pt_gloo_runloop")
    b.step(1, 0, 1000).step(2, 1000, 1000)
    b.cpu_op("aten::linear", 100, 200)  # compute 100..300
    b.cpu_op("aten::mm", 150, 100)  # nested: adds nothing
    b.cpu_op("autograd::engine::evaluate_function: MmBackward0", 280, 80)  # 280..360 ...
    b.cpu_op("c10d::_allgather_base_", 300, 50)  # ... minus the issuing op 300..350, and 350..360:
    # the op that issued it, still open while the all-gather runs, is the thread waiting for it
    b.cpu_op("_c10d_functional::wait_tensor", 400, 100)  # a blocking wait: not compute
    b.cpu_op("aten::add_", 500, 100)  # compute 500..600
    b.annotation("gloo:all_gather", 200, 200, tid=gloo_tid, **{"Input Dims": [[1024]], "Input type": ["float"]})
    b.cpu_op("aten::mm", 1100, 100)  # in the last step: dropped
    row = _overlap(b.write(tmp_path / "t.json"))
    assert row["device"] == "cpu"
    # compute = 100..300 + 280..300 + 500..600 = 200 + 100
    assert row["compute_ns"] == 300 * US
    assert row["comm_ns"] == 200 * US
    # comm 200..400 overlaps compute 200..300
    assert row["overlap_ns"] == 100 * US and row["overlap_pct"] == 50.0
    assert row["window_ns"] == 1000 * US  # CPU window = the analysed step
    assert row["idle_ns"] == 1000 * US - row["busy_ns"]
    assert row["busy_ns"] == (300 - 100 + 400 - 300 + 600 - 500) * US  # 100..400 and 500..600


def test_rank_with_nothing_in_window_is_a_no_data_error(tmp_path: Path) -> None:
    from fsdpviz.errors import NoDataError

    # step 2 is in the trace, but its one kernel was launched in step 1
    path = _gpu_trace(tmp_path, [(NCCL_AG, 100, 100, 20)])
    traces = load_traces([path], cache=False)
    with pytest.raises(NoDataError, match=r"rank0\.trace\.json: no GPU events in the analysis window"):
        ov.compute_overlap(traces, steps=[2])


# --- the interval algebra against a brute-force model on a small integer timeline -------------

_interval = st.tuples(st.integers(0, 60), st.integers(0, 20)).map(lambda t: (t[0], t[0] + t[1]))


def _mask(intervals: list[tuple[int, int]]) -> np.ndarray:
    m = np.zeros(100, dtype=bool)
    for s, e in intervals:
        m[s:e] = True
    return m


def _as_iv(intervals: list[tuple[int, int]]) -> iv.Intervals:
    return iv.union_intervals(np.array([s for s, _ in intervals], np.int64), np.array([e for _, e in intervals], np.int64))


@settings(max_examples=200, deadline=None)
@given(st.lists(_interval, max_size=8), st.lists(_interval, max_size=8), st.integers(0, 100), st.integers(0, 100))
def test_interval_algebra_matches_brute_force(a: list, b: list, lo: int, hi: int) -> None:
    ma, mb = _mask(a), _mask(b)
    ia, ib = _as_iv(a), _as_iv(b)
    assert iv.total_ns(ia) == ma.sum()
    assert iv.total_ns(iv.intersect_intervals(ia, ib)) == (ma & mb).sum() == iv.overlap_ns(ia, ib)
    assert iv.total_ns(iv.subtract_intervals(ia, ib)) == (ma & ~mb).sum()
    lo, hi = min(lo, hi), max(lo, hi)
    assert iv.total_ns(iv.clip_intervals(ia, lo, hi)) == ma[lo:hi].sum()
    # Normalised: sorted, disjoint and not touching.
    starts, ends = ia
    assert np.all(ends > starts) and np.all(starts[1:] > ends[:-1])
    t = np.arange(0, 100, 7, dtype=np.int64)
    assert list(iv.coverage_ns(ia, t)) == [ma[:x].sum() for x in t]


def test_overlap_pct_is_nan_without_comm(tmp_path: Path) -> None:
    row = _overlap(_gpu_trace(tmp_path, [(GEMM, 100, 100, 7)]))
    assert math.isnan(row["overlap_pct"]) and row["comm_ns"] == 0
