"""What the profiler cost a run: profiled steps against the same run's other steps, from the timers.

Two sources of truth: timers built here, whose answer is known by construction, and the real H100
recordings of ../shared/traces/gpu-fsdp, whose README states each run's slowdown (fsdpviz's timers,
median of the profiled steps over the median of the other steps after warm-up).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pandas as pd
import pytest

from fsdpviz.analysis.profiler_cost import profiler_cost
from fsdpviz.runfolder import SCHEDULE_TIME_WINDOW, ProfileInfo, RankInfo, RunInfo
from fsdpviz.trace import schema


def _timers(steps_ms: dict[int, list[float]]) -> pd.DataFrame:
    """Whole-step timer records: rank -> the ms of steps 0, 1, 2, ...; plus a unit record per step
    (which must not count)."""
    rows = []
    for rank, times in steps_ms.items():
        for step, ms in enumerate(times):
            rows.append({"rank": rank, "step": step, "unit": "", "phase": "step", "kind": "total", "ms": ms,
                         "bytes": -1})
            rows.append({"rank": rank, "step": step, "unit": "blocks.0", "phase": "forward", "kind": "total",
                         "ms": 1000.0, "bytes": -1})
            rows.append({"rank": rank, "step": step, "unit": "", "phase": "step", "kind": "peak_allocated",
                         "ms": None, "bytes": 1 << 30})
    return schema.conform(pd.DataFrame(rows), schema.TIMERS)


def _run(ranks: int, profiled: list[int], warmup: int = 2, partial: dict[int, int] | None = None,
         schedule: str = "optimizer_steps") -> RunInfo:
    return RunInfo(profile=ProfileInfo(schedule=schedule, steps=profiled, warmup=warmup),
                   ranks=[RankInfo(rank=r, profiled_steps=profiled, partial_step=(partial or {}).get(r))
                          for r in range(ranks)])


def test_medians_per_rank_then_over_ranks() -> None:
    # GIVEN two ranks: warm-up steps 0-1 (slow, never counted), profiled 2-4, then 5-7 unprofiled
    timers = _timers({0: [900, 70, 30, 32, 31, 20, 22, 21], 1: [900, 70, 40, 44, 42, 24, 26, 25]})
    # WHEN
    cost = profiler_cost(timers, _run(2, [2, 3, 4]))
    # THEN rank 0: 31 / 21, rank 1: 42 / 25; the median of two is their mean
    assert cost is not None
    assert cost.profiled_step_ms == pytest.approx((31 + 42) / 2)
    assert cost.unprofiled_step_ms == pytest.approx((21 + 25) / 2)
    assert cost.slowdown == pytest.approx(round(36.5 / 23, 3))
    assert cost.profiled_steps == [2, 3, 4] and cost.unprofiled_steps == [5, 6, 7]
    assert cost.extra_ms == pytest.approx(13.5)


def test_partial_step_and_warmup_are_left_out() -> None:
    # rank 0 ended inside step 7 (its time there is cut short); warm-up 3 leaves step 2 out too
    timers = _timers({0: [900, 70, 50, 30, 30, 30, 20, 1]})
    cost = profiler_cost(timers, _run(1, [3, 4, 5], warmup=3, partial={0: 7}))
    assert cost is not None and cost.unprofiled_steps == [6] and cost.unprofiled_step_ms == 20


@pytest.mark.parametrize("case", ["no run.json", "no timers", "time window", "nothing after", "not profiled"])
def test_no_numbers_where_the_timers_do_not_tell(case: str) -> None:
    timers = _timers({0: [900, 70, 30, 32, 31, 20, 22, 21]})
    run: RunInfo | None = _run(1, [2, 3, 4])
    if case == "no run.json":
        run = None
    elif case == "no timers":
        timers = timers.iloc[:0]
    elif case == "time window":
        run = _run(1, [2, 3, 4], schedule=SCHEDULE_TIME_WINDOW)
    elif case == "nothing after":  # the run ended inside its profiled window
        timers = _timers({0: [900, 70, 30, 32, 31]})
    else:
        run = _run(1, [])
    assert profiler_cost(timers, run) is None


# fsdpviz's timers on an H100 (../shared/traces/gpu-fsdp/README.md, "What these recordings showed")
SLOWDOWNS = {
    "h100-fsdp2-ws1-block": 1.44, "h100-fsdp2-fake8-block": 1.44, "h100-fsdp2-fake8-reshard-false": 1.66,
    "h100-hf-trainer-ws1": 1.35, "h100-fsdp1-fake8-block": 1.29,
}


@pytest.mark.parametrize("name", sorted(SLOWDOWNS))
def test_real_gpu_recordings_lead_with_the_unprofiled_step(name: str, gpu_fsdp_run: Callable[[str], Any]) -> None:
    result = gpu_fsdp_run(name)
    summary = result.summary
    cost = summary.profiler
    assert cost is not None and cost.slowdown == pytest.approx(SLOWDOWNS[name], abs=0.005)
    # the headline's step is the unprofiled one; the trace's own is kept beside it
    assert summary.step_time_ms == cost.unprofiled_step_ms and summary.step_time_source == "timers"
    assert summary.traced_step_time_ms is not None and summary.traced_step_time_ms > 1.2 * summary.step_time_ms
    # a finding says how much of the traced idle time is the profiler's
    (finding,) = [f for f in summary.findings if f.kind == "profiler"]
    assert summary.findings[-1] is finding  # after the run's own findings: the run does not lose this time
    assert finding.lost_ms_per_step == pytest.approx(cost.profiled_step_ms - cost.unprofiled_step_ms, abs=1e-3)
    assert f"{cost.slowdown:.2f}x" in finding.message
    as_json = summary.to_json()
    assert as_json["profiler"]["slowdown"] == cost.slowdown and as_json["step_time_ms"] == cost.unprofiled_step_ms


def test_what_if_baseline_starts_from_the_unprofiled_step(gpu_fsdp_run: Callable[[str], Any]) -> None:
    from fsdpviz.whatif.predict import predict, read_model, recorded_settings

    result = gpu_fsdp_run("h100-fsdp2-gloo2-block")
    prediction = predict(read_model(result), recorded_settings())
    cost = result.summary.profiler
    assert cost is not None and cost.slowdown < 1.10  # a long, comm-bound step: barely slowed
    assert prediction.baseline.step_time_ms == cost.unprofiled_step_ms
    assert not [f for f in result.summary.findings if f.kind == "profiler"]  # below the 10 % that is worth saying
    assert prediction.replay_error_pct < 10  # the gloo communication is in the model too


def test_unit_passes_are_the_unprofiled_steps_own_work() -> None:
    from fsdpviz.analysis.profiler_cost import unit_pass_ms

    # GIVEN blocks.0's forward compute: slow in profiled steps 2-4, 2 ms after; backward timed in
    # two micro-batches per step (summed); blocks.1 missed in step 6 (not timed in every step)
    rows = []
    for step in range(8):
        rows.append({"rank": 0, "step": step, "unit": "", "phase": "step", "kind": "total", "ms": 50.0, "bytes": -1})
        fwd = 3.0 if 2 <= step <= 4 else 2.0 + 0.1 * (step - 5)
        rows.append({"rank": 0, "step": step, "unit": "blocks.0", "phase": "forward", "kind": "compute", "ms": fwd,
                     "bytes": -1})
        rows.append({"rank": 0, "step": step, "unit": "blocks.0", "phase": "forward", "kind": "total", "ms": 99.0,
                     "bytes": -1})
        for _ in range(2):
            rows.append({"rank": 0, "step": step, "unit": "blocks.0", "phase": "backward", "kind": "compute",
                         "ms": 1.5, "bytes": -1})
        if step != 6:
            rows.append({"rank": 0, "step": step, "unit": "blocks.1", "phase": "forward", "kind": "compute",
                         "ms": 1.0, "bytes": -1})
    timers = schema.conform(pd.DataFrame(rows), schema.TIMERS)
    # WHEN
    passes = unit_pass_ms(timers, _run(1, [2, 3, 4]))
    # THEN steps 5-7: forward 2.0, 2.1, 2.2 -> 2.1; backward 1.5 + 1.5
    assert passes == {("blocks.0", "forward"): 2.1, ("blocks.0", "backward"): 3.0}


def test_real_fsdp1_units_read_from_the_timers(gpu_fsdp_dir: Any, gpu_fsdp_run: Callable[[str], Any]) -> None:
    import json
    import statistics

    name = "h100-fsdp1-fake8-block"
    lines = (gpu_fsdp_dir / name / "timers" / "rank0.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    summary = gpu_fsdp_run(name).summary
    for unit in summary.units:
        for phase, got in (("forward", unit.forward_timer_ms), ("backward", unit.backward_timer_ms)):
            ms = [r["ms"] for r in records if r["unit"] == unit.name and r["phase"] == phase
                  and r["kind"] == "compute" and r["step"] >= 5]
            assert got == pytest.approx(statistics.median(ms), abs=1e-3), (unit.name, phase)
