"""What the profiler cost a run: profiled steps against the same run's other steps, from the timers.

Two sources of truth: timers built here with a slowdown injected into the profiled steps, whose
answer is known by construction, and the real H100 recordings of ../shared/traces/gpu-fsdp, where two
instruments measured the same steps: the profiler's own ProfilerStep spans in the trace and the
recorder's wall clock of every step in the timers files (both read here from the files themselves).
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from helpers.rawfiles import raw_trace, timer_step_ms

from fsdpviz.runfolder import SCHEDULE_TIME_WINDOW, ProfileInfo, RankInfo, RunInfo
from fsdpviz.structure.profiler_cost import profiler_cost
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


def test_a_known_slowdown_injected_into_the_profiled_steps_is_measured() -> None:
    # GIVEN two ranks whose clean steps (6-8) take 19-21 and 25-27 ms, and whose profiled steps (2-4)
    # take exactly 1.5x the clean step of the same position; steps 0-1 (warming up) and step 5 (right
    # after the trace export) take far longer, so counting any of them would move every number
    clean = {0: [19.0, 21.0, 20.0], 1: [25.0, 27.0, 26.0]}
    factor = 1.5
    timers = _timers({r: [900, 70, *(factor * ms for ms in c), 400, *c] for r, c in clean.items()})
    # WHEN
    cost = profiler_cost(timers, _run(2, [2, 3, 4]))
    # THEN the slowdown is the injected one, and the clean step the ranks' typical 20 and 26 ms
    assert cost is not None
    assert cost.slowdown == pytest.approx(factor, abs=1e-3)
    assert cost.unprofiled_step_ms == pytest.approx((20 + 26) / 2)
    assert cost.profiled_step_ms == pytest.approx(factor * (20 + 26) / 2)
    assert cost.extra_ms == pytest.approx((factor - 1) * (20 + 26) / 2)
    assert cost.profiled_steps == [2, 3, 4] and cost.unprofiled_steps == [6, 7, 8]
    assert cost.left_out_steps == [0, 1, 5] and cost.fewest_unprofiled_steps == 3
    assert cost.headline and cost.note is None


def test_a_traced_rank_whose_timers_hold_none_of_its_steps_timed_no_clean_step() -> None:
    # GIVEN rank 0's timer file cut short after its first two steps (its profiled and clean steps lost),
    # rank 1's whole: rank 0 timed no clean step, so the clean steps cannot lead (every rank needs them)
    whole = [900, 70, 30, 31, 32, 400, 20, 21, 22]
    timers = _timers({0: whole[:2], 1: whole})
    cost = profiler_cost(timers, _run(2, [2, 3, 4]))
    assert cost is not None and cost.fewest_unprofiled_steps == 0 and not cost.headline
    assert cost.note is not None and cost.note.startswith("the step time is the traced one: rank 0 timed 0 clean")
    assert "its timers hold none of the steps the profiler traced on it" in cost.note
    # the figures rank 1 timed are still its own
    assert cost.unprofiled_step_ms == 21 and cost.profiled_step_ms == 31
    # rank 1's trace read alone (a Perfetto export of rank 1, which keeps run.json whole): rank 0 is not in the
    # run being read, so its timers are not missing from it, and rank 1's clean steps lead
    alone = profiler_cost(timers, _run(2, [2, 3, 4]), ranks=[1])
    assert alone is not None and alone.headline and alone.fewest_unprofiled_steps == 3 and alone.note is None


def test_no_slowdown_injected_is_measured_as_none() -> None:
    # GIVEN profiled steps exactly as long as the clean ones (a profiler that costs nothing)
    timers = _timers({0: [900, 70, 20, 21, 22, 400, 21, 20, 22]})
    cost = profiler_cost(timers, _run(1, [2, 3, 4]))
    assert cost is not None and cost.slowdown == pytest.approx(1.0, abs=1e-3) and cost.extra_ms == pytest.approx(0)


def test_steps_before_the_profiled_window_count() -> None:
    # GIVEN profiled 6-8: steps 2-4 timed unprofiled, 5 the profiler's warm-up (slower), 9 after the export
    timers = _timers({0: [900, 70, 20, 21, 22, 45, 30, 30, 30, 99]})
    cost = profiler_cost(timers, _run(1, [6, 7, 8], warmup=6))
    assert cost is not None and cost.unprofiled_steps == [2, 3, 4] and cost.unprofiled_step_ms == 21
    assert cost.left_out_steps == [0, 1, 5, 9] and cost.headline


def test_partial_step_and_profiler_steps_are_left_out() -> None:
    # rank 0 ended inside step 10 (its time there is cut short); profiled 3-5: step 2 warmed the
    # profiler up, step 6 followed the export; 7-9 are the clean ones
    timers = _timers({0: [900, 70, 50, 30, 30, 30, 60, 20, 19, 21, 1]})
    cost = profiler_cost(timers, _run(1, [3, 4, 5], warmup=3, partial={0: 10}))
    assert cost is not None and cost.unprofiled_steps == [7, 8, 9] and cost.unprofiled_step_ms == 20
    assert cost.left_out_steps == [0, 1, 2, 6, 10]


@pytest.mark.parametrize("case", ["no run.json", "no timers", "time window", "nothing after", "only the export step",
                                  "not profiled"])
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
    elif case == "only the export step":  # the one step after the window paid for the trace export
        timers = _timers({0: [900, 70, 30, 32, 31, 50]})
    else:
        run = _run(1, [])
    assert profiler_cost(timers, run) is None


# Every H100 recording of ../shared/traces/gpu-fsdp: profiled steps 2-4 (run.json), step 5 right after the
# trace export, clean steps from 6 on. Two instruments measured each step: the profiler itself (the
# trace's ProfilerStep#N spans, on the trace's clock) and the recorder's timers (CUDA events, every step).
GPU_RECORDINGS = ["h100-fsdp1-fake8-block", "h100-fsdp1-ws1-block", "h100-fsdp2-fake8-block",
                  "h100-fsdp2-fake8-block-modelB", "h100-fsdp2-fake8-reshard-false", "h100-fsdp2-gloo2-block",
                  "h100-fsdp2-ws1-block", "h100-hf-trainer-ws1"]
PROFILED = (2, 3, 4)
FIRST_CLEAN = 6


def _timer_step_ms(run_dir: Path, rank: int = 0) -> dict[int, float]:
    return timer_step_ms(run_dir / "timers" / f"rank{rank}.jsonl")


def _traced_step_ms(run_dir: Path, rank: int = 0) -> dict[int, float]:
    """The profiler's own length of each profiled step: its ProfilerStep#N span in the trace file."""
    (path,) = (run_dir / "traces").glob(f"rank{rank}.trace.json*")
    raw = raw_trace(path)
    return {step: raw.step_ms(step) for step in raw.steps}


@pytest.mark.parametrize("name", GPU_RECORDINGS)
def test_real_gpu_recordings_measure_the_slowdown_the_profiler_traced(name: str, gpu_fsdp_dir: Path,
                                                                      gpu_fsdp_run: Callable[[str], Any]) -> None:
    """The slowdown is the profiler's own step lengths (the analysed steps' ProfilerStep#N spans, mean)
    over the recorder's wall clock of the clean steps (1.06x for the gloo run's long steps, 1.8x for
    model B's launch-bound ones), and the two instruments agree on the profiled steps within 5 % on
    every recording: the trace's spans and the timers' CUDA events of the same steps."""
    run_dir = gpu_fsdp_dir / name
    assert json.loads((run_dir / "run.json").read_text())["profile"]["steps"] == list(PROFILED)
    wall = _timer_step_ms(run_dir)
    clean_ms = statistics.median(ms for step, ms in wall.items() if step >= FIRST_CLEAN)
    spans = _traced_step_ms(run_dir)
    assert statistics.median(spans[s] for s in PROFILED) == pytest.approx(
        statistics.median(wall[s] for s in PROFILED), rel=0.05)
    summary = gpu_fsdp_run(name).summary
    cost = summary.profiler
    assert cost is not None
    traced_ms = statistics.fmean(spans[s] for s in summary.steps)
    ranks = len(json.loads((run_dir / "run.json").read_text())["ranks"])
    # one rank: the run's traced step is rank 0's; more: the median over ranks, near rank 0's
    assert cost.profiled_step_ms == summary.traced_step_time_ms
    assert cost.slowdown == pytest.approx(traced_ms / cost.unprofiled_step_ms, rel=1e-3 if ranks == 1 else 0.05)
    assert 5 in cost.left_out_steps and 5 not in cost.unprofiled_steps
    if len(json.loads((run_dir / "run.json").read_text())["ranks"]) == 1:
        assert cost.unprofiled_step_ms == pytest.approx(clean_ms, abs=1e-3)


def test_a_recording_with_four_clean_steps_leads_with_the_unprofiled_step(
        gpu_fsdp_dir: Path, gpu_fsdp_run: Callable[[str], Any]) -> None:
    """FSDP2 on one H100, 10 steps: 6-9 ran clean after the export, enough to lead with."""
    name = "h100-fsdp2-ws1-block"
    run_dir = gpu_fsdp_dir / name
    wall, traced = _timer_step_ms(run_dir), _traced_step_ms(run_dir)
    assert sorted(s for s in wall if s >= FIRST_CLEAN) == [6, 7, 8, 9]
    summary = gpu_fsdp_run(name).summary
    cost = summary.profiler
    assert cost is not None and cost.headline and cost.unprofiled_steps == [6, 7, 8, 9]
    clean_ms = statistics.median(wall[s] for s in (6, 7, 8, 9))
    # the headline's step is the wall clock's clean step; the trace's own is kept beside it
    assert summary.step_time_source == "timers" and summary.step_time_ms == pytest.approx(clean_ms, abs=1e-3)
    assert summary.to_json()["step_time_ms"] == summary.step_time_ms
    assert summary.traced_step_time_ms == pytest.approx(statistics.mean(traced[s] for s in summary.steps), abs=1e-3)
    # a finding says how much of the traced step is the profiler's, after the run's own findings
    (finding,) = [f for f in summary.findings if f.kind == "profiler"]
    assert summary.findings[-1] is finding
    assert finding.lost_ms_per_step == pytest.approx(statistics.mean(traced[s] for s in summary.steps) - clean_ms,
                                                     abs=1e-3)
    assert f"{cost.slowdown:.2f}x" in finding.message
    assert summary.to_json()["profiler"]["slowdown"] == cost.slowdown


# The README's bare runs of these commands (median wall time of steps 3-9, no fsdpviz), where it gives one.
BARE_STEP_MS = {"h100-fsdp2-fake8-block": 53.2, "h100-fsdp2-fake8-reshard-false": 50.9}


@pytest.mark.parametrize("name", ["h100-fsdp2-fake8-block", "h100-fsdp2-fake8-reshard-false", "h100-hf-trainer-ws1",
                                  "h100-fsdp1-fake8-block"])
def test_recordings_with_two_clean_steps_lead_with_them(
        name: str, gpu_fsdp_dir: Path, gpu_fsdp_run: Callable[[str], Any]) -> None:
    """8 steps: 6 and 7 ran clean after the export, the clean steps there are. The headline is their
    median (read here from the timer file itself), the bound splits that step, and the clock says how
    many steps it rests on; where the README ran the command bare, the headline is within its +-10 %."""
    from fsdpviz.whatif.gains import completed_summary

    run_dir = gpu_fsdp_dir / name
    timed = _timer_step_ms(run_dir)
    assert sorted(s for s in timed if s >= FIRST_CLEAN) == [6, 7]
    result = gpu_fsdp_run(name)
    summary = result.summary
    cost = summary.profiler
    assert cost is not None and cost.headline and cost.unprofiled_steps == [6, 7]
    assert summary.step_time_source == "timers"
    assert summary.step_time_ms == pytest.approx(statistics.median([timed[6], timed[7]]), abs=1e-3)  # one rank
    assert summary.bound is not None and summary.bound.step_ms == summary.step_time_ms
    clock = completed_summary(result).clock
    assert clock is not None and clock.profiler_share_ms == pytest.approx(cost.extra_ms, abs=1e-3)
    if clock.replay_error_pct is not None:
        assert clock.clean_steps == 2
    if name in BARE_STEP_MS:
        assert summary.step_time_ms == pytest.approx(BARE_STEP_MS[name], rel=0.10)


@pytest.mark.parametrize("name", ["h100-fsdp2-gloo2-block", "h100-fsdp2-ws1-block"])
def test_what_if_is_on_the_summarys_clock(name: str, gpu_fsdp_run: Callable[[str], Any]) -> None:
    from fsdpviz.replay.model import recorded_settings
    from fsdpviz.replay.settings import Settings
    from fsdpviz.whatif.gains import completed_summary, summary_model
    from fsdpviz.whatif.predict import predict

    result = gpu_fsdp_run(name)
    # the run's one model, the one `fsdpviz whatif` predicts on (commands/whatif.py), already read for the
    # fixture's result: not read a second time
    model, why_not = summary_model(result)
    assert model is not None, why_not
    cost = result.summary.profiler
    assert cost is not None and cost.headline
    clock = completed_summary(result).clock
    assert clock is not None
    replay, none = predict(model, recorded_settings()), predict(model, Settings(prefetch=0))
    for prediction in (replay, none):
        # one clock: the baseline is the summary's step (the timers' clean steps), on the summary's basis
        # (the basis is the clock's by construction, one model; the step is held to the timers' figure)
        assert prediction.to_json()["basis"] == clock.basis
        assert prediction.baseline.step_time_ms == result.summary.step_time_ms == cost.unprofiled_step_ms
        assert prediction.to_json()["profiler"]["unprofiled_step_ms"] == cost.unprofiled_step_ms
    # as recorded, the prediction is the summary itself
    assert replay.predicted.step_time_ms == pytest.approx(result.summary.step_time_ms, abs=1e-3)
    if name == "h100-fsdp2-gloo2-block":
        assert cost.slowdown < 1.10  # a long, comm-bound step: barely slowed
        assert not [f for f in result.summary.findings if f.kind == "profiler"]  # below the 10 % worth saying
        assert replay.traced_replay_error_pct < 10  # the gloo communication is in the model too


def test_unit_passes_are_the_unprofiled_steps_own_work() -> None:
    from fsdpviz.structure.profiler_cost import unit_pass_ms

    # GIVEN blocks.0's forward compute: slow in profiled steps 2-4, 2 ms after; backward timed in
    # two micro-batches per step (summed); blocks.1 missed in step 7 (not timed in every step); step 5,
    # right after the trace export, slower still (never counted)
    rows = []
    for step in range(9):
        rows.append({"rank": 0, "step": step, "unit": "", "phase": "step", "kind": "total", "ms": 50.0, "bytes": -1})
        fwd = 3.0 if 2 <= step <= 5 else 2.0 + 0.1 * (step - 6)
        rows.append({"rank": 0, "step": step, "unit": "blocks.0", "phase": "forward", "kind": "compute", "ms": fwd,
                     "bytes": -1})
        rows.append({"rank": 0, "step": step, "unit": "blocks.0", "phase": "forward", "kind": "total", "ms": 99.0,
                     "bytes": -1})
        for _ in range(2):
            rows.append({"rank": 0, "step": step, "unit": "blocks.0", "phase": "backward", "kind": "compute",
                         "ms": 1.5, "bytes": -1})
        if step != 7:
            rows.append({"rank": 0, "step": step, "unit": "blocks.1", "phase": "forward", "kind": "compute",
                         "ms": 1.0, "bytes": -1})
    timers = schema.conform(pd.DataFrame(rows), schema.TIMERS)
    # WHEN
    passes = unit_pass_ms(timers, _run(1, [2, 3, 4]))
    # THEN steps 6-8: forward 2.0, 2.1, 2.2 -> 2.1; backward 1.5 + 1.5
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
                  and r["kind"] == "compute" and r["step"] >= 6]  # 5: right after the trace export
            assert got == pytest.approx(statistics.median(ms), abs=1e-3), (unit.name, phase)


def test_a_cpu_runs_profiler_finding_does_not_put_the_share_in_its_idle_time(
        sample_run: Callable[[str], Any]) -> None:
    """On a CPU rank the de-profiler scales every part of the step (structure/deprofile.py): the
    bound's idle time loses only its part of the profiler's share, so the finding may not say that the
    share is idle time, as a GPU run's does."""
    summary = sample_run("fsdp2-cpu-2rank").summary
    bound, cost = summary.bound, summary.profiler
    assert bound is not None and cost is not None and bound.device == "cpu"
    (finding,) = [f for f in summary.findings if f.kind == "profiler"]
    assert "idle" not in finding.message
    assert f"{cost.extra_ms:.2f} ms of each traced step is the profiler's" in finding.message
    # the reason: the bound's other idle lost less than the share (every part lost its part of it)
    traced_idle = bound.other_idle_ms / bound.device_scale
    assert traced_idle - bound.other_idle_ms < 0.5 * cost.extra_ms


@pytest.mark.parametrize("name", ["B", "Bl"])
def test_a_gpu_runs_profiler_finding_takes_the_share_out_of_the_bounds_waits(
        name: str, gpu_h200_run: Callable[[str], Any]) -> None:
    """On a GPU the de-profiler takes the profiler's share out of the time the GPU waited (host wait,
    FSDP's hooks' share of it, other idle: structure/deprofile.py). The finding says the share fits in
    those waits, which are the traced step less the device's own work (the kernels the profiler does
    not slow: the bound's compute, FSDP's copy kernels and exposed communication), and gives no traced
    figure of its own beside the bound's and the overlap's: every ms figure it names is the share, the
    profiled step or the unprofiled one."""
    import re

    # the session's result, its bound the replay's split: that moves the host's waits (host wait, FSDP's
    # hooks' share), none of which is read here; the share, the device's own work (kernels the profiler does
    # not slow), the traced step and the finding's words are the analysis' own, as a fresh result's
    summary = gpu_h200_run(name).summary
    bound, cost = summary.bound, summary.profiler
    assert bound is not None and cost is not None and bound.device == "gpu" and bound.device_scale == 1.0
    (finding,) = [f for f in summary.findings if f.kind == "profiler"]
    assert f"{bound.profiler_share_ms:.2f} ms of each traced step is the profiler's, all of it time the GPU waited " \
        "as traced" in finding.message
    device = bound.compute_ms + (bound.fsdp_kernels_ms or 0.0) + bound.exposed_comm_ms
    assert bound.profiler_share_ms < summary.traced_step_time_ms - device  # it does fit (B: 39.83 of 86.72 ms)
    named = {float(v) for v in re.findall(r"([\d.]+) ms", finding.message)}
    assert named == {round(v, 2) for v in (bound.profiler_share_ms, cost.profiled_step_ms, cost.unprofiled_step_ms)}


def _ranks(host_cores: list[tuple[str | None, int | None]], backend: str = "gloo") -> list[RankInfo]:
    return [RankInfo(rank=i, host=host, cpu_count=cores, backend=backend) for i, (host, cores) in enumerate(host_cores)]


def test_the_closer_base_says_only_what_the_recording_did() -> None:
    """How to record a base closer to the run, from run.json alone: Python stacks recorded, the memory
    profiler on (or not said), a host with at least as many ranks as it has cores; else why nothing would."""
    from fsdpviz.structure.profiler_cost import NO_CLOSER_BASE, NO_CLOSER_BASE_CORES_UNKNOWN, closer_base

    def base(options: dict[str, Any], ranks: list[RankInfo], **run: Any) -> str:
        return closer_base(RunInfo(options=options, ranks=ranks, **run))

    two_on_two = _ranks([("vm", 2), ("vm", 2)])
    assert base({"memory": True}, two_on_two) == \
        "record with --no-memory or with fewer ranks per core, for a base closer to the run"
    assert base({"memory": True, "stack": True}, _ranks([("a", 16)])) == \
        "record with --no-stack or with --no-memory, for a base closer to the run"
    assert base({}, _ranks([("a", 16)])) == "record with --no-memory, for a base closer to the run"  # not said: on
    assert base({"memory": False}, two_on_two) == "record with fewer ranks per core, for a base closer to the run"
    # one process on 16 cores, memory and stacks off (the shared H200 Bl recording: a fake group of 8)
    assert base({"memory": False}, _ranks([("vm", 16)], backend="fake"), world_size=8, hosts=["vm"]) == NO_CLOSER_BASE
    # one of four real ranks listed on a host of 2 cores: the world size spread over its one host says 4
    assert base({"memory": False}, _ranks([("a", 2)]), world_size=4, hosts=["a"]).endswith("fewer ranks per core, "
                                                                                          "for a base closer to the run")
    # ranks on two hosts of 2 cores, one each
    assert base({"memory": False}, _ranks([("a", 2), ("b", 2)]), world_size=2, hosts=["a", "b"]) == NO_CLOSER_BASE
    # a host whose cores, or ranks whose host, run.json does not say: nothing claimed of them
    assert base({"memory": False}, _ranks([("a", None), ("a", None)])) == NO_CLOSER_BASE_CORES_UNKNOWN
    assert base({"memory": False}, _ranks([(None, 2), (None, 2)])) == NO_CLOSER_BASE_CORES_UNKNOWN


def test_summary_json_says_the_closer_base(sample_run: Callable[[str], Any]) -> None:
    profiler = sample_run("fsdp1-cpu-2rank").summary.to_json()["profiler"]
    assert profiler["closer_base"] == "record with --no-memory or with fewer ranks per core, for a base closer to the run"


def test_the_profilers_finding_and_whatif_advise_what_the_recording_can_change(
        sample_run: Callable[[str], Any]) -> None:
    """The ZeRO-3 sample (slowed 1.71x, memory profiled, 2 ranks on 2 cores) is told both ways, by the
    profiler's finding and by every whatif prediction's warning."""
    from fsdpviz.whatif.predict import weaknesses

    both = "record with --no-memory or with fewer ranks per core, for a base closer to the run"
    result = sample_run("zero3-cpu-2rank")
    assert result.profiler is not None and result.profiler.slowdown > 1.5
    (profiler,) = [f for f in result.summary.findings if f.kind == "profiler"]
    assert profiler.message.endswith(both)
    assert weaknesses(0.0, result.profiler)[-1].endswith(both)


def test_a_recording_with_nothing_to_lower_is_told_so(gpu_h200_dir: Path, gpu_h200_run: Callable[[str], Any]) -> None:
    """The shared H200 Bl recording (slowed more than 1.5x with the memory profiler off, one rank on 16
    cores) is not told to record with --no-memory or fewer ranks per core, and is told why not."""
    from fsdpviz.structure.profiler_cost import NO_CLOSER_BASE
    from fsdpviz.whatif.predict import weaknesses

    run_json = json.loads((gpu_h200_dir / "Bl" / "run.json").read_text())
    assert run_json["options"]["memory"] is False and [r["cpu_count"] for r in run_json["ranks"]] == [16]
    result = gpu_h200_run("Bl")  # the profiler's cost and finding are the analysis', whatever its bound
    assert result.profiler is not None and result.profiler.slowdown > 1.5
    (profiler,) = [f for f in result.summary.findings if f.kind == "profiler"]
    assert profiler.message.endswith(NO_CLOSER_BASE) and "--no-memory" not in profiler.message
    assert weaknesses(0.0, result.profiler)[-1].endswith(NO_CLOSER_BASE)


@pytest.mark.parametrize("sample", ["fsdp2-cpu-2rank", "fsdp1-cpu-2rank"])
def test_a_units_timed_pass_holds_its_traced_compute(sample: str, sample_run: Callable[[str], Any]) -> None:
    """The timers open a unit before FSDP's own pre-forward hook and close it after its post-forward one
    (record/instrument.py), so a unit's timed pass holds its compute and FSDP's work for it: on the
    run's clock, the trace's compute of that pass (FSDP's work left out) is the smaller, as the
    report's column definitions say (report/units/table.py, TIMED_WORK)."""
    units = sample_run(sample).summary.units
    timed = [(u.name, phase, traced, timer) for u in units
             for phase, traced, timer in (("forward", u.forward_ms, u.forward_timer_ms),
                                          ("backward", u.backward_ms, u.backward_timer_ms))
             if traced is not None and timer is not None]
    assert len(timed) == 2 * len(units)
    assert all(timer > traced for _, _, traced, timer in timed), timed
