"""What bounds the step, on traces whose answer is known by construction.

Hand-built traces (tests/helpers/kineto.py) fix every gap: which kernel ends it and when that kernel
was launched, so the split into compute, exposed communication, host wait and other idle is exact.
Simulated FSDP2 runs (tests/synth) give the two kinds of step users meet: one whose kernels are far
shorter than the host's work to launch them, one whose all-gathers crawl.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from helpers.kineto import TraceBuilder
from synth import generate_run
from synth.expected import BOUND_FIELDS, bound_ms
from synth.scenario import Scenario, make_units

from fsdpviz.analysis.bound import bound_kind, summarize_bound
from fsdpviz.analysis.figures import bound_words
from fsdpviz.analysis.overlap import compute_overlap
from fsdpviz.analysis.pipeline import RunResult, analyse
from fsdpviz.structure.deprofile import (
    SHRUNK_DEVICE_NOTE,
    Parts,
    deprofiled,
    host_scale,
    idle_scale,
    rank_scale,
)
from fsdpviz.structure.profiler_cost import ProfilerCost
from fsdpviz.trace import load_traces

US = 1000
GEMM = "volta_sgemm_128x64_nn"
NCCL_AG = "ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
STEPS = (1, 2, 3)  # 1 ms each; the analysis keeps 1 and 2 (the last is left out)


def _row(path: Path) -> dict:
    return compute_overlap(load_traces([path], cache=False)).iloc[0].to_dict()


def _launch_bound(tmp_path: Path, *, launches: bool = True) -> Path:
    """Per step: the host launches a 20 µs kernel every 100 µs; each runs 5 µs after its launch."""
    b = TraceBuilder()
    for n in STEPS:
        t0 = (n - 1) * 1000.0
        b.step(n, t0, 1000.0)
        for i in range(10):
            b.kernel(GEMM, t0 + 100 * i + 5, 20, launch_us=t0 + 100 * i if launches else None)
    return b.write(tmp_path / "rank0.trace.json")


def _comm_bound(tmp_path: Path) -> Path:
    """Per step T: compute 10-110 µs, an all-gather 110-710 µs, then compute 750-800 µs; all three
    launched in the first 3 µs, so the GPU's wait 710-750 is for the gather's event, not the host."""
    b = TraceBuilder()
    for n in STEPS:
        t = (n - 1) * 1000.0
        b.step(n, t, 1000.0)
        b.kernel(GEMM, t + 10, 100, stream=7, launch_us=t + 1)
        b.kernel(NCCL_AG, t + 110, 600, stream=20, launch_us=t + 2)
        b.kernel(GEMM, t + 750, 50, stream=7, launch_us=t + 3)
    return b.write(tmp_path / "rank0.trace.json")


def test_launch_bound_step_waits_for_the_host(tmp_path: Path) -> None:
    row = _row(_launch_bound(tmp_path))
    assert row["n_steps"] == 2
    # per step: 10 x 20 µs computing; every gap (before, between and after the kernels) ends with a
    # kernel launched after the gap began
    assert row["bound_window_ns"] == 2 * 1000 * US
    assert row["bound_compute_ns"] == 2 * 200 * US
    assert row["host_wait_ns"] == 2 * 800 * US
    assert row["other_idle_ns"] == 0 and row["bound_exposed_comm_ns"] == 0
    bound = summarize_bound(compute_overlap(load_traces([tmp_path / "rank0.trace.json"], cache=False)), None)
    assert bound is not None
    assert bound.kind == "host" and bound.basis == "traced"
    assert (bound.step_ms, bound.compute_ms, bound.host_wait_ms) == (1.0, 0.2, 0.8)
    assert bound.loss is not None and bound.loss.kind == "host" and bound.loss.share == 0.8


def test_comm_bound_step_splits_exposed_gather_host_wait_and_event_wait(tmp_path: Path) -> None:
    row = _row(_comm_bound(tmp_path))
    per_step = {k: row[k] / 2 / US for k in ("bound_compute_ns", "bound_exposed_comm_ns", "host_wait_ns",
                                              "other_idle_ns")}
    # 0-10 waits for the first launch, 800-1000 for the next step's: host wait 210 µs;
    # 710-750 waits with the kernel already launched: other idle 40 µs
    assert per_step == {"bound_compute_ns": 150, "bound_exposed_comm_ns": 600, "host_wait_ns": 210,
                        "other_idle_ns": 40}
    bound = summarize_bound(compute_overlap(load_traces([tmp_path / "rank0.trace.json"], cache=False)), None)
    assert bound is not None and bound.kind == "communication" and bound.exposed_comm_ms == 0.6


def _gloo_on_cuda(tmp_path: Path, backend: str) -> Path:
    """Per 1000 µs step on a GPU: GEMMs 0-100 and 500-700, the batch's own copy 800-820, and an
    all-gather whose ``c10d::`` op (100-150) copies its input to the host (110-140) and, with gloo,
    runs on gloo's thread (``gloo:all_gather`` 150-400), which copies the result back (400-450)."""
    gloo_tid = 2001
    b = TraceBuilder(backend=backend)
    b.thread(1000, "python3").thread(gloo_tid, "pt_gloo_runloop")
    to_host, to_device = "Memcpy DtoH (Device -> Pinned)", "Memcpy HtoD (Pinned -> Device)"
    for n in STEPS:
        t = (n - 1) * 1000.0
        b.step(n, t, 1000.0)
        b.kernel(GEMM, t, 100, launch_us=t)
        b.cpu_op("c10d::_allgather_base_", t + 100, 50, **{"Input Dims": [[2048], [1024]], "Input type": ["float"] * 2})
        b.kernel(to_host, t + 110, 30, stream=30, launch_us=t + 105, cat="gpu_memcpy")
        if backend == "gloo":
            b.annotation("gloo:all_gather", t + 150, 250, tid=gloo_tid, **{"Input Dims": [[1024]], "Input type": ["float"]})
            b.kernel(to_device, t + 400, 50, stream=31, launch_us=t + 390, launch_tid=gloo_tid, cat="gpu_memcpy")
        b.kernel(GEMM, t + 500, 200, launch_us=t + 490)
        b.kernel(to_device, t + 800, 20, stream=32, launch_us=t + 790, cat="gpu_memcpy")
    return b.write(tmp_path / f"{backend}.trace.json")


def test_copies_a_gloo_collective_stages_on_cuda_are_communication(tmp_path: Path) -> None:
    row = _row(_gloo_on_cuda(tmp_path, "gloo"))
    per_step = {k: row[k] / 2 / US for k in ("bound_comm_ns", "bound_exposed_comm_ns", "bound_compute_ns")}
    # communication: the copy to the host 110-140, gloo's range 150-400 and the copy back 400-450;
    # nothing computes beside it; compute: the GEMMs (300 µs) and the batch's copy (20 µs)
    assert per_step == {"bound_comm_ns": 330, "bound_exposed_comm_ns": 330, "bound_compute_ns": 320}
    # NCCL's collective is its kernel (none here): a copy its op launched stays the model's work
    row = _row(_gloo_on_cuda(tmp_path, "nccl"))
    assert (row["bound_comm_ns"], row["bound_compute_ns"]) == (0, 2 * 350 * US)


def _carried(tmp_path: Path, *, steady: bool) -> Path:
    """Per 1000 µs step n (steps 1-3; 1 and 2 analysed): one kernel of the step's own. ``steady``: each
    step launches its 150 µs kernel at 900 and it runs 950-1100, into the next step, as the step before
    the first did (0-100, launched at -100). Else a 300 µs kernel launched before the first step runs
    0-300, the first step's own kernel queued behind it (300-400), the second's at 1020-1120."""
    b = TraceBuilder()
    for n in STEPS:
        b.step(n, (n - 1) * 1000.0, 1000.0)
    if steady:
        b.kernel(GEMM, 0, 100, launch_us=-100)
        for n in STEPS:
            b.kernel(GEMM, (n - 1) * 1000.0 + 950, 150, launch_us=(n - 1) * 1000.0 + 900)
    else:
        b.kernel(GEMM, 0, 300, launch_us=-50)
        b.kernel(GEMM, 300, 100, launch_us=10)
        b.kernel(GEMM, 1020, 100, launch_us=1010)
        b.kernel(GEMM, 2020, 100, launch_us=2010)
    return b.write(tmp_path / "rank0.trace.json")


def test_work_queued_before_the_steps_is_not_their_compute(tmp_path: Path) -> None:
    overlap = compute_overlap(load_traces([_carried(tmp_path, steady=False)], cache=False))
    row = overlap.iloc[0].to_dict()
    # of 2000 µs: the steps' own kernels 200, the earlier kernel 300 (they waited on it)
    assert (row["bound_compute_ns"], row["carried_ns"]) == (200 * US, 300 * US)
    assert row["bound_window_ns"] == sum(row[k] for k in ("bound_compute_ns", "host_wait_ns", "other_idle_ns",
                                                          "carried_ns"))
    bound = summarize_bound(overlap, None)
    assert bound is not None and bound.basis == "traced"
    # shown per step: compute 0.1 ms, and the carried 0.15 ms with the other idle, which the note says
    assert bound.compute_ms == 0.1 and bound.other_idle_ms == pytest.approx(0.15 + row["other_idle_ns"] / 2 / 1e6)
    assert bound.carried_ms == 0.15 and "other_idle_ms holds 0.150 ms a step" in (bound.note or "")
    assert "other idle 150 µs (15 %; 150 µs of it the GPU ran work queued before the analysed steps) of the" in (
        bound_words(bound).parts)
    # a clean step 0.1 ms shorter: the clean steps carry nothing in, so the de-profiler takes the share
    # out of the carried time first, and the bound keeps (and says) the 0.05 ms left of it
    traced = bound.step_ms
    cost = ProfilerCost(profiled_step_ms=traced, unprofiled_step_ms=traced - 0.1, slowdown=traced / (traced - 0.1),
                        profiled_steps=[1, 2], unprofiled_steps=[5, 6], fewest_unprofiled_steps=2, headline=True)
    moved = summarize_bound(overlap, cost, {0: (traced - 0.1, 2)})
    assert moved is not None and moved.basis == "unprofiled"
    assert moved.carried_ms == pytest.approx(0.05) and moved.other_idle_ms == pytest.approx(bound.other_idle_ms - 0.1)
    assert moved.compute_ms == bound.compute_ms and "other_idle_ms holds 0.050 ms" in (moved.note or "")
    assert "other idle 50 µs (6 %; 50 µs of it the GPU ran work queued before" in bound_words(moved).parts


def _steps_with(tmp_path: Path, extra: Callable[[TraceBuilder], None], name: str) -> dict:
    """Steps 1-3 of 1000 µs (1 and 2 analysed), each launching a 100 µs kernel at 10 that runs 20-120, and
    what ``extra`` adds."""
    b = TraceBuilder()
    for n in STEPS:
        t = (n - 1) * 1000.0
        b.step(n, t, 1000.0)
        b.kernel(GEMM, t + 20, 100, launch_us=t + 10)
    extra(b)
    return _row(b.write(tmp_path / f"{name}.trace.json"))


def test_a_kernel_without_a_launch_is_queued_before_only_ahead_of_the_steps_own_work(tmp_path: Path) -> None:
    # before step 1's first kernel, with no launch record: launched before tracing began (carried)
    row = _steps_with(tmp_path, lambda b: b.kernel(GEMM, 0, 15), "ahead")
    assert (row["bound_compute_ns"], row["carried_ns"]) == (200 * US, 15 * US)
    # mid-step, after the step's own kernel, with no launch record: a launch the profiler missed (the step's)
    row = _steps_with(tmp_path, lambda b: b.kernel(GEMM, 500, 200), "mid")
    assert (row["bound_compute_ns"], row["carried_ns"]) == (400 * US, 0)


def test_a_tail_without_a_launch_across_the_gap_between_steps_is_handed_on(tmp_path: Path) -> None:
    # spans of 950 µs, 50 µs apart (as ProfilerSteps are); a kernel with no launch record runs 1000-1015,
    # ahead of step 2's own (1020-1120): step 1's tail, handed on across the gap, not carried
    b = TraceBuilder()
    for n in STEPS:
        t = (n - 1) * 1000.0
        b.step(n, t, 950.0)
        b.kernel(GEMM, t + 20, 100, launch_us=t + 10)
    b.kernel(GEMM, 1000, 15)
    row = _row(b.write(tmp_path / "gap.trace.json"))
    assert (row["bound_compute_ns"], row["carried_ns"]) == (215 * US, 0)


def test_earlier_work_beside_the_steps_own_is_not_carried(tmp_path: Path) -> None:
    # 0-60 on another stream, launched before the steps: only 0-20 ran alone (20-120 is step 1's kernel)
    row = _steps_with(tmp_path, lambda b: b.kernel(GEMM, 0, 60, stream=8, launch_us=-5), "beside")
    assert (row["bound_compute_ns"], row["carried_ns"]) == (200 * US, 20 * US)


def test_steps_apart_count_each_ones_own_tail(tmp_path: Path) -> None:
    """Steps 1, 3 and 5 of six analysed apart: each step's 150 µs kernel runs 950-1100, into the step after,
    as the step before the first's did (0-100), but step 2's runs 1950-2300, 300 µs into step 3. The spans
    take in 100 + 300 + 100 µs of earlier steps' work and their steps hand on 100 + 100 + 100: 200 µs is
    carried, and each step's compute is its own kernel."""
    b = TraceBuilder()
    b.kernel(GEMM, 0, 100, launch_us=-100)
    for n in range(1, 7):
        t = (n - 1) * 1000.0
        b.step(n, t, 1000.0)
        b.kernel(GEMM, t + 950, 350 if n == 2 else 150, launch_us=t + 900)
    traces = load_traces([b.write(tmp_path / "apart.trace.json")], cache=False)
    row = compute_overlap(traces, steps=[1, 3, 5]).iloc[0].to_dict()
    assert row["n_steps"] == 3
    assert (row["bound_compute_ns"], row["carried_ns"]) == (3 * 150 * US, 200 * US)


def _copy_beside_gloo(tmp_path: Path, *, nccl: bool, gloo: bool) -> dict:
    """Per 1000 µs step: a GEMM 10-110, an all-gather's ``c10d::*`` op (120-160) that launches a device
    copy (330-430) and, with ``nccl``, its NCCL kernel (130-330; without: torch's fake group, which runs
    no collective), and with ``gloo`` a gloo group's barrier (905-915)."""
    b = TraceBuilder(backend="nccl" if nccl else "fake")
    b.thread(1000, "python3").thread(2001, "pt_gloo_runloop")
    for n in STEPS:
        t = (n - 1) * 1000.0
        b.step(n, t, 1000.0)
        b.kernel(GEMM, t + 10, 100, launch_us=t + 1)
        b.cpu_op("c10d::allgather_" if nccl else "c10d::_allgather_base_", t + 120, 40)
        if nccl:
            b.kernel(NCCL_AG, t + 130, 200, stream=20, launch_us=t + 125)
        b.kernel("Memcpy DtoD (Device -> Device)", t + 330, 100, stream=20, launch_us=t + 150, cat="gpu_memcpy")
        if gloo:
            b.cpu_op("c10d::barrier", t + 900, 20)
            b.annotation("gloo:barrier", t + 905, 10, tid=2001)
    return _row(b.write(tmp_path / f"copy-nccl{int(nccl)}-gloo{int(gloo)}.trace.json"))


@pytest.mark.parametrize("nccl", [True, False], ids=["nccl", "fake group"])
def test_a_collective_ops_copy_stays_the_models_beside_a_gloo_group(tmp_path: Path, nccl: bool) -> None:
    """The copy a NCCL list all-gather's op launches (its collective is its kernel), or a fake group's op
    (it runs no collective), is not a gloo collective's, also beside a gloo barrier: no gloo op ran an
    all-gather. It stays the model's work, as without the gloo group."""
    alone = _copy_beside_gloo(tmp_path, nccl=nccl, gloo=False)
    beside = _copy_beside_gloo(tmp_path, nccl=nccl, gloo=True)
    assert alone["bound_compute_ns"] == beside["bound_compute_ns"] == 2 * 200 * US
    assert beside["bound_comm_ns"] - alone["bound_comm_ns"] == 2 * 10 * US  # the barrier's own range
    assert alone["bound_comm_ns"] == (2 * 200 * US if nccl else 0)


def test_a_steady_tail_into_the_next_step_stays_compute(tmp_path: Path) -> None:
    # each step hands the next as much as it got: the windows' busy time is the steps' own work
    row = _row(_carried(tmp_path, steady=True))
    assert (row["bound_compute_ns"], row["carried_ns"]) == (300 * US, 0)


def test_each_of_several_gloo_collectives_issued_ahead_stages_its_copies(tmp_path: Path) -> None:
    """Three asynchronous all-reduces on one gloo group, issued one after another (100, 130, 160 µs) before
    gloo runs them (300, 400, 500; 80 µs each): each ``c10d::allreduce_`` copied its input to the host
    (200-220, 230-250, 260-280), and each copy is its collective's communication."""
    b = TraceBuilder(backend="gloo")
    b.thread(1000, "python3").thread(2001, "pt_gloo_runloop")
    for n in STEPS:
        t = (n - 1) * 1000.0
        b.step(n, t, 1000.0)
        b.kernel(GEMM, t + 10, 50, launch_us=t + 1)
        for k in range(3):
            b.cpu_op("c10d::allreduce_", t + 100 + 30 * k, 20, **{"Input Dims": [[256]], "Input type": ["float"]})
            b.kernel("Memcpy DtoH (Device -> Pinned)", t + 200 + 30 * k, 20, stream=30, launch_us=t + 105 + 30 * k,
                     cat="gpu_memcpy")
            b.annotation("gloo:all_reduce", t + 300 + 100 * k, 80, tid=2001,
                         **{"Input Dims": [[256]], "Input type": ["float"]})
    row = _row(b.write(tmp_path / "async.trace.json"))
    per_step = {k: row[k] / 2 / US for k in ("bound_comm_ns", "bound_exposed_comm_ns", "bound_compute_ns")}
    assert per_step == {"bound_comm_ns": 300, "bound_exposed_comm_ns": 300, "bound_compute_ns": 50}


def test_without_launches_host_wait_is_unknown(tmp_path: Path) -> None:
    overlap = compute_overlap(load_traces([_launch_bound(tmp_path, launches=False)], cache=False))
    assert overlap["host_wait_ns"].iat[0] == -1
    assert overlap["other_idle_ns"].iat[0] == 2 * 800 * US  # all idle, cause unknown
    bound = summarize_bound(overlap, None)
    assert bound is not None and bound.host_wait_ms is None and "no kernel launches" in (bound.note or "")
    assert bound.kind == "mixed"  # idle dominates, cause unknown


def test_cpu_step_splits_compute_exposed_gloo_and_idle(tmp_path: Path) -> None:
    """A CPU rank (gloo): per 1000 µs step, compute 100-300 and 500-600 (300 µs: the issuing op
    300-350 and the rest of the op that issued it, 350-360, wait for the collective), a gloo
    all-gather 200-400 on its own thread (exposed where no compute runs: 300-400, 100 µs), the rest of
    the step idle (600 µs); no host wait on a CPU."""
    gloo_tid = 2001
    b = TraceBuilder(backend="gloo")
    b.thread(1000, "python3").thread(gloo_tid, "pt_gloo_runloop")
    for n in STEPS:
        t = (n - 1) * 1000.0
        b.step(n, t, 1000.0)
        b.cpu_op("aten::linear", t + 100, 200)
        b.cpu_op("autograd::engine::evaluate_function: MmBackward0", t + 280, 80)
        b.cpu_op("c10d::_allgather_base_", t + 300, 50)
        b.cpu_op("_c10d_functional::wait_tensor", t + 400, 100)
        b.cpu_op("aten::add_", t + 500, 100)
        b.annotation("gloo:all_gather", t + 200, 200, tid=gloo_tid, **{"Input Dims": [[1024]], "Input type": ["float"]})
    overlap = compute_overlap(load_traces([b.write(tmp_path / "rank0.trace.json")], cache=False))
    bound = summarize_bound(overlap, None)
    assert bound is not None and bound.device == "cpu" and bound.basis == "traced"
    assert (bound.step_ms, bound.compute_ms, bound.exposed_comm_ms, bound.other_idle_ms) == (1.0, 0.3, 0.1, 0.6)
    assert bound.host_wait_ms is None and "CPU rank" in (bound.note or "")
    assert bound.loss is not None and bound.loss.kind == "idle" and bound.loss.ms == 0.6


def test_profiler_share_comes_out_of_a_gpu_steps_host_wait_first() -> None:
    # traced 100 = 40 compute + 10 comm + 30 host + 20 other; unprofiled 70: 30 out of host wait
    assert deprofiled(Parts(40, 10, 30, 20), 70, "gpu") == (Parts(40, 10, 0, 20), None)
    # unprofiled 55: all the host wait, then 15 of the other idle
    assert deprofiled(Parts(40, 10, 30, 20), 55, "gpu") == (Parts(40, 10, 0, 5), None)
    # FSDP's share of the host wait gives up the excess with the rest of it, in proportion
    assert deprofiled(Parts(40, 10, 20, 20, 0, 10), 85, "gpu") == (Parts(40, 10, 10, 20, 0, 5), None)
    # an unprofiled step 2 longer than the traced one (noise the headline accepts): nothing to take out,
    # and the 2 the trace did not see is other idle, so the parts still add up to the step
    assert deprofiled(Parts(40, 10, 30, 20), 102, "gpu") == (Parts(40, 10, 30, 22), None)
    # more excess than idle: the device parts shrink, and the rule says so
    moved, note = deprofiled(Parts(60, 20, 10, 10), 60, "gpu")
    assert moved == Parts(45, 15, 0, 0) and note == SHRUNK_DEVICE_NOTE
    # work carried in from before the traced steps comes out first, then the host wait
    assert deprofiled(Parts(40, 10, 30, 20, 0, 0, 5), 98, "gpu") == (Parts(40, 10, 28, 20), None)
    # what the excess leaves of it is shown as other idle: the steps waited on it
    moved, _ = deprofiled(Parts(40, 10, 30, 20, 0, 0, 5), 103, "gpu")
    assert moved == Parts(40, 10, 30, 20, 0, 0, 3) and moved.settled() == Parts(40, 10, 30, 23)


def test_a_gpu_passs_gaps_move_by_the_share_of_the_steps_idle_kept() -> None:
    # the rule's cases above, as the factors a unit pass's gaps move by (a pass's share of the step's
    # host wait and other idle gives up as much of itself as the step's does)
    def factors(parts: Parts, step: float) -> tuple[float, float]:
        moved, _ = deprofiled(parts, step, "gpu")
        return host_scale(parts, moved), idle_scale(parts, moved)

    assert factors(Parts(40, 10, 30, 20), 70) == (0.0, 1.0)  # the host wait gave up all, other idle none
    assert factors(Parts(40, 10, 30, 20), 55) == (0.0, 0.25)  # then 15 of the 20 other idle
    assert factors(Parts(40, 10, 20, 20, 0, 10), 85) == (0.5, 1.0)  # FSDP's share with the rest, in proportion
    assert factors(Parts(40, 10, 30, 20), 102) == (1.0, 1.0)  # the 2 the trace did not see lie in no pass
    assert factors(Parts(40, 10, 30, 0), 75) == (pytest.approx(5 / 6), 1.0)  # 5 of 30 out; no other idle to move


def test_a_cpu_step_is_scaled_whole() -> None:
    # a CPU rank's thread is the device: every part moves by the rank's clean / traced factor
    moved, note = deprofiled(Parts(60.0, 20.0, None, 20.0, 0.0, 10.0), 55.0, "cpu")
    assert note is None and moved == Parts(30.0, 10.0, None, 10.0, 0.0, 5.0)
    assert rank_scale(55.0, 110.0) == 0.5 and rank_scale(55.0, 0.0) == 1.0


def test_bound_kind_needs_half_the_step() -> None:
    # where the parts are medians over ranks that add up short of the (median) step, half of the step,
    # not of their sum: 35 of an 84 ms step is 42 % (of the parts' 60 ms, 58 %)
    assert bound_kind(7, 35, None, 9, 9) == "communication"
    assert bound_kind(7, 35, None, 9, 9, step=84) == "mixed"
    assert bound_kind(7, 45, None, 9, 9, step=84) == "communication"
    assert bound_kind(60, 10, 20, 10) == "compute"
    assert bound_kind(30, 50, 10, 10) == "communication"
    assert bound_kind(40, 30, 20, 10) == "mixed"
    assert bound_kind(10, 0, None, 90) == "idle"


@pytest.mark.parametrize(("scenario", "kind"), [
    # 2 µs kernels behind 12 µs of host work each: the GPU waits for launches
    (Scenario(units=make_units(4, numel=20_000, fwd_ns=8_000, bwd_ns=16_000), steps=(3, 4, 5)), "host"),
    # gathers at 0.05 bytes/ns: 4M bf16 parameters take 160 ms against 1.2 ms of compute
    (Scenario(units=make_units(4), comm_bytes_per_ns=0.05, steps=(3, 4, 5)), "communication"),
])
def test_simulated_fsdp2_steps_name_their_bound(tmp_path: Path, scenario: Scenario, kind: str) -> None:
    run = generate_run(scenario, tmp_path / "run")
    summary = analyse([run.folder], cache=False).summary
    bound = summary.bound
    assert bound is not None and bound.kind == kind and bound.loss is not None and bound.loss.kind == kind
    # each part as the simulation knows it (synth/expected.py: which GPU event ran when, which was a
    # collective, what its start waited for), per analysed step
    truth = bound_ms(run.expected.bound, summary.steps)
    assert sorted(truth.index) == sorted(int(r) for r in bound.per_rank)
    # FSDP's copies and hooks are part of every simulated step: the split is not trivially zero
    assert (truth["fsdp_kernels_ns"] > 0).all() and (truth["fsdp_overhead_ns"] > truth["fsdp_kernels_ns"]).all()
    for rank, got in bound.per_rank.items():
        for field, column, tolerance in BOUND_FIELDS:
            assert getattr(got, field) == pytest.approx(truth.at[int(rank), column], abs=tolerance), (rank, field)


def test_host_wait_goes_to_the_innermost_unit_window_holding_the_launch() -> None:
    import numpy as np
    import pandas as pd

    from fsdpviz.analysis.bound import unit_host_wait

    unit_steps = pd.DataFrame({"step": [1, 1, 1], "unit": ["(root)", "blocks.0", "blocks.1"],
                               "phase": ["forward"] * 3})
    # the root's forward window holds both blocks' windows
    windows = pd.DataFrame({"step": [1, 1, 1], "unit": ["(root)", "blocks.0", "blocks.1"], "phase": ["forward"] * 3,
                            "start_ns": [0, 100, 400], "end_ns": [1000, 300, 600]})
    launches = np.array([50, 150, 250, 450, 1200])  # root, blocks.0 twice, blocks.1, after every window
    gaps = np.array([7, 11, 13, 17, 19])
    assert unit_host_wait(unit_steps, windows, launches, gaps).tolist() == [7, 24, 17]


def test_units_host_wait_is_part_of_the_ranks(tmp_path: Path) -> None:
    run = generate_run(Scenario(units=make_units(4, numel=20_000, fwd_ns=8_000, bwd_ns=16_000), steps=(3, 4, 5)),
                       tmp_path / "run")
    summary = analyse([run.folder], cache=False).summary
    assert summary.bound is not None
    units = sum(u.host_wait_ms or 0.0 for u in summary.units)
    # a unit's host wait holds the waits for FSDP's hooks, which the rank's bound counts as FSDP's
    ranks = float(np.median([(r.host_wait_ms or 0.0) + r.fsdp_overhead_ms - (r.fsdp_kernels_ms or 0.0)
                             for r in summary.bound.per_rank.values()]))
    # every unit's host work keeps the GPU waiting; the step's data loading and optimizer do too
    assert all((u.host_wait_ms or 0) > 0 for u in summary.units if u.name != "(root)")
    assert 0.2 * ranks < units <= ranks + 0.01


def test_cpu_units_have_no_host_wait(sample_run: Callable[[str], RunResult]) -> None:
    summary = sample_run("fsdp2-cpu-2rank").summary
    assert summary.units and all(u.host_wait_ms is None for u in summary.units)
