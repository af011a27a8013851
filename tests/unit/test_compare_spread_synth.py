"""Best marks against the runs' step-to-step spread, on synthetic runs whose steps are known.

Three simulated FSDP2 runs of one model (``tests/synth``) differ only in extra data loading per
step: ``jittery`` loads 2 ms longer in its second analysed step only (a spread of 2 ms), ``close``
0.5 ms longer in every step and ``slow`` 5 ms longer in every step. ``close`` is 0.5 ms faster
than ``jittery`` on average, within jittery's 2 ms spread: no star. ``jittery`` is 4 ms faster
than ``slow``, beyond both spreads: a star. ``single`` has one analysed step (its spread unknown) and
no extra loading: faster than ``jittery`` by less than jittery's known spread, so no star either. The
spreads themselves are the range of the
simulation's own step durations (median over ranks).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest
from synth import Scenario, generate_run, make_root, make_units

from fsdpviz.analysis.compare.runs import compare_runs, comparison_json
from fsdpviz.analysis.compare.spread import FEW_STEPS
from fsdpviz.analysis.pipeline import LabelledRun, RunResult, analyse
from fsdpviz.commands.compare_table import headline_rows, unit_rows
from fsdpviz.report.compare.build import load_runs

STEPS = (3, 4, 5)
EXTRA_NS = {"jittery": {4: 2_000_000}, "close": dict.fromkeys(STEPS, 500_000), "slow": dict.fromkeys(STEPS, 5_000_000)}


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> dict:
    base = tmp_path_factory.mktemp("synth-spread")
    out = {}
    for name, extra in EXTRA_NS.items():
        sc = Scenario(units=make_units(2, numel=1_000_000), root=make_root(), steps=STEPS, step_data_ns=extra,
                      gradients_per_kernel=False)
        out[name] = generate_run(sc, base / name, run_folder=True)
    # one step analysed: its spread is unknown
    sc = Scenario(units=make_units(2, numel=1_000_000), root=make_root(), steps=(3,), step_data_ns={},
                  gradients_per_kernel=False)
    out["single"] = generate_run(sc, base / "single", run_folder=True)
    return out


@pytest.fixture(scope="module")
def result_of() -> Callable[[Path], RunResult]:
    """``result_of(folder)``: the pipeline's result for a synthetic run folder, as ``load_runs`` analyses
    it, once for the module: ``jittery`` is in four comparisons and ``single`` in five, and
    ``compare_runs`` only reads the results it is given (no test here moves a run's bound)."""
    done: dict[Path, RunResult] = {}

    def get(folder: Path) -> RunResult:
        if folder not in done:
            done[folder] = analyse([folder], cache=False, progress=False)
        return done[folder]

    return get


def _truth_steps_ms(run, analysed: list[int]):
    """The simulation's step durations of the analysed steps, per step the median over ranks, in ms."""
    steps = run.expected.steps
    steps = steps[steps["step"].isin(analysed)]
    return ((steps["end_ns"] - steps["start_ns"]).groupby(steps["step"]).median()) / 1e6


def _truth_spread_ms(run, analysed: list[int]) -> float:
    per_step = _truth_steps_ms(run, analysed)
    return float(per_step.max() - per_step.min())


def _compare(made: dict, names: list[str], result_of: Callable[[Path], RunResult]):
    """``compare_runs`` of the runs ``names`` of ``made``, labelled by their names (``load_runs``' runs,
    each analysed once for the module)."""
    return compare_runs([LabelledRun(label=n, source=str(made[n].folder), result=result_of(made[n].folder))
                         for n in names])


def test_a_difference_within_the_spread_gets_no_star(made: dict, result_of: Callable[[Path], RunResult]) -> None:
    comparison = _compare(made, ["jittery", "close"], result_of)
    spread = comparison.spread["step_time_ms"]
    analysed = comparison.runs[0].summary.steps
    assert 4 in analysed and comparison.runs[1].summary.steps == analysed
    assert spread[0] == pytest.approx(_truth_spread_ms(made["jittery"], analysed), abs=0.01)
    assert spread[0] == pytest.approx(2.0, abs=0.05)  # the 2 ms of step 4 by construction
    assert spread[1] == pytest.approx(_truth_spread_ms(made["close"], analysed), abs=0.01)
    assert spread[1] < 0.2  # every step the same
    values = comparison.values["step_time_ms"]
    assert values == pytest.approx([_truth_steps_ms(made[n], analysed).mean() for n in ("jittery", "close")],
                                   abs=0.01)
    assert 0 < values[0] - values[1] < spread[0]  # close is faster, by less than jittery's spread
    assert comparison.best["step_time_ms"] == []
    # within the noise too (0.17 ms apart against 2 standard errors of 1.33 ms): said first, as the finding does
    assert "within noise" in comparison.best_withheld["step_time_ms"]
    out = comparison_json(comparison)
    assert out["best"]["step_time_ms"] == []
    assert out["spread_ms"]["step_time_ms"] == spread
    row = next(r for r in headline_rows(comparison) if r[0] == "step time")
    assert "*" not in "".join(row[1:]) and "spread 2" in row[1]
    # the findings follow the same rule: no winner named
    finding = next(f for f in comparison.findings if f.kind == "step_time")
    assert finding.better is None and "within noise" in finding.message
    assert "step-to-step spread" in finding.evidence


def test_a_difference_beyond_the_spread_gets_its_star(made: dict, result_of: Callable[[Path], RunResult]) -> None:
    comparison = _compare(made, ["jittery", "slow"], result_of)
    values = comparison.values["step_time_ms"]
    analysed = comparison.runs[0].summary.steps
    assert values == pytest.approx([_truth_steps_ms(made[n], analysed).mean() for n in ("jittery", "slow")],
                                   abs=0.01)
    assert values[1] - values[0] > max(comparison.spread["step_time_ms"]) + 1.0  # beyond both spreads
    assert comparison.best["step_time_ms"] == [0]
    assert "step_time_ms" not in comparison.best_withheld
    row = next(r for r in headline_rows(comparison) if r[0] == "step time")
    assert row[1].split(" (")[0].endswith("*") and "*" not in row[2]
    # the units compute the same in both runs: no unit row names a better run on compute
    for group in comparison.match.groups:
        for metric in ("forward_ms", "backward_ms"):
            assert comparison.unit_best[group.name][metric] == [], (group.name, metric)
    assert unit_rows(comparison)[0][0] == "(root)"
    assert next(f for f in comparison.findings if f.kind == "step_time").better == "jittery"


def test_a_difference_within_the_one_known_spread_gets_no_star(made: dict,
                                                                result_of: Callable[[Path], RunResult]) -> None:
    comparison = _compare(made, ["jittery", "single"], result_of)
    spread = comparison.spread["step_time_ms"]
    assert spread[1] is None and spread[0] == pytest.approx(2.0, abs=0.05)
    values = comparison.values["step_time_ms"]
    assert 0 < values[0] - values[1] < spread[0]  # single is faster, by less than jittery's spread
    assert comparison.best["step_time_ms"] == []
    # within the noise too (0.67 ms apart against 1.33 ms): said first, as the finding does
    assert "within noise" in comparison.best_withheld["step_time_ms"]
    # the findings follow the same rule: no winner named
    finding = next(f for f in comparison.findings if f.kind == "step_time")
    assert finding.better is None and "within noise" in finding.message


def test_every_unknown_spread_says_why(made: dict, result_of: Callable[[Path], RunResult]) -> None:
    """compare --json: a null spread has its reason beside it, a known one none. ``single`` has one
    analysed step by construction, so no spread of its step time, exposed communication, overlap or
    units' times; the bound's parts have none in either run; group peaks are bytes."""
    out = comparison_json(_compare(made, ["jittery", "single"], result_of))
    unknown = out["spread_unknown"]
    for key, per_run in (*out["spread_ms"].items(), *out["spread_points"].items()):
        for label, spread in zip(out["labels"], per_run, strict=True):
            assert (spread is None) == (label in unknown.get(key, {})), (key, label)
    # the figures the synthetic steps give per step: jittery has two or more, single one
    for key in ("step_time_ms", "overlap.exposed_comm_ms", "overlap.comm_ms", "overlap.overlap_pct"):
        assert unknown[key] == {"single": FEW_STEPS.format(what="analysed")}, key
    for key in ("overlap.compute_ms", "overlap.fsdp_overhead_ms", "overlap.idle_ms"):
        assert set(unknown[key]) == {"jittery", "single"} and "not kept per step" in unknown[key]["single"], key
    for group in out["unit_groups"]:
        for metric, per_run in group["spread_ms"].items():
            for label, spread in per_run.items():
                why = group["spread_unknown"].get(metric, {}).get(label)
                assert (spread is None) == (why is not None), (group["name"], metric, label)
                if metric.endswith("_bytes"):
                    assert why is not None and "memory finding's rule" in why
                elif label == "single":
                    assert why is not None and why.startswith("fewer than two analysed"), (metric, why)


def test_a_run_without_communication_says_so_of_its_overlap_spread(gpu_fsdp_dir: Path) -> None:
    """Two real 1-rank H100 recordings (run.json, read as plain JSON: world size 1, so no collective to
    hide): each has several analysed steps (a step-time spread), and its overlap spread is null because
    no step has communication to hide, not for want of steps."""
    import json

    from fsdpviz.analysis.compare.spread import NO_SHARE

    names = ["h100-fsdp1-ws1-block", "h100-fsdp2-ws1-block"]
    for name in names:
        assert json.loads((gpu_fsdp_dir / name / "run.json").read_text())["world_size"] == 1
    out = comparison_json(compare_runs(load_runs([gpu_fsdp_dir / n for n in names], names, cache=False)))
    assert all(s is not None for s in out["spread_ms"]["step_time_ms"])
    assert out["spread_points"]["overlap.overlap_pct"] == [None, None]
    assert out["spread_unknown"]["overlap.overlap_pct"] == dict.fromkeys(names, NO_SHARE)


def test_a_third_run_within_the_spread_is_said_so_not_called_noise(tmp_path: Path,
                                                                    result_of: Callable[[Path], RunResult]) -> None:
    """``jumpy`` loads 3, 9 and 3 ms longer in its three steps: 5 ms slower than ``base`` on average,
    beyond the noise (twice the standard error of the difference: 2 x 3.46 / sqrt(3) = 4.0 ms) but within
    its own 6 ms spread, so the step-time finding neither ranks it nor calls it noise."""
    extras = {"slow": dict.fromkeys(STEPS, 20_000_000), "base": {}, "jumpy": {3: 3_000_000, 4: 9_000_000, 5: 3_000_000}}
    made = {}
    for name, extra in extras.items():
        sc = Scenario(units=make_units(2, numel=1_000_000), root=make_root(), steps=STEPS, step_data_ns=extra,
                      gradients_per_kernel=False)
        made[name] = generate_run(sc, tmp_path / name, run_folder=True)
    comparison = _compare(made, list(extras), result_of)
    assert comparison.runs[2].summary.steps == list(STEPS)
    spread = comparison.spread["step_time_ms"]
    assert spread[2] == pytest.approx(6.0, abs=0.05) and spread[1] < 0.2
    values = comparison.values["step_time_ms"]
    assert values[2] - values[1] == pytest.approx(5.0, abs=0.05)
    finding = next(f for f in comparison.findings if f.kind == "step_time")
    assert finding.better == "base"
    said = finding.message.split("Also, ", 1)[1]
    assert said.startswith("jumpy takes") and "within the runs' step-to-step spread: 6" in said, said
    assert "noise" not in said
    # its difference is named against the run it is measured from (the table's deltas are the first run's)
    more = re.search(r"^jumpy takes [\d.]+ ms \(([\d.]+) ms more than base, ", said)
    assert more and float(more[1]) == pytest.approx(5.0, abs=0.01), said


def test_two_runs_without_a_spread_are_not_ranked(made: dict, tmp_path: Path,
                                                   result_of: Callable[[Path], RunResult]) -> None:
    """Two runs of one analysed step each, the second loading 5 ms longer in it and gathering with no
    overlap by construction: clear differences on the page, but neither run has a step-to-step spread
    to hold them to, so, as whatif advises nothing where no spread is known, compare stars neither and
    names no winner of the step or of the exposed communication."""
    # "one" is the module's ``single``: one analysed step, no extra loading, overlapping as FSDP2 does
    runs = {"one": made["single"]}
    sc = Scenario(units=make_units(2, numel=1_000_000), root=make_root(), steps=(3,), step_data_ns={3: 5_000_000},
                  gradients_per_kernel=False, no_overlap=True)
    runs["slower"] = generate_run(sc, tmp_path / "slower", run_folder=True)
    comparison = _compare(runs, ["one", "slower"], result_of)
    assert comparison.spread["step_time_ms"] == [None, None]
    steps = [_truth_steps_ms(runs[n], [3]).iloc[0] for n in ("one", "slower")]
    assert steps[1] - steps[0] > 5.0  # the simulation's own steps
    values = comparison.values["step_time_ms"]
    assert values[1] - values[0] == pytest.approx(steps[1] - steps[0], abs=0.2)
    exposed = comparison.values["overlap.exposed_comm_ms"]
    assert exposed[1] > exposed[0] + 0.1 and comparison.best["overlap.exposed_comm_ms"] == []
    assert comparison.best["step_time_ms"] == []
    assert "neither run's step-to-step spread is known" in comparison.best_withheld["step_time_ms"]
    finding = next(f for f in comparison.findings if f.kind == "step_time")
    assert finding.better is None and "cannot be ranked" in finding.message
    assert FEW_STEPS.format(what="unprofiled timed or analysed") in finding.message \
        or FEW_STEPS.format(what="analysed") in finding.message
    exposed = next(f for f in comparison.findings if f.kind == "exposed_comm")
    assert exposed.better is None and "cannot be ranked" in exposed.message
    assert not any(f.kind == "tradeoff" for f in comparison.findings)
    # two one-step runs alike by construction: every value is the same, nothing to rank, and the findings
    # say the runs are within noise of each other, not that they cannot be ranked
    sc = Scenario(units=make_units(2, numel=1_000_000), root=make_root(), steps=(3,), step_data_ns={},
                  gradients_per_kernel=False)
    runs["again"] = generate_run(sc, tmp_path / "again", run_folder=True)
    alike = _compare(runs, ["one", "again"], result_of)
    assert alike.values["step_time_ms"][0] == alike.values["step_time_ms"][1]
    for kind in ("step_time", "exposed_comm"):
        said = next(f for f in alike.findings if f.kind == kind)
        assert said.better is None and "within noise" in said.message and "cannot be ranked" not in said.message
    # a third run of three steps, 8 ms slower in each: the fastest is held to its spread, and the other
    # one-step run, beside the fastest, is said to be not ranked (neither has a spread)
    sc = Scenario(units=make_units(2, numel=1_000_000), root=make_root(), steps=STEPS,
                  step_data_ns=dict.fromkeys(STEPS, 8_000_000), gradients_per_kernel=False)
    runs["slowest"] = generate_run(sc, tmp_path / "slowest", run_folder=True)
    three = _compare(runs, ["one", "slower", "slowest"], result_of)
    step = next(f for f in three.findings if f.kind == "step_time")
    assert step.better == "one" and "slower takes" in step.message, step.message
    assert "no step-to-step spread known for either, so not ranked" in step.message
