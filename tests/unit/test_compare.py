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
from collections.abc import Callable
from pathlib import Path

import pytest

from fsdpviz.analysis.compare.model import HEADLINE_FIELDS
from fsdpviz.analysis.compare.runs import best_indices, command_args, compare_runs, field_value
from fsdpviz.analysis.pipeline import LabelledRun, RunResult
from fsdpviz.cli import main
from fsdpviz.errors import UsageError

SAMPLES = Path(__file__).resolve().parents[2] / "sample_traces"
FSDP2, FSDP1, ZERO3 = (SAMPLES / n for n in ("fsdp2-cpu-2rank", "fsdp1-cpu-2rank", "zero3-cpu-2rank"))


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
    if min(margins) > 0:  # faster than every other run by more than the step-to-step spreads
        assert result["best"]["step_time_ms"] == [labels[fastest]]
    else:
        assert result["best"]["step_time_ms"] == []
        assert "step-to-step spread" in result["best_withheld"]["step_time_ms"]
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
