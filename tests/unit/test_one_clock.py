"""One clock per run, one figure per quantity: every view shows one step time, one traced step, one
profiler share, one exposed communication and one compute, and whatif's baseline is the summary's
(docs/concepts.md, "One clock").

Checked on every bundled sample, every shared H100 recording and the H200 recordings of model B: the
summary every view shows (``completed_summary``: ``summary``, ``record``'s closing lines, ``compare
--json``, the notebook), the bound's split of its step, whatif's baseline, and the summary's advice.
The figures are held against the run folder's own files, read here without fsdpviz: the trace's
ProfilerStep spans (the traced step) and the timers' clean steps (each rank's step on the headline's
clock). The clock says which basis that is, and a replay that misses the timers by more than 10 % is
never called replayed.
"""

from __future__ import annotations

import json
import re
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from helpers.cli import json_here
from helpers.rawfiles import own_gpu_ms, raw_trace, timer_step_ms

from fsdpviz.analysis.bound import BASIS_UNPROFILED, BY_REPLAY, BY_RULE, summarize_bound
from fsdpviz.api import Run
from fsdpviz.replay.clock import BASIS_REPLAYED, BASIS_TRACED, PHASE_LIMIT_PCT, RELIABLE_REPLAY_PCT
from fsdpviz.replay.model import recorded_settings
from fsdpviz.runfolder import clean_steps
from fsdpviz.whatif.explore import explore, predicted_bound
from fsdpviz.whatif.gains import action_setting, completed_summary, summary_model
from fsdpviz.whatif.predict import predict

SAMPLES_DIR = Path(__file__).parents[2] / "sample_traces"
SAMPLES = ["fsdp2-cpu-2rank", "fsdp1-cpu-2rank", "zero3-cpu-2rank"]
SHARED = ["h100-fsdp2-fake8-block", "h100-fsdp2-fake8-block-modelB", "h100-fsdp2-fake8-reshard-false",
          "h100-fsdp1-fake8-block", "h100-fsdp2-ws1-block", "h100-fsdp1-ws1-block", "h100-fsdp2-gloo2-block",
          "h100-hf-trainer-ws1"]
H200 = ["B", "Bl", "Broot"]


def _raw_figures(folder: Path, steps: list[int]) -> tuple[float, dict[int, float]]:
    """From the run folder's own files: the traced step (each rank's mean ProfilerStep span over
    ``steps``, median over ranks) and each rank's clean step (the median of its timers' clean steps,
    run.json's kinds of step)."""
    traces = folder / "traces" if (folder / "traces").is_dir() else folder  # loose traces: no run folder
    traced = []
    for path in sorted(traces.glob("rank*.trace.json*")):
        raw = raw_trace(path)
        traced.append(statistics.fmean(raw.step_ms(s) for s in steps))
    clean: dict[int, float] = {}
    if not (folder / "run.json").exists():
        return statistics.median(traced), clean
    run = json.loads((folder / "run.json").read_text())
    for rank_info in run["ranks"]:
        rank = rank_info["rank"]
        timers = folder / "timers" / f"rank{rank}.jsonl"
        if not timers.exists():
            continue
        wall = timer_step_ms(timers)
        kept = clean_steps(wall, profiled=rank_info.get("profiled_steps") or run["profile"]["steps"],
                           unit_timed=rank_info.get("unit_timed_steps", run["profile"].get("unit_timed_steps")),
                           partial=rank_info.get("partial_step"))
        if kept:
            clean[rank] = statistics.median(wall[s] for s in kept)
    return statistics.median(traced), clean


def _one_figure(result: Any, folder: Path) -> None:
    """One figure per quantity (docs/concepts.md, "One figure per quantity")."""
    summary = completed_summary(result)
    clock, bound, cost = summary.clock, summary.bound, summary.profiler
    assert clock is not None and bound is not None and summary.traced_step_time_ms is not None
    traced, clean = _raw_figures(folder, summary.steps)
    # the ranks the one model read are named wherever they are not the whole world: here the folder
    # traced fewer ranks than run.json's world size (H200 B: rank 0 of 8), or every rank (all <= 8)
    files = sorted((folder / "traces" if (folder / "traces").is_dir() else folder).glob("rank*.trace.json*"))
    world = json.loads((folder / "run.json").read_text())["world_size"] if (folder / "run.json").exists() else None
    if world is not None and len(files) < world:
        assert clock.ranks is not None and len(clock.ranks) == len(files), clock.ranks
    elif len(files) <= 8:
        assert clock.ranks is None
    # the traced step: one figure, the trace's own spans
    assert summary.traced_step_time_ms == pytest.approx(traced, abs=2e-3)
    assert bound.traced_step_ms == summary.traced_step_time_ms
    if cost is not None:
        assert cost.profiled_step_ms == summary.traced_step_time_ms
    # the profiler's share: one figure, the traced step less the headline's
    if bound.basis == BASIS_UNPROFILED:
        assert cost is not None
        if cost.pace_note is not None:  # the profiled window ran faster: the share is not known
            assert clock.profiler_share_ms is None and bound.profiler_share_ms is None
        else:
            share = max(summary.traced_step_time_ms - summary.step_time_ms, 0.0)
            assert clock.profiler_share_ms == bound.profiler_share_ms == pytest.approx(share, abs=2e-3)
        # each rank's split is of its own clean step, on the headline's clock
        for rank, split in bound.per_rank.items():
            assert split.step_ms == pytest.approx(clean[int(rank)], abs=2e-3), rank
            parts = (split.compute_ms + split.fsdp_overhead_ms + split.exposed_comm_ms + (split.host_wait_ms or 0.0)
                     + split.other_idle_ms)
            assert parts == pytest.approx(split.step_ms, abs=0.01), rank
        assert summary.step_time_ms == pytest.approx(statistics.median(clean[int(r)] for r in bound.per_rank), abs=2e-3)
    elif not clean:  # no timers: the profiler's share is not known, in either view (unknown is not zero)
        assert cost is None and clock.profiler_share_ms is None and bound.profiler_share_ms is None
    else:  # timers that do not lead: the measured excess, one figure, kept in the traced split (null
        # where the profiled steps ran faster: the clean ones measured noise)
        unprofiled = statistics.median(clean.values())
        if traced < unprofiled:
            assert clock.profiler_share_ms is None and bound.profiler_share_ms is None
        else:
            assert clock.profiler_share_ms == bound.profiler_share_ms == pytest.approx(traced - unprofiled, abs=2e-3)
    # the overlap table shows the bound's parts, per rank and for the run
    ov = summary.overlap
    assert (ov.compute_ms, ov.exposed_comm_ms, ov.fsdp_overhead_ms) == (
        bound.compute_ms, bound.exposed_comm_ms, bound.fsdp_overhead_ms)
    assert ov.idle_ms == pytest.approx((bound.host_wait_ms or 0.0) + bound.other_idle_ms, abs=1e-3)
    for rank, row in ov.per_rank.items():
        split = bound.per_rank[rank]
        assert (row.compute_ms, row.exposed_comm_ms) == (split.compute_ms, split.exposed_comm_ms)
        assert row.idle_ms == pytest.approx((split.host_wait_ms or 0.0) + split.other_idle_ms, abs=1e-3)
    # no purpose's communication is more than the run's (medians over ranks, both: a mean had put an
    # all-gather's exposed time above the whole's)
    for purpose, part in (ov.by_purpose or {}).items():
        if part.comm_ms is not None and ov.comm_ms is not None:
            assert part.comm_ms <= ov.comm_ms + 1e-3, purpose
        if part.exposed_ms is not None and ov.exposed_comm_ms is not None:
            assert part.exposed_ms <= ov.exposed_comm_ms + 1e-3, purpose
    # the share hidden is of the communication and exposed communication shown beside it, run and ranks
    for row in (ov, *ov.per_rank.values()):
        if row.comm_ms:
            assert row.overlap_pct == pytest.approx(100 * (1 - row.exposed_comm_ms / row.comm_ms), abs=0.01)
    _units_and_findings_on_the_clock(result, summary, traced)
    # whatif's baseline compute is the bound's (the model's compute, on the same clock)
    model, _ = summary_model(result)
    assert model is not None
    baseline = predict(model, recorded_settings()).baseline
    assert (baseline.compute_ms, baseline.exposed_comm_ms) == (bound.compute_ms, bound.exposed_comm_ms)
    # advice: each setting once, and none that whatif calls unmeasurable or unreliable
    quoted = [a.predicted_gain.rsplit("(fsdpviz whatif: ", 1)[-1] for a in summary.actions if a.predicted_gain]
    assert len(quoted) == len(set(quoted)), quoted
    for action in summary.actions:
        settings = action_setting(action, model) if action.knob else None
        if settings is None:
            continue
        p = predict(model, settings)
        assert p.reliable and p.measurable is not False, (action.message, p.spread_ms, p.predicted.step_time_ms)
        if action.kind == "bound" and (action.cause == "host" or bound.device == "cpu"):
            # the wrap advised is the one --explore ranks first of the wraps it tries (on a CPU rank
            # also for exposed communication, which the thread waits out: prefetch cannot hide it)
            wraps = [c.settings for c in explore(model).ranked if c.settings.sources.get("wrap") == "given"]
            assert wraps and settings.describe() == wraps[0].describe()
        # a setting is advised only where whatif calls its change measurable: not where the spread is unknown
        assert p.measurable is True, (action.message, p.spread_ms)
    _advice_names_what_whatif_stands_behind(summary, model)


def _named_settings(knob: str) -> list[Any]:
    """Every setting an advised knob names as whatif's options (``(fsdpviz whatif --wrap merge:2, or
    root)`` names two), parsed as the whatif command parses them."""
    from fsdpviz.replay.settings import Settings, parse_bool, parse_prefetch, parse_wrap

    out = []
    for group in re.findall(r"\(fsdpviz whatif (--[^)]*)\)", knob):
        first, *others = group.split(", or ")
        words = first.split()
        pairs = dict(zip(words[::2], words[1::2]))
        options = [pairs] + [{next(iter(pairs)): other.split()[0]} for other in others]
        for opts in options:
            changes: dict[str, Any] = {}
            for option, value in opts.items():
                if option == "--wrap":
                    changes["wrap"] = parse_wrap(value)
                elif option == "--prefetch":
                    changes["prefetch"] = parse_prefetch(value)
                elif option == "--reshard-after-forward":
                    changes["reshard_after_forward"] = parse_bool(value, option)
                elif option == "--world-size":
                    changes["world_size"] = int(value)
            out.append(Settings().with_(**changes))
    return out


def _advice_names_what_whatif_stands_behind(summary: Any, model: Any) -> None:
    """An advised action's words name only settings whatif predicts reliably and beyond the spread: not
    ``--wrap merge:2, or root`` where merge:2 is within it (the words are what a person runs)."""
    for action in summary.actions:
        if not action.knob:
            continue
        for settings in _named_settings(action.knob):
            p = predict(model, settings)
            assert p.reliable and p.measurable is not False, (action.knob, settings.describe(), p.spread_ms,
                                                              p.predicted.step_time_ms - p.baseline.step_time_ms)


# units[] fields against the per-unit analysis' traced medians (UNIT_STATS columns)
_UNIT_FIELDS = {"all_gather_ms": "all_gather_ns", "forward_ms": "forward_ns", "backward_ms": "backward_ns",
                "reduce_scatter_ms": "reduce_scatter_ns", "exposed_comm_ms": "exposed_comm_ns",
                "forward_exposed_all_gather_ms": "forward_ag_exposed_ns",
                "backward_exposed_all_gather_ms": "backward_ag_exposed_ns", "exposed_reduce_scatter_ms": "rs_exposed_ns"}


def _units_and_findings_on_the_clock(result: Any, summary: Any, traced: float) -> None:
    """Each unit's times are the per-unit analysis' traced medians moved to the run's clock: on a CPU
    rank by the clean step over the traced one (read off the run folder's files), on a GPU unmoved
    (the profiler slows the host, not the kernels) unless the de-profiler had to shrink the device's
    parts, but for a GPU pass's gaps (tests/unit/test_unit_passes_clock.py holds their move to the
    timers'); and a finding states its unit's own figure."""
    bound = summary.bound
    k = bound.device_scale
    if bound.basis != BASIS_UNPROFILED:
        assert k == 1.0
    elif summary.device == "cpu":
        assert k == pytest.approx(summary.step_time_ms / traced, rel=0.02)
        assert k < 0.98  # the profiler slowed every bundled CPU sample: the check can tell the clocks apart
    elif bound.note is None or "shrunk" not in bound.note:
        assert k == 1.0
    # the communication moves as the headline's exposed communication did from the traced steps (the
    # median over ranks of each one's mean): on a GPU by the replay's drop of it, else as the device
    rows_ = result.overlap[result.overlap["bound_window_ns"] > 0]
    traced_exposed = float((rows_["bound_exposed_comm_ns"] / rows_["n_steps"].clip(lower=1)).median()) / 1e6
    kc = bound.exposed_comm_ms / traced_exposed if traced_exposed > 0 else k
    # it moves apart from the device only where the collectives ran on a host backend (gloo's on CUDA):
    # NCCL's are kernels, and a CPU rank moves by one factor
    model, _ = summary_model(result)
    if model is None or not model.recording.serial_collectives:
        assert kc == pytest.approx(k, rel=1e-3)
    else:
        assert kc < 0.99
    stats = result.analysis.unit_stats.set_index("unit")
    us = result.analysis.unit_steps
    units = {u.name: u for u in summary.units}
    moved_ms = host_gaps_ms = 0.0
    for name, unit in units.items():
        for field, column in _UNIT_FIELDS.items():
            value, raw = getattr(unit, field), float(stats.loc[name, column])
            if value is None:
                continue
            if field in ("forward_ms", "backward_ms") and summary.device != "cpu":
                # a GPU pass holds the idle between its kernels, which moves as the step's idle parts do:
                # never above the traced pass, never below it less every gap (the gaps inside it, and no
                # more than it); summed over the units, below them where the de-profiler took host wait out
                rows = us[(us["unit"] == name).to_numpy() & (us["phase"] == column.removesuffix("_ns")).to_numpy()]
                gaps = rows["host_gap_ns"].clip(lower=0) + rows["idle_gap_ns"].clip(lower=0)
                assert (gaps <= rows["compute_ns"]).all(), (name, field)
                floor = float((rows["compute_ns"] - gaps).median()) if len(rows) else 0.0
                assert floor / 1e6 * k - 1.5e-3 <= value <= raw / 1e6 * k + 1.5e-3, (name, field)
                moved_ms += raw / 1e6 * k - value
                host_gaps_ms += float(rows["host_gap_ns"].clip(lower=0).sum()) / 1e6 / max(len(rows), 1)
                continue
            assert value == pytest.approx(raw / 1e6 * kc, abs=1.5e-3), (name, field)
    if summary.device != "cpu" and bound.basis == BASIS_UNPROFILED and bound.host_scale < 0.9 and host_gaps_ms > 0.5:
        assert moved_ms > 0.1, "no GPU pass moved off the profiler"
    for f in summary.findings:  # a finding's own compute is its unit's pass, as the table has it
        own = re.search(r"own compute ([\d.,]+) ms", f.evidence or "")
        if own and f.unit in units and f.phase in ("forward", "backward"):
            assert float(own.group(1).replace(",", "")) == pytest.approx(getattr(units[f.unit], f"{f.phase}_ms"),
                                                                         abs=0.006), f.evidence
    for f in summary.findings:
        if f.kind == "exposed_all_gather":
            assert f.lost_ms_per_step == pytest.approx(getattr(units[f.unit], f"{f.phase}_exposed_all_gather_ms"),
                                                       abs=1.5e-3), f.message
        elif f.kind == "exposed_reduce_scatter":
            assert f.lost_ms_per_step == pytest.approx(units[f.unit].exposed_reduce_scatter_ms, abs=1.5e-3), f.message


def _one_clock(result: Any) -> None:
    summary = completed_summary(result)
    clock, bound = summary.clock, summary.bound
    assert clock is not None and clock.basis in (BASIS_REPLAYED, BASIS_TRACED) and clock.note
    # the bound splits the headline's step, whichever clock that is
    assert bound is not None and bound.step_ms == summary.step_time_ms
    assert (bound.basis == BASIS_UNPROFILED) == (summary.step_time_source == "timers")
    parts = bound.compute_ms + (bound.fsdp_overhead_ms or 0.0) + bound.exposed_comm_ms + (bound.host_wait_ms or 0.0)
    assert parts + bound.other_idle_ms == pytest.approx(bound.step_ms, abs=0.01)
    # replayed only where the replay without the profiler reproduces the timers, and where the phases
    # are timed, takes the profiler's share out of them within the limit
    phases_hold = clock.phase_error_pct is None or clock.phase_error_pct <= PHASE_LIMIT_PCT
    if clock.basis == BASIS_REPLAYED:
        assert summary.step_time_source == "timers"
        assert clock.replay_error_pct is not None and clock.replay_error_pct <= RELIABLE_REPLAY_PCT
        assert clock.clean_steps is not None and clock.clean_steps >= 2 and phases_hold
    elif clock.replay_error_pct is not None:
        # or a CPU replay, scaled onto the clean steps, that nothing it was not scaled to checks
        unchecked = clock.phase_error_pct is None and "nothing it was not scaled to checks it" in clock.note
        assert clock.replay_error_pct > RELIABLE_REPLAY_PCT or not phases_hold or unchecked
    # whatif's baseline: the same step and exposed communication (its prediction of the recorded
    # setting equals them by construction, so it is not checked here: _one_figure holds the figures
    # against the run folder's own files). The model is the run's one model, the one ``fsdpviz whatif``
    # predicts on (commands/whatif.py: summary_model), read once per result, not read again here; with one
    # model the prediction's basis is the clock's by construction (both read its memoised replay), kept as a
    # guard of that one-model path, not as evidence
    model, why_not = summary_model(result)
    assert model is not None, why_not
    prediction = predict(model, recorded_settings())
    assert prediction.basis == clock.basis
    assert prediction.baseline.step_time_ms == summary.step_time_ms
    exposed = summary.exposed_comm_ms  # what summary, the report and record's closing lines show
    assert exposed == bound.exposed_comm_ms
    assert prediction.baseline.exposed_comm_ms == exposed
    # --explore's "as recorded" row is the bound, part for part to the µs as both print them (its parts are
    # each rounded, and the row once took their rounding into its host side: 1.923 ms of FSDP's work
    # against the bound's 1.922 on the ZeRO-3 sample)
    row = predicted_bound(bound, prediction, None)
    assert row is not None
    shown = row.to_json()
    for key in ("step_ms", "compute_ms", "exposed_comm_ms", "host_wait_ms", "other_idle_ms", "fsdp_overhead_ms",
                "fsdp_kernels_ms"):
        assert shown[key] == getattr(bound, key), key
    assert row.time_kind == bound.time_kind
    if clock.replay_error_pct is not None:  # a prediction is reliable only on a replay that reproduces the run
        assert prediction.reliable == (clock.replay_error_pct <= RELIABLE_REPLAY_PCT and phases_hold
                                       and prediction.traced_replay_error_pct <= RELIABLE_REPLAY_PCT
                                       and prediction.parts_over_pct is None)


@pytest.mark.parametrize("name", SAMPLES)
def test_samples_have_one_clock(name: str, sample_run: Callable[[str], Any]) -> None:
    _one_clock(sample_run(name))


@pytest.mark.parametrize("name", SHARED)
def test_shared_h100_recordings_have_one_clock(name: str, gpu_fsdp_run: Callable[[str], Any]) -> None:
    _one_clock(gpu_fsdp_run(name))


@pytest.mark.parametrize("name", [*SAMPLES, "fsdp2-cpu-2rank-plain"])
def test_samples_show_one_figure_per_quantity(name: str, sample_run: Callable[[str], Any]) -> None:
    _one_figure(sample_run(name), SAMPLES_DIR / name)


def _own_work(result: Any, folder: Path) -> None:
    """The traced split's compute and FSDP's copy kernels are the analysed steps' own GPU work: the time
    the GPU ran what each step launched, read from the trace file without fsdpviz. Work queued before
    the first analysed step that still runs in it is not theirs (on Broot 9.4 ms of it ran in step 2's
    span, which put the bound's compute 3.1 ms a step above what the steps launched). On the run's clock
    the replay's split keeps them (the profiler slows the host, not the kernels)."""
    summary = completed_summary(result)
    bound = summary.bound
    traced = summarize_bound(result.overlap, None)
    assert bound is not None and bound.fsdp_kernels_ms is not None
    assert traced is not None and traced.fsdp_kernels_ms is not None
    # the replay's split where the clock is the replay's, named the rule's where the rule's remainder is the
    # larger part (FSDP1 on one rank: 2.2 of 3.0, its replay of the traced steps 2.8 ms short of them; gloo2
    # was, 32 of its 57 ms, while the exposed communication kept the trace's figure); the rule's, and why,
    # where the replay misses the clean step (HF Trainer: 23 %)
    replayed = summary.clock.basis == "replayed"
    mostly_rule = "deprofiled_by is rule: the rule's remainder" in (bound.note or "")
    assert bound.deprofiled_by == (BY_REPLAY if replayed and not mostly_rule else BY_RULE), bound.note
    assert replayed or "not by the replay: the replay without the profiler misses" in (bound.note or "")
    assert mostly_rule == (folder.name == "h100-fsdp1-ws1-block")
    if bound.comm_ms:  # gloo's collectives on CUDA: its copies are communication (test_gpu_fsdp_comm.py)
        return
    traces = sorted((folder / "traces").glob("rank0.trace.json*"))
    assert len(traces) == 1 and len(summary.ranks) == 1, "one rank traced: its own work is the bound's median"
    own = own_gpu_ms(traces[0], summary.steps)
    assert traced.compute_ms + traced.fsdp_kernels_ms == pytest.approx(own, abs=0.1)
    assert bound.compute_ms + bound.fsdp_kernels_ms == pytest.approx(own, abs=0.1)


@pytest.mark.parametrize("name", SHARED)
def test_shared_h100_recordings_show_one_figure_per_quantity(name: str, gpu_fsdp_dir: Path,
                                                             gpu_fsdp_run: Callable[[str], Any]) -> None:
    _one_figure(gpu_fsdp_run(name), gpu_fsdp_dir / name)
    _own_work(gpu_fsdp_run(name), gpu_fsdp_dir / name)


@pytest.mark.parametrize("name", H200)
def test_h200_recordings_show_one_figure_per_quantity(name: str, gpu_h200_dir: Path,
                                                      gpu_h200_run: Callable[[str], Any]) -> None:
    result = gpu_h200_run(name)
    _one_figure(result, gpu_h200_dir / name)
    _own_work(result, gpu_h200_dir / name)


def test_a_cpu_recording_bound_by_exposed_communication_is_advised_fewer_units(
        session_memo: Callable[..., Any]) -> None:
    """The committed per-block recording of the dim-256 example (FSDP2, 2 CPU ranks): exposed
    communication is its largest loss, all of the communication (its trace's training thread computes
    beside none of it), and the summary advises the wrap --explore ranks first, not prefetch."""
    from fsdpviz.analysis.pipeline import analyse

    folder = Path(__file__).parents[1] / "recorded" / "fsdp2-d256-block" / "run"
    result = session_memo(("recorded", folder), lambda: analyse([folder], cache=False))
    _one_figure(result, folder)
    summary = completed_summary(result)
    bound = summary.bound
    assert bound is not None and bound.loss is not None and bound.loss.kind == "communication"
    assert bound.exposed_comm_ms == bound.comm_ms
    first = summary.actions[0]
    assert first.kind == "bound" and "(fsdpviz whatif: wrap " in (first.predicted_gain or ""), first
    assert "prefetch" not in (first.predicted_gain or "")


def test_advice_names_only_the_setting_whatif_stands_behind(session_memo: Callable[..., Any]) -> None:
    """A committed FSDP2 recording of two micro-batches a step (2 CPU ranks, Adam, memory_train.py): the
    analysis' words name root and merge:2; whatif's predictions decide what the summary advises. Root is
    advised alone where whatif calls it measurable and faster than merge:2; where the recording's own
    spread swallows it, nothing is advised and the action says why. (Which holds hangs on the spread its
    steps were recorded with: recorded again, root's -56.46 ms fell within a 60.67 ms spread.)"""
    from fsdpviz.analysis.pipeline import analyse

    folder = Path(__file__).parents[1] / "recorded" / "memory-adam-amsgrad+model-zero-grad+2-micro" / "run"
    result = session_memo(("recorded", folder), lambda: analyse([folder], cache=False))
    summary = completed_summary(result)
    model, _ = summary_model(result)
    assert model is not None
    advised = [a for a in summary.actions if a.knob and a.kind == "bound"]
    unpriced = next(a for a in result.summary.actions if a.kind == "bound")  # the analysis' words, before whatif
    assert sorted(s.describe() for s in _named_settings(unpriced.knob)) == ["wrap merge:2", "wrap root"]
    pairs = predict(model, _named_settings("(fsdpviz whatif --wrap merge:2)")[0])
    root = predict(model, _named_settings("(fsdpviz whatif --wrap root)")[0])
    best = min((p for p in (pairs, root) if p.measurable is not False),
               key=lambda p: p.predicted.step_time_ms, default=None)
    if best is not None and best.predicted.step_time_ms < best.baseline.step_time_ms:
        assert advised and [s.describe() for s in _named_settings(advised[0].knob)] == [best.settings.describe()]
    else:
        bound = next(a for a in summary.actions if a.kind == "bound")
        assert not advised and bound.why_not.endswith("step-to-step spread: not measurable in this recording"), bound
    _advice_names_what_whatif_stands_behind(summary, model)


COMMAND_SAMPLES = ["fsdp2-cpu-2rank", "zero3-cpu-2rank"]


@pytest.fixture(scope="module")
def samples_compared() -> dict[str, Any]:
    """``compare --json`` of the samples of ``COMMAND_SAMPLES``, one against the other (each labelled with
    its name): run once, by the first test that reads it, and read by each as the compare of its sample,
    the run labelled with its name."""
    return {}


@pytest.mark.parametrize("name", COMMAND_SAMPLES)
def test_commands_and_the_notebook_agree(name: str, sample_run: Callable[[str], Any],
                                        samples_compared: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> None:
    """summary --json, whatif --json, compare --json (the samples compared with each other: the sample's
    run there) and the notebook: one step, one exposed communication, one clock (record's closing lines
    print the same ``completed_summary``, commands/record.py)."""
    folder = str(SAMPLES_DIR / name)
    summary = json_here(capsys, "summary", folder, "--json", "-q", "--no-cache")
    whatif = json_here(capsys, "whatif", folder, "--json", "-q", "--no-cache")
    if not samples_compared:
        samples_compared.update(json_here(capsys, "compare", *(str(SAMPLES_DIR / n) for n in COMMAND_SAMPLES),
                                          *(o for n in COMMAND_SAMPLES for o in ("--label", n)), "--json", "-q",
                                          "--no-cache"))
    [compared] = [r for r in samples_compared["runs"] if r["label"] == name]
    run = Run(sample_run(name), label=name, source=folder)
    notebook = run.summary.to_json()
    # the notebook's bound table: every row on the clock the summary's bound says, with its figures
    frame = run.bound.set_index("rank")
    assert frame.loc["all", "basis"] == summary["bound"]["basis"]
    for rank, split in summary["bound"]["per_rank"].items():
        assert frame.loc[rank, "step_ms"] == split["step_ms"] and frame.loc[rank, "compute_ms"] == split["compute_ms"]
        assert frame.loc[rank, "basis"] == split["basis"] == summary["bound"]["basis"]  # every rank timed clean steps
    for other in (notebook, compared):
        assert other["step_time_ms"] == summary["step_time_ms"] and other["clock"] == summary["clock"]
    assert whatif["baseline"]["step_time_ms"] == summary["step_time_ms"]
    assert whatif["baseline"]["exposed_comm_ms"] == summary["bound"]["exposed_comm_ms"]
    assert whatif["clock"] == summary["clock"] and whatif["basis"] == summary["clock"]["basis"]


@pytest.mark.parametrize("where", ["sample", "shared"])
def test_every_view_of_a_result_reads_its_model_once(where: str, monkeypatch: pytest.MonkeyPatch,
                                                       request: pytest.FixtureRequest) -> None:
    """The summary, the report's data and the notebook's summary of one pipeline result read its
    recording for the model once between them (on GPU twice: with and without the profiler's cost),
    and show the one summary it gives."""
    from fsdpviz.analysis.pipeline import analyse
    from fsdpviz.replay import model as model_module
    from fsdpviz.report.data import prepare_report

    folder = (SAMPLES_DIR / "fsdp2-cpu-2rank" if where == "sample"
              else request.getfixturevalue("gpu_fsdp_dir") / "h100-fsdp2-fake8-block-modelB")
    reads: list[int] = []
    real = model_module.read_recording

    def counted(*args: Any, **kwargs: Any) -> Any:
        reads.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(model_module, "read_recording", counted)
    result = analyse([folder], cache=False)
    summary = completed_summary(result)
    once = len(reads)
    assert once == (1 if where == "sample" else 2)
    prepare_report(result)
    notebook = Run(result, label="a", source=str(folder)).summary
    assert completed_summary(result) is summary is notebook and len(reads) == once


def test_compare_says_where_the_step_difference_went_on_the_runs_clock(
        sample_run: Callable[[str], Any]) -> None:
    """compare's "where the X ms went": the step's parts of two runs, each moved to its run's clock as
    its step is, add up to the difference of the two steps the comparison leads with (on the traced
    clock they would add up to the traced difference: 15.24 ms for fsdp2 against fsdp1, not 11.62)."""
    import re

    from fsdpviz.analysis.compare.findings import MIN_TIME_MS, step_parts
    from fsdpviz.analysis.pipeline import LabelledRun

    runs = [LabelledRun(label=n, source=n, result=sample_run(n)) for n in SAMPLES]
    for a in runs:
        for b in runs:
            if a is b:
                continue
            text = step_parts(a, b).split(" (exposed")[0]
            parts = [float(v) for v in re.findall(r"([+-][0-9.]+) ms", text)]
            step = a.summary.step_time_ms - b.summary.step_time_ms
            # parts under MIN_TIME_MS are not named: at most four of them left out
            assert sum(parts) == pytest.approx(step, abs=4 * MIN_TIME_MS + 0.02), (a.label, b.label, text)
            traced = a.summary.traced_step_time_ms - b.summary.traced_step_time_ms
            if abs(traced - step) > 1.0:
                assert abs(sum(parts) - traced) > 0.5, (a.label, b.label)


def _clean_steps_timed(folder: Path, factor: float) -> list[float]:
    """A copy of the FSDP2 sample in ``folder`` whose timers say its clean steps ran ``factor`` times as
    long as they did; each rank's median clean step, as the timer files now say it."""
    import shutil

    shutil.copytree(SAMPLES_DIR / "fsdp2-cpu-2rank", folder, ignore=shutil.ignore_patterns(".fsdpviz-cache"))
    run = json.loads((folder / "run.json").read_text())
    slowed: list[float] = []
    for rank_info in run["ranks"]:
        path = folder / "timers" / f"rank{rank_info['rank']}.jsonl"
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        kept = clean_steps({r["step"] for r in rows}, profiled=rank_info["profiled_steps"], unit_timed=None,
                           partial=rank_info.get("partial_step"))
        for r in rows:
            if r["step"] in kept and r["unit"] == "" and r["kind"] == "total":
                r["ms"] *= factor
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        slowed.append(statistics.median(r["ms"] for r in rows
                                        if r["step"] in kept and r["unit"] == "" and r["phase"] == "step"
                                        and r["kind"] == "total"))
    return slowed


def test_a_share_the_clean_steps_cannot_tell_is_null(tmp_path: Path) -> None:
    """Clean steps timed 1.5x longer than the profiled ones (a machine busy while they ran): a profiler
    cannot make a step faster, so the two windows ran at different paces. The clean steps still lead
    (most of the run, the pace the script's own timer saw), the profiler's share is not known -- null in
    the clock and the bound alike, not 0 -- and a note says so."""
    from fsdpviz.analysis.pipeline import analyse

    folder = tmp_path / "slow-clean"
    slowed = _clean_steps_timed(folder, 1.5)
    summary = completed_summary(analyse([folder], cache=False, progress=False))
    assert summary.step_time_source == "timers" and summary.profiler is not None
    assert summary.step_time_ms == pytest.approx(statistics.median(slowed), abs=2e-3)
    assert summary.profiler.profiled_step_ms < summary.profiler.unprofiled_step_ms
    assert summary.clock is not None and summary.bound is not None
    assert summary.clock.profiler_share_ms is None and summary.bound.profiler_share_ms is None
    assert len([n for n in summary.notes if "pace changed" in n]) == 1
    # the replay scaled the traced steps up onto the clean ones: its phase check speaks of the time it
    # added, not of a profiler's share taken out
    assert summary.clock.phase_miss_pct is not None
    assert "share it took out" not in summary.clock.note and "so it added time" in summary.clock.note
    # ... and so does whatif, in its replay line and in the warning past the phase limit
    from fsdpviz.whatif.predict import weaknesses

    result = analyse([folder], cache=False, progress=False)
    model, why_not = summary_model(result)
    assert model is not None, why_not
    line = predict(model, recorded_settings()).replay_words()
    assert "the time it added per phase within" in line and "profiler's share" not in line
    warned = weaknesses(0.0, summary.profiler, 0.0, PHASE_LIMIT_PCT + 1.0)
    assert len(warned) == 1 and "the time the model's replay added to the step's phases" in warned[0]
    assert "profiler's share" not in warned[0]
    # the parts still add up to the step the run leads with
    b = summary.bound
    parts = b.compute_ms + b.fsdp_overhead_ms + b.exposed_comm_ms + (b.host_wait_ms or 0.0) + b.other_idle_ms
    assert b.basis == BASIS_UNPROFILED and parts == pytest.approx(summary.step_time_ms, abs=0.01)
    # compare says it of that run, in its summary's words, and of no other
    from fsdpviz.analysis.compare.runs import compare_runs
    from fsdpviz.report.compare.build import load_runs

    compared = compare_runs(load_runs([folder, SAMPLES_DIR / "fsdp2-cpu-2rank"], ["slow-clean", "sample"], cache=False))
    paced = [n for n in compared.notes if "pace changed" in n]
    assert paced == [f"slow-clean: {summary.profiler.pace_note}"]


def test_profiled_steps_a_little_faster_than_the_clean_ones_are_said_as_time_the_replay_added(tmp_path: Path) -> None:
    """Profiled steps 0.98x as long as the clean ones: within the noise that :data:`NOISE_SLOWDOWN` allows, so
    no pace note and the clean steps lead, but the replay still scales the traced steps up (its factor above
    1): its out-of-sample words speak of the time it added, in the clock, whatif's replay line and its
    warning, as they do past the noise."""
    from fsdpviz.analysis.pipeline import analyse
    from fsdpviz.whatif.predict import weaknesses

    before = completed_summary(analyse([SAMPLES_DIR / "fsdp2-cpu-2rank"], cache=False, progress=False)).profiler
    assert before is not None and before.slowdown > 1.0  # the sample as recorded: the profiler slowed it
    folder = tmp_path / "a-little-slow-clean"
    _clean_steps_timed(folder, before.slowdown / 0.98)
    summary = completed_summary(analyse([folder], cache=False, progress=False))
    assert summary.profiler is not None and summary.profiler.slowdown == pytest.approx(0.98, abs=0.006)
    assert summary.profiler.pace_note is None and summary.step_time_source == "timers"
    assert summary.clock is not None and summary.clock.phase_miss_pct is not None
    assert "scaled 1.02x" in summary.clock.note, summary.clock.note
    assert "share it took out" not in summary.clock.note and "so it added time" in summary.clock.note
    # the report's headline calls the traced timeline the faster window, not the slower run
    from fsdpviz.report.headline import _step_fact

    hint = _step_fact(summary).hint
    assert "ran 0.98x as long" in hint and hint.endswith("the timeline below is that faster window"), hint
    model, why_not = summary_model(analyse([folder], cache=False, progress=False))
    assert model is not None, why_not
    line = predict(model, recorded_settings()).replay_words()
    assert "the time it added per phase within" in line and "profiler's share" not in line
    warned = weaknesses(0.0, summary.profiler, 0.0, PHASE_LIMIT_PCT + 1.0)
    assert len(warned) == 1 and "the time the model's replay added to the step's phases" in warned[0]


def test_a_rank_that_timed_no_clean_step_keeps_its_traced_split_and_says_so(sample_run: Callable[[str], Any]) -> None:
    """The bound moves each rank to its own clean step; a rank whose timers hold none stays as traced, and
    its row (JSON and the notebook's) says ``traced`` while the run's others say ``unprofiled``."""
    from fsdpviz.analysis.bound import summarize_bound
    from fsdpviz.structure.profiler_cost import clean_step_ms

    result = sample_run("fsdp2-cpu-2rank")
    clean = clean_step_ms(result.traces.timers, result.traces.run)
    assert set(clean) == {0, 1}
    bound = summarize_bound(result.overlap, result.summary.profiler, {0: clean[0]})
    assert bound is not None and bound.basis == BASIS_UNPROFILED
    assert bound.per_rank["0"].basis == BASIS_UNPROFILED and bound.per_rank["0"].step_ms == round(clean[0][0], 3)
    one = bound.per_rank["1"]
    assert one.basis == "traced" and one.step_ms == one.traced_step_ms != round(clean[1][0], 3)
    full = result.summary.bound
    assert full is not None and {r.basis for r in full.per_rank.values()} == {BASIS_UNPROFILED}


def test_a_traced_run_of_four_ranks_says_its_shares_of_the_step(session_memo: Callable[..., Any]) -> None:
    """The committed HSDP recording (4 CPU ranks, no clean steps: the traced clock). Each rank's parts add
    up to its own traced step; the run's are each a median over ranks, which need not add up to the
    median step, and the bound's note gives their sum. The largest loss is one share of the step in every
    place it is said: the bound's headline and the first action (they had said 62 and 67 %)."""
    from fsdpviz.analysis.figures import bound_words
    from fsdpviz.analysis.pipeline import analyse

    folder = Path(__file__).parents[1] / "recorded" / "mesh-hsdp" / "run"
    result = session_memo(("recorded", folder), lambda: analyse([folder], cache=False))
    _one_figure(result, folder)
    summary = completed_summary(result)
    bound = summary.bound
    assert bound is not None and bound.basis == "traced" and len(bound.per_rank) == 4 and bound.loss is not None
    for rank in bound.per_rank.values():
        assert (rank.compute_ms + rank.exposed_comm_ms + rank.fsdp_overhead_ms + rank.other_idle_ms
                == pytest.approx(rank.step_ms, abs=0.005))
    total = bound.compute_ms + bound.exposed_comm_ms + bound.fsdp_overhead_ms + bound.other_idle_ms
    assert abs(total - bound.step_ms) > 1.0  # this recording's medians do not add up
    said = re.search(r"together they come to ([\d.]+) ms of the ([\d.]+) ms step", bound.note or "")
    assert said and float(said[1]) == pytest.approx(total, abs=0.005) and float(said[2]) == bound.step_ms
    pct = f"{100 * bound.loss.ms / bound.step_ms:.0f} %"
    assert f"({pct} of the step)" in bound_words(bound).verdict
    first = summary.actions[0]
    assert first.kind == "bound" and f"({pct})" in first.message, first.message
    # --explore's "as recorded" row is that split, part for part, not its difference moved into FSDP's
    # work (9.352 ms once read 7.508 there, unsaid); a setting's predicted split keeps the difference and says so
    model, why = summary_model(result)
    assert model is not None, why
    row = predicted_bound(bound, predict(model, recorded_settings()), None)
    assert row is not None
    shown = row.to_json()
    for key in ("step_ms", "compute_ms", "exposed_comm_ms", "host_wait_ms", "other_idle_ms", "fsdp_overhead_ms"):
        assert shown[key] == getattr(bound, key), key
    assert row.note is not None and f"own difference from its step ({total - bound.step_ms:+.3f} ms" in row.note
