"""Findings a person reads in ten seconds: alike findings as one line, the bound first, at most five
shown, and no knob advised that cannot help.

Built findings check the grouping arithmetic (ranges and totals known by construction); the H100
gloo recording is the wall of findings this exists for, and the bundled samples the runs a user
meets first.
"""

from __future__ import annotations

import gzip
import json
import re
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pytest
from helpers.rawfiles import raw_trace, timer_step_ms
from synth import Scenario, generate_run, make_root, make_units

from fsdpviz.analysis import findings as fnd
from fsdpviz.analysis.actions import (
    CPU_BLOCKS,
    HOST_BACKEND_BLOCKS,
    KIND_BOUND,
    KNOB_COMMUNICATION,
    KNOB_COMMUNICATION_CPU,
    KNOB_HOST,
    KNOB_HOST_CPU,
    MAX_SHOWN,
    Action,
    action_text,
    action_texts,
    bound_action,
    build_actions,
    group_findings,
    one_per_setting,
    waits_out_collectives,
    with_prediction,
)
from fsdpviz.analysis.bound import KIND_HOST
from fsdpviz.analysis.pipeline import analyse
from fsdpviz.replay.model import read_model, spread_share
from fsdpviz.structure.profiler_cost import NO_CLOSER_BASE
from fsdpviz.structure.records import Finding
from fsdpviz.whatif.gains import predict_actions, predicted_actions

SAMPLES = Path(__file__).parents[2] / "sample_traces"

# a GPU-shaped run of four blocks and a root (tests/synth): the wraps the bound's knob prices gather more
SCENARIO = Scenario(units=make_units(4, numel=8_000_000), root=make_root(), world_size=4, ring_comm=True,
                    steps=(3, 4), shared_timeline=True)

PREFETCH = "prefetch one more unit ahead (the pass computes longer than it gathers; costs memory)"


def _outlasting(unit: str, phase: str, lost: float) -> Finding:
    return Finding(kind="exposed_all_gather", cause=fnd.CAUSE_OUTLASTS_COMPUTE, unit=unit, phase=phase,
                   lost_ms_per_step=lost, message=f"{unit}: all-gather exposed {lost} ms/step in {phase}; prefetched, "
                   "but it outlasts the compute before it", knob=PREFETCH)


def test_alike_findings_are_one_line_with_range_and_total() -> None:
    alike = [_outlasting(f"blocks.{i}", phase, 54.0 + i) for i in range(8) for phase in ("forward", "backward")]
    other = Finding(kind="exposed_reduce_scatter", cause=fnd.CAUSE_NOTHING_LEFT, unit="(root)", phase="backward",
                    lost_ms_per_step=3.0, message="reduce-scatter of (root) exposed 3.00 ms/step in backward")
    actions = group_findings([*alike, other])
    assert len(actions) == 2
    gathers = actions[0]
    assert gathers.count == 16 and gathers.units[:2] == ["blocks.0 forward", "blocks.0 backward"]
    # 2 x (54 + 55 + ... + 61) = 920 ms; each 54-61 ms
    assert gathers.lost_ms_per_step == 920.0 and (gathers.lost_ms_min, gathers.lost_ms_max) == (54.0, 61.0)
    assert "in 16 unit-passes: 54.00-61.00 ms each, 920.00 ms/step" in gathers.message
    assert gathers.knob == PREFETCH
    assert actions[1].count == 1 and actions[1].message == other.message  # alone: its own words


def test_a_groups_loss_is_one_figure_in_its_line_and_its_total() -> None:
    # 12.503 + 9.246 + 8.66 + 8.146 sums to 38.55500000000001 in floating point: printed unrounded it
    # reads 38.56 beside a total of 38.555, which prints 38.55
    alike = [_outlasting(f"blocks.{i}", "forward", lost) for i, lost in enumerate((12.503, 9.246, 8.66, 8.146))]
    (action,) = group_findings(alike)
    assert action.lost_ms_per_step == 38.555
    assert f"{action.lost_ms_per_step:.2f} ms/step" in action.message
    assert "38.55 ms/step" in action.message and "38.56" not in action.message


def test_reduction_groups_of_two_collectives_read_apart_and_name_their_passes() -> None:
    """An HSDP run's reduce-scatters and all-reduces that outlast the compute after them are two groups
    (two kinds): each line names its own collective and the unit-passes it holds, the first three and a
    count of the rest, in the findings' order."""
    def outlasting(kind: str, unit: str, lost: float) -> Finding:
        return Finding(kind=kind, cause=fnd.CAUSE_OUTLASTS_AFTER, unit=unit, phase="backward", lost_ms_per_step=lost,
                       message=f"{unit}: outlasts")
    rs = [outlasting("exposed_reduce_scatter", f"blocks.{i}", 1.0 + i) for i in range(2)]
    ar = [outlasting("exposed_all_reduce", f"blocks.{i}", 4.0 + i) for i in range(5)]
    groups = group_findings([*rs, *ar])
    assert [(a.kind, a.count) for a in groups] == [("exposed_reduce_scatter", 2), ("exposed_all_reduce", 5)]
    assert groups[0].message == ("reduce-scatters outlast the compute that runs after them in 2 unit-passes: "
                                 "1.00-2.00 ms each, 3.00 ms/step (blocks.0 backward, blocks.1 backward)")
    assert groups[1].message == ("HSDP all-reduces outlast the compute that runs after them in 5 unit-passes: "
                                 "4.00-8.00 ms each, 30.00 ms/step (blocks.0 backward, blocks.1 backward, "
                                 "blocks.2 backward and 2 more)")


def test_groups_that_lead_to_one_setting_are_one_action_with_all_their_losses() -> None:
    """Gathers that started late and gathers never prefetched both lead to prefetch 1: one action, whose
    words, count, units and losses are both groups' (the 7 + 5 unit-passes of a recorded MoE run)."""
    late = [Finding(kind="exposed_all_gather", cause=fnd.CAUSE_STARTED_LATE, unit=f"blocks.{i}.moe.experts",
                    phase="forward", lost_ms_per_step=10.0 + i, message="late", knob=PREFETCH) for i in range(7)]
    never = [Finding(kind="exposed_all_gather", cause=fnd.CAUSE_NOT_PREFETCHED, unit=f"blocks.{i}", phase="forward",
                     lost_ms_per_step=8.0 + i, message="never", knob=PREFETCH) for i in range(5)]
    groups = group_findings([*late, *never])
    assert [a.count for a in groups] == [7, 5]
    (one,) = one_per_setting(groups, ["prefetch 1", "prefetch 1"])
    # 10 + ... + 16 = 91 ms and 8 + ... + 12 = 50 ms
    assert (one.count, len(one.units), one.lost_ms_per_step) == (12, 12, 141.0)
    assert (one.lost_ms_min, one.lost_ms_max) == (8.0, 16.0)
    assert "in 7 unit-passes: 10.00-16.00 ms each, 91.00 ms/step" in one.message
    assert "(not prefetched) in 5 unit-passes: 8.00-12.00 ms each, 50.00 ms/step" in one.message
    # a group whose loss is unknown leaves the total unknown, not smaller
    unknown = msgspec.structs.replace(groups[1], lost_ms_per_step=None, lost_ms_min=None, lost_ms_max=None)
    (partial,) = one_per_setting([groups[0], unknown], ["prefetch 1", "prefetch 1"])
    assert (partial.count, partial.lost_ms_per_step, partial.lost_ms_min) == (12, None, None)
    # the bound's loss already holds what the findings lose in its part of the step: it stays
    bound = Action(kind=KIND_BOUND, cause="communication", message="communication-bound", count=1,
                   lost_ms_per_step=200.0, knob=PREFETCH)
    (led,) = one_per_setting([bound, groups[0]], ["prefetch 1", "prefetch 1"])
    assert (led.count, led.lost_ms_per_step, led.lost_ms_min) == (8, 200.0, None)
    assert led.message.startswith("communication-bound; all-gathers started only after")


def test_prefetch_is_not_advised_where_gloo_runs_collectives_on_the_host() -> None:
    (action,) = group_findings([_outlasting("blocks.1", "forward", 5.0)], host_backend_on_gpu=True)
    assert action.knob == "" and action.why_not == HOST_BACKEND_BLOCKS
    assert "Prefetch cannot help on this run" in action_text(action)


def test_a_reason_two_actions_share_is_given_in_full_once() -> None:
    # two gather actions both blocked by the CPU rank's waits, one by another reason between them
    first, second = group_findings([_outlasting("blocks.1", "forward", 5.0)], waits_out=True)[0], \
        group_findings([_outlasting("blocks.2", "backward", 3.0)], waits_out=True)[0]
    other = group_findings([_outlasting("blocks.3", "forward", 2.0)], host_backend_on_gpu=True)[0]
    assert first.why_not == second.why_not == CPU_BLOCKS and other.why_not == HOST_BACKEND_BLOCKS
    texts = action_texts([first, other, second])
    assert texts[0] == action_text(first) and texts[1] == action_text(other)
    assert texts[0].endswith(CPU_BLOCKS[0].upper() + CPU_BLOCKS[1:] + ".")
    assert texts[2] == f"{second.message.rstrip('.')}. Prefetch cannot help on a CPU rank (as above)."
    assert sum(CPU_BLOCKS[1:] in t for t in texts) == 1
    # each reason of its own stays whole
    assert action_texts([first, other]) == [action_text(first), action_text(other)]


def test_the_fsdp1_samples_terminal_and_page_say_why_prefetch_cannot_help_once(
        sample_run: Callable[[str], Any], capsys: pytest.CaptureFixture[str]) -> None:
    from helpers.cli import stdout_here

    from fsdpviz.report.data import actions_text

    # two of the sample's shown actions are about gathers a prefetch would move, each blocked
    shown = [a for a in sample_run("fsdp1-cpu-2rank").summary.actions if not a.folded]
    assert sum(a.why_not == CPU_BLOCKS for a in shown) == 2
    out = " ".join(stdout_here(capsys, "summary", str(SAMPLES / "fsdp1-cpu-2rank"), "--no-cache").split())
    assert out.count("Prefetch cannot help on a CPU rank: FSDP's training thread") == 1
    assert out.count("Prefetch cannot help on a CPU rank (as above).") == 1
    page = actions_text(sample_run("fsdp1-cpu-2rank").summary.actions)
    assert sum(CPU_BLOCKS[1:] in t for t in page) == 1 and sum("(as above)" in t for t in page) == 1


def test_gathers_that_outlast_a_pass_which_gathers_longer_than_it_computes_say_why_nothing_is_advised(
        sample_run: Callable[[str], Any]) -> None:
    # the bundled plain FSDP2 sample: its backward gathers about 5 ms a step against 1.5 ms of compute
    summary = sample_run("fsdp2-cpu-2rank-plain").summary
    outlast = [f for f in summary.findings if f.cause == fnd.CAUSE_OUTLASTS_COMPUTE]
    assert outlast and all(f.phase == "backward" and not f.knob for f in outlast)
    (action,) = [a for a in summary.actions if a.cause == fnd.CAUSE_OUTLASTS_COMPUTE]
    assert not action.knob and action.why_not == outlast[0].why_not
    found = re.fullmatch(r"no deeper prefetch hides it: the backward pass gathers longer than it computes "
                         r"\(([\d.]+) ms against ([\d.]+) ms a step, medians over ranks and steps\)", action.why_not)
    assert found, action.why_not
    gathers, compute = float(found[1]), float(found[2])
    # against the units table's own medians: the units' backward compute, and at least what their
    # backward gathers left exposed (a gather is exposed for at most its own time)
    assert compute == pytest.approx(sum(u.backward_ms or 0.0 for u in summary.units), abs=0.02)
    assert gathers >= sum(u.backward_exposed_all_gather_ms or 0.0 for u in summary.units) - 0.02
    assert gathers > 3 * compute


def test_a_pass_gathering_in_shared_buckets_counts_each_collective_once() -> None:
    """ZeRO-3 gathers several units' parameters in one collective (its prefetch bucket): the pass's
    gathering is the time some gather ran, not each unit's share of a bucket summed. On the committed
    per-block ZeRO-3 recording the forward pass's figure cannot exceed the whole step's all-gather
    time, by the same statistic (the median over ranks and steps of each step's time some all-gather ran,
    every phase's, on the run's clock): each step's forward gathering is part of it. (On an earlier
    recording the forward figure read 7.43 ms against the step's 7.01 while buckets were counted per unit.)"""
    from fsdpviz.analysis.pipeline import analyse
    from fsdpviz.structure.intervals import total_ns, union_intervals
    from fsdpviz.whatif.gains import completed_summary

    run = Path(__file__).parents[1] / "recorded" / "example-zero3-block" / "run"
    result = analyse([run], cache=False, progress=False)
    summary = completed_summary(result)
    # the pass's figures as the finding says them, whether they leave a knob or say why there is none
    said = {f.evidence.rsplit("; ", 1)[-1] for f in summary.findings
            if f.cause == fnd.CAUSE_OUTLASTS_COMPUTE and f.phase == "forward"}
    (found,) = {re.fullmatch(r"the forward pass gathers ([\d.]+) ms and computes [\d.]+ ms a step \(medians over "
                             r"ranks and steps\)", w) for w in said}
    assert found, said
    spans = result.analysis.spans
    gathers = spans[(spans["kind"] == "all_gather").to_numpy()]
    per_step = [total_ns(union_intervals(g["start_ns"].to_numpy(np.int64), g["end_ns"].to_numpy(np.int64)))
                for _, g in gathers.groupby(["rank", "step"])]
    assert summary.bound is not None
    step_gathers = float(np.median(per_step)) * summary.bound.comm_scale / 1e6
    assert 0 < float(found[1]) <= round(step_gathers, 2)


def test_deepspeeds_prefetch_is_left_to_whatif_on_a_cpu_rank() -> None:
    # DeepSpeed's prefetched gathers are asynchronous: its CPU ranks compute beside some of them
    zero3 = msgspec.structs.replace(_outlasting("blocks.1", "forward", 5.0),
                                    knob="a larger stage3_prefetch_bucket_size in the DeepSpeed config")
    (action,) = group_findings([zero3], waits_out=waits_out_collectives("cpu", "zero3"))
    assert action.knob == zero3.knob and action.why_not == ""
    (fsdp,) = group_findings([_outlasting("blocks.1", "forward", 5.0)], waits_out=waits_out_collectives("cpu", "fsdp2"))
    assert fsdp.knob == "" and fsdp.why_not == CPU_BLOCKS


def test_a_cpu_communication_bound_is_fewer_units_for_fsdp_and_prefetch_for_deepspeed(
        sample_run: Callable[[str], Any]) -> None:
    bound = sample_run("fsdp1-cpu-2rank").summary.bound  # a CPU rank, exposed communication its loss
    assert bound is not None and bound.loss is not None and bound.loss.kind == "communication"
    fsdp = bound_action(bound, framework="fsdp1")
    deepspeed = bound_action(bound, framework="zero3")
    assert fsdp is not None and deepspeed is not None
    assert fsdp.knob == KNOB_COMMUNICATION_CPU and deepspeed.knob == KNOB_COMMUNICATION


@pytest.mark.parametrize("name", ["fsdp2-cpu-2rank", "fsdp1-cpu-2rank"])
def test_prefetch_is_not_advised_on_a_cpu_rank(name: str, sample_run: Callable[[str], Any]) -> None:
    # the samples' training threads wait out every gloo collective (tests/unit/test_cpu_collective_waits.py
    # reads it off their traces): a finding's prefetch knob is not advised, said why, and not priced
    actions = predicted_actions(sample_run(name))
    prefetching = [a for a in actions if a.kind != "bound" and "prefetch" in a.why_not + a.knob]
    assert prefetching, [a.message for a in actions]
    for action in prefetching:
        assert action.knob == "" and action.why_not == CPU_BLOCKS and not action.predicted_gain
    # the bound's action prices fewer units instead
    assert actions[0].kind == "bound" and "(fsdpviz whatif: wrap " in (actions[0].predicted_gain or "") + actions[0].why_not
    # and the findings behind those actions, as `summary --json` lists them, suggest no prefetch either:
    # each says why where its cause would have suggested one
    findings = sample_run(name).summary.findings
    blocked = [f for f in findings if f.why_not and f.cause != fnd.CAUSE_STRAGGLER]  # its why_not: the cores
    assert blocked and all(f.why_not == CPU_BLOCKS and f.knob == "" for f in blocked)
    assert not [f.knob for f in findings if "prefetch" in f.knob]
    assert sum(a.count for a in prefetching) == len(blocked)
    # the notebook's table and `fsdpviz export` list them as the summary does
    import fsdpviz
    from fsdpviz.commands.export import export_tables

    for table in (fsdpviz.open(SAMPLES / name, cache=False).findings, export_tables(sample_run(name))["findings"]):
        assert not [k for k in table["knob"] if "prefetch" in k]
        assert (table["why_not"] == CPU_BLOCKS).sum() == len(blocked)


def test_a_knob_predicted_to_gain_nothing_is_not_advised() -> None:
    (action,) = group_findings([_outlasting("blocks.1", "forward", 5.0)])
    none = with_prediction(action, 0.0, "predicted +0.00 ms/step (+0.0 %) (fsdpviz whatif: prefetch 2)")
    assert none.knob == "" and "Try:" not in action_text(none) and "predicts no gain" in none.why_not
    gain = with_prediction(action, -2.5, "predicted -2.50 ms/step (-5.0 %) (fsdpviz whatif: prefetch 2)")
    assert gain.knob == PREFETCH and "Try: " in action_text(gain) and gain.predicted_change_ms == -2.5
    assert with_prediction(action, None, "") == action  # not predicted: as it was
    # not predictable (a setting whatif refuses, with its reason): unknown, not zero, and not advised
    unknown = with_prediction(action, None, "", because="fsdpviz whatif cannot say")
    assert unknown.knob == "" and unknown.predicted_change_ms is None and unknown.predicted_gain == ""
    assert unknown.why_not == "not advised: fsdpviz whatif cannot say" and "Try:" not in action_text(unknown)


def test_at_most_five_shown() -> None:
    many = [Finding(kind="straggler", cause=fnd.CAUSE_STRAGGLER, rank=r, lost_ms_per_step=10.0 - r,
                    message=f"rank {r} is late") for r in range(8)]
    actions = build_actions(many, None)
    assert len(actions) == 8 and [a.folded for a in actions] == [False] * MAX_SHOWN + [True] * 3


def test_gloo_wall_of_findings_reads_as_a_few_lines(gpu_fsdp_run: Callable[[str], Any]) -> None:
    result = gpu_fsdp_run("h100-fsdp2-gloo2-block")
    summary = result.summary
    # every unit pass that loses time past the floor has its finding, none cut: each block whose exposed
    # reduce-scatter the units' table gives above the floor (0.5 % of the step) is one, and the actions'
    # reduce-scatter totals hold them all
    floor_ms = max(fnd.NOISE_FRACTION * summary.step_time_ms, fnd.NOISE_FLOOR_NS / 1e6)
    reducing = {u.name for u in summary.units if (u.exposed_reduce_scatter_ms or 0.0) >= floor_ms}
    assert len(reducing) >= 8, reducing
    said = [f for f in summary.findings if f.kind == "exposed_reduce_scatter"]
    assert {f.unit for f in said} == reducing
    assert len(summary.findings) > 20
    actions = predicted_actions(result)
    everything = [a for a in summary.actions if a.kind == "exposed_reduce_scatter"]
    assert sum(a.lost_ms_per_step or 0.0 for a in everything) == pytest.approx(
        sum(f.lost_ms_per_step or 0.0 for f in said), abs=0.02)
    assert len(actions) <= MAX_SHOWN and not any(a.folded for a in actions)
    first = actions[0]
    assert first.kind == "bound" and first.cause == "communication" and first.message.startswith("communication-bound")
    assert first.why_not == HOST_BACKEND_BLOCKS and "prefetch" not in first.knob
    # the one sentence the run needs: per unit, 3-10 ms of compute against 115-143 ms of gathering, the
    # units' own figures (the table's), the root left out
    blocks = [u for u in summary.units if u.name != "(root)"]
    compute = [v for u in blocks for v in (u.forward_ms, u.backward_ms) if v]
    gathers = [u.all_gather_ms for u in blocks if u.all_gather_ms]
    assert (f"; per unit, compute {min(compute):.2f}-{max(compute):.2f} ms against {min(gathers):.2f}-"
            f"{max(gathers):.2f} ms of all-gather per step") in first.message
    assert 10 * max(compute) < min(gathers)
    outlast = next(a for a in actions if a.cause == fnd.CAUSE_OUTLASTS_COMPUTE)
    # every prefetched all-gather that outlasts its compute, in one line: 15 unit-passes of 54-68 ms
    assert outlast.count >= 12 and 50 < outlast.lost_ms_min <= outlast.lost_ms_max < 70
    assert outlast.lost_ms_per_step == pytest.approx(
        sum(f.lost_ms_per_step or 0 for f in summary.findings if f.cause == fnd.CAUSE_OUTLASTS_COMPUTE), abs=0.01)
    # both passes gather longer than they compute: the reason is said once, with each pass's figures
    reasons = {f.why_not for f in summary.findings if f.cause == fnd.CAUSE_OUTLASTS_COMPUTE}
    assert len(reasons) == 2 and outlast.why_not.count("no deeper prefetch hides it") == 1, outlast.why_not
    for reason in reasons:
        assert reason.removeprefix("no deeper prefetch hides it: ") in outlast.why_not
    # no action advises prefetch on a run whose collectives are synchronous
    assert not [a for a in actions if "prefetch" in a.knob]


def test_launch_bound_recording_leads_with_fewer_units(gpu_fsdp_run: Callable[[str], Any]) -> None:
    actions = predicted_actions(gpu_fsdp_run("h100-fsdp2-fake8-block"))
    first = actions[0]
    assert first.kind == "bound" and first.cause == "host" and "fewer or larger units" in first.knob
    # predicted through whatif (merge:2): a gain, and no larger than the host wait it comes from
    assert first.predicted_change_ms is not None and -first.lost_ms_per_step <= first.predicted_change_ms < 0


@pytest.mark.parametrize("sample", ["fsdp2-cpu-2rank", "fsdp1-cpu-2rank", "zero3-cpu-2rank", "fsdp2-cpu-2rank-plain"])
def test_samples_advise_nothing_predicted_to_gain_nothing(sample: str, sample_run: Callable[[str], Any],
                                                          repo_root: Path) -> None:
    result = sample_run(sample)
    bound = result.summary.bound
    assert bound is not None and bound.device == "cpu" and bound.host_wait_ms is None
    contract = result.summary.to_json()["bound"]
    assert {"kind", "compute_ms", "exposed_comm_ms", "host_wait_ms", "other_idle_ms", "basis"} <= set(contract)
    # the plain torch.profiler sample has no timers: its split is the traced step's, and says so
    assert (bound.basis == "traced") == sample.endswith("plain")
    run_dir = repo_root / "sample_traces" / sample
    if bound.basis == "traced":
        assert "without the recorder's timers" in (bound.note or "")
        # the step is the profiler's own ProfilerStep spans of the analysed steps (read from the files)
        raws = [raw_trace(path) for path in sorted(run_dir.glob("rank*.trace.json*"))]
        want = statistics.mean(raw.step_ms(s) for raw in raws for s in result.summary.steps)
    else:
        # the step is the wall clock of the clean steps, as each rank's timers file holds it
        cost = result.summary.profiler
        assert cost is not None
        want = statistics.median(statistics.median(timer_step_ms(path)[s] for s in cost.unprofiled_steps)
                                 for path in sorted((run_dir / "timers").glob("rank*.jsonl")))
    assert bound.step_ms == pytest.approx(want, abs=1e-3)
    actions = predicted_actions(result)
    # at most five shown, and past them only the profiler's caveat on every figure (past 1.5x)
    assert sum(not a.folded and fnd.LARGELY_PROFILERS not in a.message for a in actions) <= MAX_SHOWN
    # the bound first, then what to try, then the rest, each by time lost; the profiler's share last
    # (the run itself does not lose it), as the findings list it
    rest = [a for a in actions if a.kind != "bound"]
    advised = [a for a in rest if a.knob]
    others = [a for a in rest if not a.knob and a.cause != "profiler"]
    assert rest == advised + others + [a for a in rest if a.cause == "profiler"]
    assert [f.kind for f in result.summary.findings][-1:] == ["profiler"] or not any(
        a.cause == "profiler" for a in rest)
    for part in (advised, others):
        lost = [a.lost_ms_per_step or 0.0 for a in part]
        assert lost == sorted(lost, reverse=True)
    for a in actions:
        if a.knob and a.predicted_change_ms is not None:
            assert a.predicted_change_ms < 0
        if a.predicted_change_ms is not None and a.predicted_change_ms > -0.005:
            # whatif's order: a change within the recording's spread is not measurable in this recording, whichever
            # its sign; only a slower step beyond it is "no gain"
            share, step = spread_share(result), result.summary.step_time_ms
            spread = share * step if share is not None and step is not None else None
            within = spread is not None and abs(a.predicted_change_ms) <= spread
            assert a.knob == "" and ("step-to-step spread: not measurable in this recording" if within else "predicts no gain") \
                in a.why_not


def _host_bound(knob: str) -> Action:
    return Action(kind=KIND_BOUND, cause=KIND_HOST, message="host-bound", count=1, lost_ms_per_step=5.0, knob=knob)


def test_a_host_bound_zero3_run_is_not_advised_a_wrap_whatif_cannot_make(sample_run: Callable[[str], Any]) -> None:
    """ZeRO-3's units are DeepSpeed's modules: no wrap can be predicted (``--explore`` tries none, and
    ``whatif --wrap`` refuses), so the bound's fewer-units knob is unknown, not advised, and says why."""
    model = read_model(sample_run("zero3-cpu-2rank"))
    (action,) = predict_actions(model, [_host_bound(KNOB_HOST_CPU)])
    assert action.knob == "" and action.predicted_change_ms is None
    assert action.why_not == ("not advised: fsdpviz whatif cannot predict fewer units (zero3: other wrap policies "
                              "are not modelled)")


def test_a_run_wrapped_at_its_root_is_told_it_is_one_unit_already() -> None:
    """The committed dim-256 root recording: its run.json lists one unit, the root. Fewer units is no
    setting there: the bound's knob is not advised, and the reason names the knob and why, not a model
    that fails to predict."""
    run = Path(__file__).resolve().parents[1] / "recorded" / "fsdp2-d256-root" / "run"
    assert [u["unit"] for u in json.loads((run / "run.json").read_text())["units"]] == ["(root)"]
    model = read_model(analyse([run], cache=False))
    (action,) = predict_actions(model, [_host_bound(KNOB_HOST_CPU)])
    assert action.knob == "" and action.predicted_change_ms is None
    assert action.why_not == "not advised: the run is one unit already (the root), so there are no units to merge into fewer"


def test_a_wrap_over_the_devices_memory_is_not_advised(tmp_path: Path) -> None:
    """As ``--explore`` lists a setting over the device's memory apart, the bound's knob is not advised
    when its best wrap's predicted peak exceeds the memory the trace states (here set one byte above the
    recorded peak, below what coarser units gather)."""
    run = generate_run(SCENARIO, tmp_path, run_folder=True).folder
    model = read_model(analyse([run], cache=False, progress=False))
    peak = max(s.memory.peak_bytes for s in model.recording.steps if s.memory is not None)
    for path in sorted((run / "traces").glob("*.json*")):
        opener = gzip.open if path.suffix == ".gz" else open
        with opener(path, "rt") as f:
            trace = json.load(f)
        for props in trace.get("deviceProperties", []):
            props["totalGlobalMem"] = peak + 1
        with opener(path, "wt") as f:
            json.dump(trace, f)
    model = read_model(analyse([run], cache=False, progress=False))
    (action,) = predict_actions(model, [_host_bound(KNOB_HOST)])
    assert action.knob == "" and "exceeds the device's" in action.why_not, action.why_not
    assert action.predicted_change_ms is not None  # predicted, and said, but not advised


@pytest.mark.parametrize(("name", "warned"), [("B", False), ("Bl", True)])
def test_a_profiler_that_more_than_half_again_slowed_the_steps_is_said_of_every_view(
        gpu_h200_dir: Path, name: str, warned: bool) -> None:
    """The H200 recordings' own timers: B's profiled steps ran 1.46x its clean ones, Bl's (recorded with
    --no-memory, one rank on 16 cores) 1.67x, read here from the timers files. Past 1.5x the profiler's
    finding says, as every whatif prediction warns, that the traced timeline is largely the profiler's,
    and what would record a closer base: for Bl nothing its options can change (run.json)."""
    folder = gpu_h200_dir / name
    result = analyse([folder], cache=False, progress=False)
    cost = result.summary.profiler
    assert cost is not None
    ranks = sorted((folder / "timers").glob("rank*.jsonl"))
    profiled = statistics.median(statistics.mean(timer_step_ms(p)[s] for s in cost.profiled_steps) for p in ranks)
    clean = statistics.median(statistics.median(timer_step_ms(p)[s] for s in cost.unprofiled_steps) for p in ranks)
    assert (profiled / clean > 1.5) == warned
    (finding,) = [f for f in result.summary.findings if f.kind == "profiler"]
    assert ("largely the profiler's own cost" in finding.message) == warned
    if warned:
        assert finding.message.endswith(NO_CLOSER_BASE) and "--no-memory" not in finding.message


def test_a_profiler_past_half_again_is_never_folded_from_the_actions(sample_run: Callable[[str], Any]) -> None:
    # the ZeRO-3 sample's timers: profiled steps 1.71x the clean ones (raw files), six actions in all; past
    # 1.5x the profiler's action is a caveat on every figure above it, so it is shown however many precede it
    folder = SAMPLES / "zero3-cpu-2rank"
    ranks = sorted((folder / "timers").glob("rank*.jsonl"))
    summary = sample_run("zero3-cpu-2rank").summary
    cost = summary.profiler
    assert cost is not None
    profiled = statistics.median(statistics.mean(timer_step_ms(p)[s] for s in cost.profiled_steps) for p in ranks)
    clean = statistics.median(statistics.median(timer_step_ms(p)[s] for s in cost.unprofiled_steps) for p in ranks)
    assert profiled / clean > 1.5
    actions = summary.actions
    assert len(actions) > MAX_SHOWN
    (profiler,) = [a for a in actions if a.cause == fnd.CAUSE_PROFILER]
    assert actions[-1] is profiler and not profiler.folded and fnd.LARGELY_PROFILERS in profiler.message
    assert [a.folded for a in actions[:-1]] == [i >= MAX_SHOWN for i in range(len(actions) - 1)]


def test_nothing_is_advised_or_ranked_where_the_spread_is_unknown() -> None:
    # the plain sample has no timers and one analysed step: no spread to hold a change to,
    # so no knob, why_not says so beside the prediction, and --explore ranks nothing (it had advised
    # root at -51.5 % with "whether the change is measurable cannot be said")
    from fsdpviz.whatif.explore import explore
    from fsdpviz.whatif.predict import SPREAD_UNKNOWN_WHY

    folder = Path(__file__).parents[2] / "sample_traces" / "fsdp2-cpu-2rank-plain"
    result = analyse([folder], cache=False, progress=False)
    assert len(result.summary.steps) == 1 and spread_share(result) is None
    actions = predicted_actions(result)
    priced = [a for a in actions if a.predicted_change_ms is not None]
    assert priced and not [a.knob for a in actions if a.knob]
    for action in priced:
        assert SPREAD_UNKNOWN_WHY in action.why_not, action.why_not
    exploration = explore(read_model(result))
    assert not exploration.ranked and not exploration.within_spread and exploration.unranked
    assert exploration.best() is None and any(SPREAD_UNKNOWN_WHY in n for n in exploration.notes)


def test_a_bucketed_collective_says_its_exposure_is_the_buckets(sample_run: Callable[[str], Any]) -> None:
    """ZeRO-3 reduces its gradients in buckets: the bundled sample's reduce-scatter ranges each name 16
    units (read from the trace file). Its exposed time counts for one unit of the bucket, so that unit's
    exposure exceeds its own share of the collective; the line a person reads says so, with the bucket's
    size, instead of a unit exposed longer than it communicates."""
    from helpers.rawfiles import trace_events

    path = SAMPLES / "zero3-cpu-2rank" / "traces" / "rank0.trace.json.gz"
    named = [len(e["name"].split(" (", 1)[1].rstrip(")").split(", ")) for e in trace_events(path)
             if e.get("name", "").startswith("fsdpviz::reduce_scatter (")]
    assert named and max(named) == 16
    summary = sample_run("zero3-cpu-2rank").summary
    (finding,) = [f for f in summary.findings if f.kind == "exposed_reduce_scatter"]
    said = re.search(r"exposed ([\d.]+) ms/step in backward \(bucketed: reduce-scatters of up to (\d+) units, "
                     r"([\d.]+) ms a step in all, all their exposed time counted here; this unit's share ([\d.]+) ms; "
                     r"each a median over ranks and steps\)",
                     finding.message)
    assert said and int(said[2]) == max(named), finding.message
    exposed, share = float(said[1]), float(said[4])
    unit = next(u for u in summary.units if u.name == finding.unit)
    assert share == pytest.approx(unit.reduce_scatter_ms, abs=0.006) and exposed > share


WITHIN = "within the recording's 12.13 ms step-to-step spread: not measurable in this recording"


@pytest.mark.parametrize("change_ms, spread_ms, said", [
    (-10.93, 12.13, f"not advised: fsdpviz whatif predicts -10.93 ms/step (-43.7 %), {WITHIN}"),
    (+0.50, 12.13, f"not advised: fsdpviz whatif predicts +0.50 ms/step (+2.0 %), {WITHIN}"),
    (+3.00, 1.00, "not advised: fsdpviz whatif predicts no gain (+3.00 ms/step (+12.0 %))"),
])
def test_advice_whatif_does_not_stand_behind_says_the_figure_then_why(change_ms: float, spread_ms: float,
                                                                     said: str) -> None:
    """A knob whose predicted change is within the recording's spread (faster or slower) or slower beyond
    it is not advised; the reason gives whatif's figure first, then why it is not a change to act on."""
    action = Action(kind="exposed_all_gather", cause=fnd.CAUSE_OUTLASTS_COMPUTE, message="m", count=1,
                    lost_ms_per_step=1.0, knob=PREFETCH)
    pct = 100 * change_ms / 25.0
    out = with_prediction(action, change_ms, f"predicted {change_ms:+.2f} ms/step ({pct:+.1f} %)", spread_ms=spread_ms)
    assert out.knob == "" and out.why_not == said and out.predicted_change_ms == change_ms


def test_a_straggler_on_a_host_with_no_core_to_spare_says_it_may_be_waiting_for_one(
        sample_run: Callable[[str], Any], tmp_path: Path) -> None:
    """The bundled FSDP2 sample ran 2 ranks on a host of 2 cores (run.json's hosts): a rank that waited for a
    core starts its collectives late, and the straggler finding says so, for the user to record again
    before reading it as the run's. The same traces from a host of 64 cores (run.json says so) keep the
    finding without it."""
    import json
    import shutil

    from fsdpviz.analysis.pipeline import analyse
    from fsdpviz.analysis.summary import STRAGGLER_CROWDED

    sample = Path(__file__).parents[2] / "sample_traces" / "fsdp2-cpu-2rank"
    meta = json.loads((sample / "run.json").read_text())
    assert {(r["host"], r["cpu_count"]) for r in meta["ranks"]} == {("vm", 2)} and meta["world_size"] == 2
    (straggler,) = [f for f in sample_run("fsdp2-cpu-2rank").summary.findings if f.cause == fnd.CAUSE_STRAGGLER]
    assert straggler.why_not == STRAGGLER_CROWDED
    roomy = tmp_path / "roomy"
    shutil.copytree(sample, roomy, ignore=shutil.ignore_patterns(".fsdpviz-cache"))
    for rank in meta["ranks"]:
        rank["cpu_count"] = 64
    (roomy / "run.json").write_text(json.dumps(meta))
    (other,) = [f for f in analyse([roomy], cache=False, progress=False).summary.findings
                if f.cause == fnd.CAUSE_STRAGGLER]
    assert other.why_not == "" and other.lost_ms_per_step == straggler.lost_ms_per_step


def test_no_larger_bucket_is_advised_where_deepspeeds_holds_every_unit(sample_run: Callable[[str], Any]) -> None:
    """The bundled ZeRO-3 sample ran DeepSpeed's default prefetch bucket, 50,000,000 elements, on a model of
    42,880 (run.json's units): a larger bucket fetches nothing earlier, so "more prefetch" is not advised
    (neither the communication bound's nor a finding's), and it says why instead of advising it unpriced."""
    import json

    from fsdpviz.analysis.bound import KIND_COMMUNICATION
    from fsdpviz.replay.model import read_model
    from fsdpviz.whatif.gains import action_settings, predict_actions

    meta = json.loads((SAMPLES / "zero3-cpu-2rank" / "run.json").read_text())
    buckets = {u["forward_prefetch"] for u in meta["units"] if u["forward_prefetch"] is not None}
    total = sum(max(u["param_numel"], 0) for u in meta["units"])
    assert buckets == {50_000_000} and total == 42_880
    result = sample_run("zero3-cpu-2rank")
    model = read_model(result)
    for knob, kind, cause in (("prefetch earlier", "bound", KIND_COMMUNICATION),
                              ("a larger stage3_prefetch_bucket_size in the DeepSpeed config", "exposed_all_gather",
                               fnd.CAUSE_NOT_PREFETCHED)):
        action = Action(kind=kind, cause=cause, message="", count=1, lost_ms_per_step=1.0, knob=knob)
        assert action_settings(action, model) == []
        (said,) = predict_actions(model, [action])
        assert said.knob == "" and said.predicted_change_ms is None
        assert said.why_not == (f"not advised: the recorded stage3_prefetch_bucket_size (50,000,000 elements) already "
                                f"holds every unit's parameters ({total:,} elements): a larger bucket fetches nothing earlier")


def test_a_bucketed_units_collectives_in_all_hold_its_own_too() -> None:
    """A unit whose reduce-scatters are one bucket of two units (1 ms) and one of its own (3 ms) in a
    step: "in all" is the 4 ms of its pass's reduce-scatters, never less than its share of them (the
    bucket counted once) nor than its exposed time. Built here, so the answer is known; a ZeRO-3 run read
    "5.81 ms a step in all (its share 9.26 ms)" when only the buckets were counted."""
    import pandas as pd

    spans = pd.DataFrame({"rank": [0, 0, 0], "step": [1, 1, 1], "unit": ["a", "a", "b"],
                          "phase": ["backward"] * 3, "kind": ["reduce_scatter"] * 3,
                          "start_ns": [0, 2_000_000, 0], "end_ns": [1_000_000, 5_000_000, 1_000_000],
                          "n_units": [2, 1, 2]})
    shared = fnd._shared(spans, "reduce_scatter", 1.0)
    assert shared.loc[("a", "backward"), "full_ns"] == 4_000_000  # the bucket and its own, each once
    assert shared.loc[("b", "backward"), "full_ns"] == 1_000_000
    assert shared.loc[("a", "backward"), "n_units"] == 2
