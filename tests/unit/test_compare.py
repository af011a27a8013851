"""``fsdpviz compare`` on the sample recordings: JSON contract, deltas, best marks, notes, errors.

The independent reference is each run's own ``fsdpviz summary --json``: the compare output must carry
exactly those dicts, and its deltas must be their differences. The samples are real 2-rank CPU runs
of the example trainer with different frameworks (FSDP2, FSDP1, ZeRO-3), so the comparison must also
say that they are not like for like.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import shutil
import statistics
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers.rawfiles import timer_step_ms

from fsdpviz.analysis.compare.model import HEADLINE_FIELDS
from fsdpviz.analysis.compare.runs import (
    best_indices,
    command_args,
    compare_runs,
    comparison_json,
    field_value,
)
from fsdpviz.analysis.pipeline import LabelledRun, RunResult
from fsdpviz.cli import main
from fsdpviz.errors import UsageError
from fsdpviz.formatting import bytes_text
from fsdpviz.report.compare.build import load_runs
from fsdpviz.whatif.gains import on_replay_split

SAMPLES = Path(__file__).resolve().parents[2] / "sample_traces"
FSDP2, FSDP1, ZERO3 = (SAMPLES / n for n in ("fsdp2-cpu-2rank", "fsdp1-cpu-2rank", "zero3-cpu-2rank"))
RECORDED = Path(__file__).resolve().parents[1] / "recorded"
D256 = ("block", "pair", "root")  # the committed dim-256 recordings' wraps: tests/recorded/fsdp2-d256-NAME/run


def _run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as done:
        main(list(args))
    out, err = capsys.readouterr()
    return int(done.value.code or 0), out, err


@pytest.fixture(scope="module")
def compared(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, list[dict], Path]:
    """``compare --json -o page`` and ``summary --json`` of each sample, once for the module (a module
    fixture cannot use capsys, so stdout is redirected)."""
    out_dir = tmp_path_factory.mktemp("compare")
    page = out_dir / "compare.html"

    def call(*args: str) -> str:
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf), pytest.raises(SystemExit) as done:
            main(list(args))
        assert done.value.code == 0
        return buf.getvalue()

    result = json.loads(call("compare", str(FSDP2), str(FSDP1), str(ZERO3), "--json", "--no-cache", "-q",
                             "-o", str(page)))
    summaries = [json.loads(call("summary", str(p), "--json", "--no-cache")) for p in (FSDP2, FSDP1, ZERO3)]
    return result, summaries, page


@pytest.fixture(scope="module")
def d256() -> dict[str, LabelledRun]:
    """The committed dim-256 recordings (block, pair, root units), labelled by their wrap, loaded and
    analysed once for the module as ``fsdpviz compare`` prepares its runs: ``load_runs``, then each run on
    its clock (``on_replay_split``). ``compare_runs`` only reads them, so every comparison of them below
    starts from the state the command's would."""
    runs = load_runs([RECORDED / f"fsdp2-d256-{name}" / "run" for name in D256], list(D256), cache=False)
    for run in runs:
        on_replay_split(run.result)
    return {run.label: run for run in runs}


@pytest.fixture(scope="module")
def d256_compared(d256: dict[str, LabelledRun]) -> Callable[..., dict]:
    """``d256_compared(*labels)``: what ``fsdpviz compare --json`` prints for those dim-256 runs, in that
    order, each labelled by its wrap (``comparison_json`` of ``compare_runs``, through JSON as the command
    writes it), computed once per list of runs for the module and a fresh dict for each caller. The one
    thing the command adds after comparing, each run's actions' predicted gains and clock (its completed
    summary), is left as the summary has it: no test of these runs reads it, and completing it would move
    the shared runs' state (``completed_summary``) under the comparisons that follow."""
    done: dict[tuple[str, ...], str] = {}

    def json_of(*labels: str) -> dict:
        if labels not in done:
            done[labels] = json.dumps(comparison_json(compare_runs([d256[label] for label in labels])))
        return dict(json.loads(done[labels]))

    return json_of


def test_runs_are_the_individual_summaries(compared) -> None:
    result, summaries, page = compared
    assert result["labels"] == ["fsdp2-cpu-2rank", "fsdp1-cpu-2rank", "zero3-cpu-2rank"]  # run.json labels
    assert len(result["runs"]) == 3
    for run, summary, label in zip(result["runs"], summaries, result["labels"]):
        assert run.pop("label") == label
        assert run == summary
    assert page.stat().st_size > 100_000


def test_deltas_are_differences_of_the_summaries(compared) -> None:
    result, summaries, _ = compared
    base = summaries[0]
    checked = 0
    for field in (f for f in HEADLINE_FIELDS if f.in_summary):
        for i, summary in enumerate(summaries):
            a, b = field_value(summary, field.key), field_value(base, field.key)
            got = result["deltas"][field.key][i]
            if a is None or b is None:
                assert got is None
                continue
            assert got == pytest.approx(a - b, abs=1e-9), field.key
            checked += 1
    assert checked >= 20
    # Hand-checked keys of the contract, read straight from the summaries.
    assert result["deltas"]["step_time_ms"][1] == pytest.approx(summaries[1]["step_time_ms"] - base["step_time_ms"])
    assert result["deltas"]["n_units"] == [0, 0, len(summaries[2]["units"]) - 3]
    # The one row the comparison measures itself (memory a step adds) has its deltas too.
    rise = result["step_rise_bytes"]
    assert all(isinstance(r, int) and r > 0 for r in rise)
    assert result["deltas"]["step_rise_bytes"] == [r - rise[0] for r in rise]


def test_best_marks_are_the_extremes(compared) -> None:
    result, summaries, _ = compared
    labels = result["labels"]
    step = [s["step_time_ms"] for s in summaries]
    spread = result["spread_ms"]["step_time_ms"]
    fastest = step.index(min(step))
    margins = [abs(v - step[fastest]) - max(spread[fastest], spread[i]) for i, v in enumerate(step) if i != fastest]
    finding = next(f for f in result["findings"] if f["kind"] == "step_time")
    # faster than every other run by more than the step-to-step spreads, and beyond the noise the finding reads
    if min(margins) > 0 and finding["better"] == labels[fastest]:
        assert result["best"]["step_time_ms"] == [labels[fastest]]
    else:
        assert result["best"]["step_time_ms"] == []
        withheld = result["best_withheld"]["step_time_ms"]
        assert "step-to-step spread" in withheld or "within noise" in withheld, withheld
    overlap = [s["overlap"]["overlap_pct"] for s in summaries]
    points = result["spread_points"]["overlap.overlap_pct"]
    most = overlap.index(max(overlap))
    margins = [overlap[most] - v - max(points[most], points[i]) for i, v in enumerate(overlap) if i != most]
    if min(margins) > 0:  # more overlap than every other run by more than the step-to-step spreads
        assert result["best"]["overlap.overlap_pct"] == [labels[most]]
    else:
        assert result["best"]["overlap.overlap_pct"] == []
        assert "step-to-step spread" in result["best_withheld"]["overlap.overlap_pct"]
    peak = [s["memory"]["peak_allocated_bytes"] for s in summaries]

    def clear(values: list[int]) -> bool:  # the lowest below every other by more than the memory finding's 2 %
        low = min(values)
        return all(v - low > 0.02 * v for v in values if v != low)

    if any(d is not None for d in result["memory_drift_bytes"]):  # a run's level drifts: peaks not ranked
        assert result["best"]["memory.peak_allocated_bytes"] == []
        assert "drifts" in result["best_withheld"]["memory.peak_allocated_bytes"]
    elif clear(peak):
        assert result["best"]["memory.peak_allocated_bytes"] == [labels[i] for i, p in enumerate(peak) if p == min(peak)]
    else:
        assert result["best"]["memory.peak_allocated_bytes"] == []
        assert "within 2%" in result["best_withheld"]["memory.peak_allocated_bytes"]
    rise = result["step_rise_bytes"]
    assert result["best"]["step_rise_bytes"] == ([labels[i] for i, r in enumerate(rise) if r == min(rise)]
                                                 if clear(rise) else [])
    assert result["best"]["world_size"] == []  # no better direction
    assert result["best"]["n_units"] == []


def test_a_drift_that_cannot_be_told_is_said_not_left_null(compared, tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    # the three samples analyse several steps with allocator samples: a null drift there is "does not drift"
    result, summaries, _ = compared
    assert all(len(s["steps"]) >= 2 for s in summaries) and result["memory_drift_unknown"] == {}
    # the plain sample analyses one step (its summary's steps): whether its level drifts cannot be told
    plain = SAMPLES / "fsdp2-cpu-2rank-plain"
    code, out, _ = _run(capsys, "compare", str(FSDP2), str(plain), "--json", "--no-cache", "-q")
    assert code == 0
    both = json.loads(out)
    (one,) = [r for r in both["runs"] if len(r["steps"]) < 2]
    assert both["memory_drift_bytes"][both["labels"].index(one["label"])] is None
    assert list(both["memory_drift_unknown"]) == [one["label"]]
    assert both["memory_drift_unknown"][one["label"]].startswith("fewer than two analysed steps")
    assert f"{one['label']}: whether its allocated level at step start climbs from step to step cannot be told" \
        in " ".join(both["notes"])
    # the plain sample's traces recorded no command: its set-up row says so, not "(same)"
    code, out, _ = _run(capsys, "compare", str(FSDP2), str(plain), "--no-cache", "-q", "-o", str(tmp_path / "c.html"))
    said = " ".join(out.split())
    assert code == 0 and "command (what differs): fsdp2-cpu-2rank " in said
    assert f"; {one['label']} n/a" in said.split("command (what differs):", 1)[1].split(" note:")[0]


def test_the_terminal_says_how_the_runs_were_set_up_where_they_differ(tmp_path: Path,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    kept, dropped = (RECORDED / name / "run" for name in ("grad-accum-fsdp2", "grad-accum-fsdp2-no-reshard-after-forward"))
    # what each run's FSDP2 did, as run.json has it (read after the first step)
    resharded = {p: {u["unit"]: u["reshard_after_forward"] for u in json.loads((p / "run.json").read_text())["units"]}
                 for p in (kept, dropped)}
    assert resharded[kept] == {"(root)": False, "blocks.0": True, "blocks.1": True}
    assert set(resharded[dropped].values()) == {False}
    code, out, _ = _run(capsys, "compare", str(kept), str(dropped), "--label", "kept", "--label", "dropped",
                        "-q", "--no-cache", "-o", str(tmp_path / "c.html"))
    assert code == 0
    said = " ".join(out.split("set up differently (the page lists every setting):", 1)[1].split())
    assert said.startswith("reshard after forward: kept 2 of 3 units (not (root)); dropped no (every unit)")
    # and why the run that keeps its units gathered peaks higher: at its peak it holds every unit's
    # parameters unsharded (run.json's sizes), where the other holds the root's and one block's
    sizes = {u["unit"]: u["param_bytes"] for u in json.loads((dropped / "run.json").read_text())["units"]}
    every, root_and_block = sum(sizes.values()), sizes["(root)"] + sizes["blocks.0"]
    assert (f"at the peaks, dropped holds {bytes_text(every - root_and_block)} more unsharded parameters "
            f"({bytes_text(every)} against {bytes_text(root_and_block)} in kept)") in said
    # runs set up alike: nothing to say
    code, out, _ = _run(capsys, "compare", str(kept), str(kept), "-q", "--no-cache", "-o", str(tmp_path / "d.html"))
    assert code == 0 and "set up differently" not in out


def test_units_are_matched_across_frameworks_and_the_mismatch_is_noted(compared) -> None:
    result, summaries, _ = compared
    groups = {g["name"]: g for g in result["unit_groups"]}
    assert list(groups) == ["(root)", "blocks.0", "blocks.1"]
    # ZeRO-3 fetches block submodules on their own; its run.json gives their parent block, itself a
    # unit without parameters (its own code between them).
    assert groups["blocks.0"]["members"]["zero3-cpu-2rank"] == [
        u["name"] for u in summaries[2]["units"] if u["name"] == "blocks.0" or u["name"].startswith("blocks.0.")]
    assert groups["blocks.1"]["members"]["fsdp2-cpu-2rank"] == ["blocks.1"]
    # The same model: every group holds the same parameter bytes in every run.
    for g in groups.values():
        assert len(set(g["param_bytes"].values())) == 1, g["name"]
    assert any(n.startswith("Frameworks differ: fsdp2-cpu-2rank fsdp2, fsdp1-cpu-2rank fsdp1, zero3-cpu-2rank zero3")
               for n in result["notes"])
    kinds = {f["kind"] for f in result["findings"]}
    assert {"step_time", "exposed_comm", "memory"} <= kinds


def test_a_group_that_holds_part_of_a_bucket_has_no_exposed_time_of_its_own(compared) -> None:
    """ZeRO-3 reduces and gathers in buckets: the sample's `fsdpviz::reduce_scatter (...)` and
    `fsdpviz::all_gather (...)` ranges each name units of every block (read from the trace file), and a
    bucket's exposed time counts for the one unit that waited on it (tok_emb: its summary's exposed time
    exceeds its own collectives). So no unit group of the ZeRO-3 run has an exposed figure of its own, and
    compare neither shows one (the old table gave blocks.1 0 ms and starred it) nor names the run in its
    findings; the FSDP runs' groups keep theirs, summed from their summaries."""
    from helpers.rawfiles import trace_events

    result, summaries, _ = compared
    path = ZERO3 / "traces" / "rank0.trace.json.gz"
    buckets = [set(e["name"].split(" (", 1)[1].rstrip(")").split(", ")) for e in trace_events(path)
               if e.get("name", "").startswith(("fsdpviz::reduce_scatter (", "fsdpviz::all_gather ("))]
    groups = {g["name"]: g for g in result["unit_groups"]}
    for name, g in groups.items():
        members = set(g["members"]["zero3-cpu-2rank"])
        assert any(b & members and not b <= members for b in buckets), name  # the trace: part of a bucket
        values = g["values"]["zero3-cpu-2rank"]
        assert values["exposed_comm_ms"] is None and values["exposed_reduce_scatter_ms"] is None, name
        assert values["reduce_scatter_ms"] is not None  # its own share of the collectives stays
        assert "zero3-cpu-2rank" not in g["best"].get("exposed_comm_ms", [])
        # nor a spread beside the null: a second figure of what it does not have; the reason instead
        assert g["spread_ms"]["exposed_comm_ms"]["zero3-cpu-2rank"] is None
        assert g["spread_unknown"]["exposed_comm_ms"]["zero3-cpu-2rank"].startswith("its units share collectives")
        for label, summary in zip(("fsdp2-cpu-2rank", "fsdp1-cpu-2rank"), summaries):
            own = [u["exposed_comm_ms"] for u in summary["units"] if u["name"] in g["members"][label]]
            assert g["values"][label]["exposed_comm_ms"] == pytest.approx(sum(own), abs=0.001)
    (unit_group,) = [f for f in result["findings"] if f["kind"] == "unit_group"]
    assert "zero3-cpu-2rank" not in unit_group["message"]
    # the group it names beats the other run beyond the row's spreads: the row's star and the finding agree
    named = groups[unit_group["values"]["group"]["name"]]
    assert unit_group["better"] is not None and named["best"]["exposed_comm_ms"] == [unit_group["better"]]
    assert "not ranked" not in unit_group["message"]
    assert any(n.startswith("zero3-cpu-2rank: its collectives carry several units at once (buckets)")
               and n.endswith(": (root), blocks.0, blocks.1.") for n in result["notes"])


def test_best_indices_ties_and_missing_values() -> None:
    assert best_indices([3.0, 1.0, 1.0, None], "lower") == [1, 2]
    assert best_indices([3.0, 1.0], "higher") == [0]
    assert best_indices([2.0, 2.0], "lower") == []  # all equal: nothing to mark
    assert best_indices([2.0, None], "lower") == []
    assert best_indices([1.0, 2.0], None) == []


def test_command_args_drop_launcher_noise() -> None:
    cmd = ["python", "-m", "torch.distributed.run", "--master_port", "4242", "--nproc_per_node", "2",
           "train.py", "--wrap", "pair", "--rdzv-endpoint=host:29400"]
    assert command_args(cmd) == ["python", "-m torch.distributed.run", "--nproc_per_node 2", "train.py",
                                 "--wrap pair"]


def test_compare_runs_needs_two_distinct_labels(sample_run: Callable[[str], RunResult]) -> None:
    result = sample_run(FSDP2.name)
    with pytest.raises(UsageError, match="at least two"):
        compare_runs([LabelledRun(label="a", source="a", result=result)])
    with pytest.raises(UsageError, match="must differ"):
        compare_runs([LabelledRun(label="a", source="a", result=result), LabelledRun(label="a", source="b", result=result)])


def test_one_run_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _run(capsys, "compare", str(FSDP2))
    assert code == 2 and out == ""
    assert err == "error: compare needs at least two runs, got 1\n"


def test_label_count_mismatch_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _run(capsys, "compare", str(FSDP2), str(FSDP1), "--label", "only-one")
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("error: got 1 --label value(s) for 2 runs")


def test_missing_run_is_named(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    missing = tmp_path / "no-such-run"
    code, _, err = _run(capsys, "compare", str(FSDP2), str(missing), "--json", "-q")
    assert code == 2
    assert err == f"error: {missing}: no such file or folder\n"
    # said before the run ahead of it is loaded: its progress line never comes
    code, _, err = _run(capsys, "compare", str(FSDP2), str(missing), "--json")
    assert code == 2 and err == f"error: {missing}: no such file or folder\n"


def test_broken_run_is_named(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    (broken / "traces").mkdir(parents=True)
    (broken / "run.json").write_text('{"format": 1')
    code, _, err = _run(capsys, "compare", str(broken), str(FSDP2), "--json", "-q")
    assert code == 2
    assert err.startswith(f"error: {broken}") and err.count("\n") == 1
    assert "Traceback" not in err


def test_output_folder_must_exist(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    target = tmp_path / "nope" / "page.html"
    code, _, err = _run(capsys, "compare", str(FSDP2), str(FSDP1), "-o", str(target))
    assert code == 2 and str(target) in err


def _timers_clean_ms(folder: Path) -> list[float]:
    """A sample's clean steps from its raw timer files: per step after the one that follows the trace,
    the median over ranks of the recorder's wall clock."""
    last = max(json.loads((folder / "run.json").read_text())["profile"]["steps"]) + 1
    walls = [timer_step_ms(p) for p in sorted((folder / "timers").glob("rank*.jsonl"))]
    steps = sorted(set.intersection(*({s for s in w if s > last} for w in walls)))
    return [statistics.median(w[s] for w in walls) for s in steps]


def _timers_spread_ms(folder: Path) -> float:
    """A sample's step-to-step spread from its raw timer files: its clean steps' highest minus lowest."""
    per_step = _timers_clean_ms(folder)
    return max(per_step) - min(per_step)


def test_the_step_finding_says_which_test_kept_the_runs_apart(compared) -> None:
    """The bundled FSDP1 and FSDP2 samples' steps are further apart than the noise between them (2
    standard errors, 5 % of the larger) but not than FSDP2's step-to-step spread: the finding names no
    winner and says so, with the spread its timers give, instead of calling the difference noise."""
    result, summaries, _ = compared
    finding = next(f for f in result["findings"] if f["kind"] == "step_time")
    step = dict(zip(result["labels"], (s["step_time_ms"] for s in summaries)))
    apart = step["fsdp2-cpu-2rank"] - step["fsdp1-cpu-2rank"]
    assert min(step.values()) == step["fsdp1-cpu-2rank"] and max(step.values()) == step["fsdp2-cpu-2rank"]
    noise = re.search(r"noise between the fastest and slowest \(2 standard errors\): ([\d.]+) ms", finding["evidence"])
    assert noise and apart > max(float(noise[1]), 0.05 * step["fsdp2-cpu-2rank"])  # beyond the noise
    # the noise of the step times compared, the timers' clean steps, not of the profiled steps beside them
    errors = [statistics.stdev(ms) / len(ms) ** 0.5 for ms in map(_timers_clean_ms, (FSDP2, FSDP1))]
    assert float(noise[1]) == pytest.approx(2 * (errors[0] ** 2 + errors[1] ** 2) ** 0.5, abs=0.01)
    said = re.search(r"within the runs' step-to-step spread: ([\d.]+) ms apart, no more than ([\d.]+) ms",
                     finding["message"])
    assert said and finding["better"] is None, finding["message"]
    assert float(said[1]) == pytest.approx(apart, abs=0.01)
    spread = max(_timers_spread_ms(FSDP2), _timers_spread_ms(FSDP1))
    assert float(said[2]) == pytest.approx(spread, abs=0.01) and apart <= spread
    assert "within noise" not in finding["message"]


def test_runs_on_two_clocks_and_two_levels_are_not_ranked_on_them(tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """The bundled FSDP2 sample (recorded by fsdpviz: timers, and what it measured alive when the trace
    began) beside the same program under a plain torch.profiler (no timers, no measurement). Its step
    time is the timers' clean steps, the plain run's as traced: a difference the profiler makes as much
    as the runs. Its level adds the bytes run.json says it measured, the plain run's cannot. Neither
    difference gets a best mark or a winner; each is said, with the traced steps both runs have."""
    plain = SAMPLES / "fsdp2-cpu-2rank-plain"
    code, out, _ = _run(capsys, "compare", str(FSDP2), str(plain), "--json", "--no-cache", "-q")
    assert code == 0
    result = json.loads(out)
    runs = {lb: r for lb, r in zip(result["labels"], result["runs"])}
    fsdp2, bare = runs["fsdp2-cpu-2rank"], runs[result["labels"][1]]
    assert (fsdp2["step_time_source"], bare["step_time_source"]) == ("timers", "trace")
    assert not (plain / "timers").exists() and (FSDP2 / "timers").is_dir()
    for key in ("step_time_ms", "overlap.exposed_comm_ms", "overlap.comm_ms", "overlap.fsdp_overhead_ms"):
        assert result["best"][key] == [] and "different clocks" in result["best_withheld"][key], key
    assert "overlap.compute_ms" not in result["best_withheld"]  # no better direction: never marked anyway
    step = next(f for f in result["findings"] if f["kind"] == "step_time")
    assert step["better"] is None and "not ranked" in step["message"]
    assert f"{fsdp2['traced_step_time_ms']:.2f} ms" in step["message"] and f"{bare['traced_step_time_ms']:.2f} ms" in step["message"]
    # what the recorder measured alive when the trace began (run.json: the sharded parameters, the
    # optimizer's state and any gradients kept, the highest over ranks) is in one level and not the other
    measured = max(r["memory"]["trace_start"]["sharded_param_bytes"] + r["memory"]["trace_start"]["optimizer_state_bytes"]
                   + r["memory"]["trace_start"]["gradient_bytes_kept"]
                   for r in json.loads((FSDP2 / "run.json").read_text())["ranks"])
    assert fsdp2["memory"]["baseline_bytes"] == measured
    assert result["best"]["memory.peak_allocated_bytes"] == []
    withheld = result["best_withheld"]["memory.peak_allocated_bytes"]
    assert "count different things" in withheld and bytes_text(measured) in withheld, withheld
    memory = next(f for f in result["findings"] if f["kind"] == "memory")
    assert memory["better"] is None and "not ranked" in memory["message"] and "activations" not in memory["message"]
    assert any(n.startswith("Clocks differ") for n in result["notes"])
    assert any(n.startswith("Memory levels differ") for n in result["notes"])
    for group in result["unit_groups"]:
        assert all(not marks for marks in group["best"].values()), group["best"]
        assert all("different clocks" in why for metric, why in group["best_withheld"].items()
                   if metric.endswith("_ms")), group["best_withheld"]


def test_the_exposed_communication_finding_says_the_run_it_does_not_lead_with(
        d256_compared: Callable[..., dict]) -> None:
    """Three committed recordings of the dim-256 example (block, pair, root units): the exposed
    communication finding leads with the least and the most, and says the third run against the least,
    by the same tests the table's star reads (the noise, then the step-to-step spread), so a reader of the
    sentence and of the table sees one verdict; the unit group that differs most is said not to rank where
    its row's spreads hold the gap. Its figures are the table's."""
    result = d256_compared("block", "pair", "root")
    values = {lb: r["overlap"]["exposed_comm_ms"] for lb, r in zip(result["labels"], result["runs"])}
    finding = next(f for f in result["findings"] if f["kind"] == "exposed_comm")
    least = min(values, key=values.__getitem__)
    most = max(values, key=values.__getitem__)
    (third,) = set(values) - {least, most}
    # which verdict the copies give hangs on the spread their steps were recorded with; either way the
    # sentence and the table's star are one verdict
    if finding["message"].startswith("Exposed communication is not told apart"):
        assert result["best"]["overlap.exposed_comm_ms"] == [] and finding["better"] is None
        assert f"({values[least]:.2f} ms to {values[most]:.2f} ms per step)" in finding["message"]
    else:
        _says_the_third_run(finding, values, least, most, third, result)
    # the unit group that differs most: where its gap lies within the group row's own spreads the row has
    # no star, and the finding names no better run and gives the table's reason; else both name one
    (unit_group,) = [f for f in result["findings"] if f["kind"] == "unit_group"]
    group = next(g for g in result["unit_groups"] if g["name"] == unit_group["values"]["group"]["name"])
    pair = unit_group["values"]["exposed_comm_ms"]
    gap = max(pair.values()) - min(pair.values())
    assert (group["best"]["exposed_comm_ms"] == []) == (unit_group["better"] is None)
    if gap <= max(group["spread_ms"]["exposed_comm_ms"][lb] for lb in pair):
        assert group["best"]["exposed_comm_ms"] == [] and unit_group["better"] is None
        assert unit_group["message"].endswith(f"; not ranked: {group['best_withheld']['exposed_comm_ms']}.")


def _says_the_third_run(finding: dict, values: dict[str, float], least: str, most: str, third: str,
                        result: dict) -> None:
    assert finding["message"].startswith(f"{least} exposes the least communication: {values[least]:.2f} ms per step, "
                                         f"against {values[most]:.2f} ms in {most}")
    said = re.search(rf"Also, {third} exposes ([\d.]+) ms \(([\d.]+) ms more than {least}, ([^)]*)\)\.",
                     finding["message"])
    assert said, finding["message"]
    assert float(said[1]) == pytest.approx(values[third], abs=0.006)
    assert float(said[2]) == pytest.approx(values[third] - values[least], abs=0.011)
    # one verdict in both views: the table stars the least only where it beats every other run, so the
    # third run's sentence calls it a clear difference exactly where the star is given
    starred = result["best"]["overlap.exposed_comm_ms"] == [least]
    assert said[3].startswith("a clear difference") == starred, (said[3], result["best_withheld"])
    assert said[3].startswith(("a clear difference", "within noise", "within the runs' step-to-step spread"))


def test_a_run_on_another_clock_is_left_out_of_the_ranking_of_the_others(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], d256: dict[str, LabelledRun]) -> None:
    """Three committed recordings of the dim-256 example (block, pair, root units), the root one's timer
    lines of its steady steps (7 on) cut away, as a run stopped early leaves them: its step falls back to
    the trace's clock while the others keep their timers'. A traced figure holds the profiler's cost and a
    timer's does not, so the time figures are ranked between block and pair alone, as if root were not
    there, and root is named as not ranked, with its own summary's reason; no trade-off weighs its step
    against theirs."""
    folders = {}
    for name in D256:
        folders[name] = tmp_path / name
        shutil.copytree(RECORDED / f"fsdp2-d256-{name}" / "run", folders[name], ignore=shutil.ignore_patterns(".fsdpviz-cache"))
    for timers in (folders["root"] / "timers").glob("rank*.jsonl"):
        kept = [line for line in timers.read_text().splitlines() if json.loads(line)["step"] < 7]
        timers.write_text("\n".join(kept) + "\n")
    code, out, _ = _run(capsys, "compare", *(str(f) for f in folders.values()), "--label", "block", "--label", "pair",
                        "--label", "root", "--json", "--no-cache", "-q")
    assert code == 0
    result = json.loads(out)
    assert [r["step_time_source"] for r in result["runs"]] == ["timers", "timers", "trace"]
    # block and pair were copied unchanged: the module's analyses of the recordings are theirs
    alone = compare_runs([d256["block"], d256["pair"]])
    for field in HEADLINE_FIELDS:
        if field.unit != "ms":
            continue
        # root never holds a best mark of a time row, and block against pair is marked as without root
        assert "root" not in result["best"][field.key], field.key
        assert [alone.labels[i] for i in alone.best[field.key]] == result["best"][field.key], field.key
    assert result["ranked_on_one_clock"] == ["block", "pair"]
    note = next(n for n in result["notes"] if n.startswith("Clocks differ"))
    root_summary = next(r for r in result["runs"] if r["label"] == "root")
    own = next(n for n in root_summary["notes"] if "timed" in n and "clean unprofiled step" in n)
    assert own.removeprefix("the step time is the traced one: ") in note and "root is not ranked" in note
    for finding in result["findings"]:
        if finding["kind"] == "tradeoff":  # between block and pair alone; root only named as not ranked
            weighed = finding["message"].split(" root is not ranked: on another clock than the others")[0]
            assert "root" not in weighed, finding["message"]
        if finding["kind"] in ("step_time", "exposed_comm"):
            assert finding["better"] in (None, "block", "pair")
            assert finding["message"].endswith("root is not ranked: on another clock than the others (the notes say why).")


def test_the_memory_finding_gives_the_measured_difference_alone(d256_compared: Callable[..., dict]) -> None:
    """The committed dim-256 block and root recordings: root peaks higher, in line with its one unit. The
    finding's sentence gives the measured figures only (the two peaks, their difference, the largest unit's
    parameters from run.json): the ZeRO arithmetic's estimate of the two peaks, which holds the two largest
    units unsharded at once, is a second figure for the same difference (on the shared H200 model B, 508.54
    MiB against 312.68 measured and 313.8 from fsdpviz whatif), so it stays in the evidence, named as what it is."""
    result = d256_compared("block", "root")
    finding = next(f for f in result["findings"] if f["kind"] == "memory")
    peaks = finding["values"]["peak_allocated_bytes"]
    assert finding["better"] == "block" and peaks["root"] > peaks["block"]
    units = json.loads((RECORDED / "fsdp2-d256-root" / "run" / "run.json").read_text())["units"]
    root_params = sum(u["param_bytes"] for u in units)
    measured = {bytes_text(peaks["block"]), bytes_text(peaks["root"] - peaks["block"]), bytes_text(root_params)}
    said = set(re.findall(r"[\d.,]+ [KMG]iB", finding["message"]))
    assert said and said <= measured, (said, measured)
    assert "In line with the unit sizes: root is one unit" in finding["message"]
    estimate = finding["values"]["model_peak_bytes"]
    assert f"not fsdpviz whatif's prediction): block {bytes_text(estimate['block'])}" in finding["evidence"]


@pytest.mark.parametrize("names", [("pair", "root"), ("block", "root"), ("block", "pair")])
def test_a_time_row_stars_the_run_its_finding_names(names: tuple[str, str], d256_compared: Callable[..., dict]) -> None:
    """The table's star and the finding of the same row are one verdict: a star where the finding names a
    winner (the same run), none where it names none, and then the same reason (the dim-256 recordings: the
    pair against root had root starred on a step its finding called within noise, 40.2 ms against 41.1)."""
    result = d256_compared(*names)
    for kind, key in (("step_time", "step_time_ms"), ("exposed_comm", "overlap.exposed_comm_ms")):
        finding = next(f for f in result["findings"] if f["kind"] == kind)
        assert result["best"][key] == ([finding["better"]] if finding["better"] else []), (key, finding["message"])
        if finding["better"] is None and "within noise" in finding["message"]:
            assert "within noise" in result["best_withheld"][key], result["best_withheld"][key]


def test_the_terminal_says_the_findings_the_json_holds(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """``fsdpviz compare`` in the terminal prints, after its tables, every finding's sentence as
    ``--json`` gives it (they had been on the page and in the JSON only)."""
    monkeypatch.setenv("COLUMNS", "1000")  # one line per sentence, as written
    code, out, _ = _run(capsys, "compare", str(FSDP2), str(FSDP1), "--json", "--no-cache", "-q")
    assert code == 0
    findings = json.loads(out)["findings"]
    assert findings
    code, out, _ = _run(capsys, "compare", str(FSDP2), str(FSDP1), "--no-cache", "-q", "-o", str(tmp_path / "c.html"))
    assert code == 0
    lines = [line.strip() for line in out.splitlines()]
    start = lines.index("findings (what differs between the runs, and why as far as the traces show)")
    assert lines[start + 1:start + 1 + len(findings)] == [f["message"] for f in findings]


def test_a_unit_that_ran_nothing_of_its_own_leaves_its_groups_figures(capsys: pytest.CaptureFixture[str]) -> None:
    """ZeRO-3's root around an ``nn.Sequential`` holds no parameter of its own and ran nothing outside its
    submodules (run.json: 0 elements; the summary lists no entry for it). A group holding it had none of
    its figures to add up, and every sum of the group read as unknown (the first block's row was blank).
    Each group carries its units' summary figures, and its bytes are run.json's elements at 4 bytes each."""
    run = RECORDED / "zero3-master-copy" / "run"
    numel = {u["unit"]: u["param_numel"] for u in json.loads((run / "run.json").read_text())["units"]}
    assert numel["(root)"] == 0
    code, out, err = _run(capsys, "compare", str(run), str(run), "--label", "a", "--label", "b", "--json", "-q")
    assert code == 0, err
    result = json.loads(out)
    summary = {u["name"]: u for u in result["runs"][0]["units"]}
    assert "(root)" not in summary  # and the summary says why
    assert any(n.startswith("(root) ran nothing of its own") for n in result["runs"][0]["notes"])
    groups = result["unit_groups"]
    assert [g["members"]["a"] for g in groups] == [[n] for n in numel if n != "(root)"]
    for g in groups:
        (unit,) = g["members"]["a"]
        values = g["values"]["a"]
        assert values["param_bytes"] == g["param_bytes"]["a"] == 4 * numel[unit]
        for metric in ("all_gather_ms", "forward_ms", "backward_ms", "reduce_scatter_ms", "peak_allocated_bytes"):
            assert values[metric] is not None and values[metric] == summary[unit][metric], (unit, metric)


def test_one_folder_given_twice_is_said_to_be_one(tmp_path: Path) -> None:
    """The same folder twice (once through a link, once as its traces/ folder) compares a run with itself:
    the notes say so, with the labels it got; two different folders get no such note."""
    link = tmp_path / "again"
    link.symlink_to(SAMPLES / "fsdp2-cpu-2rank", target_is_directory=True)
    same = compare_runs(load_runs([SAMPLES / "fsdp2-cpu-2rank", link], ["a", "b"], cache=False))
    assert "a and b are one recording, given 2 times: they compare the run with itself, so they agree to the figure." \
        in same.notes
    # a run folder and its traces/ folder read the same trace files
    inner = compare_runs(load_runs([SAMPLES / "fsdp2-cpu-2rank", SAMPLES / "fsdp2-cpu-2rank" / "traces"], ["a", "b"],
                                   cache=False))
    assert any(n.startswith("a and b are one recording, given 2 times") for n in inner.notes), inner.notes
    other = compare_runs(load_runs([SAMPLES / "fsdp2-cpu-2rank", SAMPLES / "fsdp1-cpu-2rank"], ["a", "b"], cache=False))
    assert not any("one recording" in n for n in other.notes)
