"""The notebook API (``fsdpviz.open`` / ``fsdpviz.compare``) against the command line on the same runs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

import fsdpviz
from fsdpviz.cli import main
from fsdpviz.errors import FsdpvizError, UsageError

REPO = Path(__file__).resolve().parents[2]
SAMPLE = REPO / "sample_traces" / "fsdp2-cpu-2rank"
ZERO3 = REPO / "sample_traces" / "zero3-cpu-2rank"


@pytest.fixture(scope="module")
def run() -> fsdpviz.Run:
    return fsdpviz.open(SAMPLE, cache=False)


def _cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> dict:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    out, _ = capsys.readouterr()
    assert exc.value.code in (0, None)
    return json.loads(out)


def test_summary_and_tables_are_the_pipelines(run: fsdpviz.Run, capsys: pytest.CaptureFixture[str]) -> None:
    assert run.summary.to_json() == _cli(["summary", "--json", "--no-cache", str(SAMPLE)], capsys)
    assert list(run.units["unit"]) == ["(root)", "blocks.0", "blocks.1"]
    assert set(run.spans["step"]) == set(run.summary.steps)
    assert sorted(set(run.steps["rank"])) == [0, 1]
    assert {"all_gather", "reduce_scatter"} <= set(run.collectives["comm"].astype(str))
    assert run.label == "fsdp2-cpu-2rank" and "fsdp2, world size 2," in repr(run)  # run.json's world_size


def test_plots_have_a_row_per_rank_and_kind(run: fsdpviz.Run) -> None:
    gantt = run.gantt(ranks=[1])
    data = gantt.dframe()
    steps = run.steps.groupby("step")["step_ns"].median()
    median_step = int((steps - steps.median()).abs().idxmin())
    spans = run.spans[(run.spans["rank"] == 1) & (run.spans["step"] == median_step)
                      & run.spans["kind"].isin(["all_gather", "compute", "reduce_scatter", "all_reduce",
                                                "copy_in", "copy_out"])]
    assert len(data) == len(spans)
    assert set(data["unit"]) == set(spans["unit"].astype(str).replace("", "(optimizer)"))
    assert f"step {median_step}" in gantt.opts.get().kwargs["title"]
    assert len(run.memory_curve()) == 2  # one curve per rank
    bars = run.unit_times().dframe()
    assert set(bars["unit"]) == {"(root)", "blocks.0", "blocks.1"}


def test_whatif_and_compare_are_the_commands(run: fsdpviz.Run, tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    predicted = run.whatif(wrap="merge:2")
    assert predicted.to_json() == _cli(["whatif", str(SAMPLE), "--wrap", "merge:2", "--json", "-q", "--no-cache"],
                                       capsys)
    assert list(predicted.units["name"]) == ["(root)", "[blocks.0, blocks.1]"]
    # every option of the command, --keep-last-units too
    kept = run.whatif(keep_last_units=1, reshard_after_forward="true")
    assert kept.to_json() == _cli(["whatif", str(SAMPLE), "--keep-last-units", "1", "--reshard-after-forward",
                                   "true", "--json", "-q", "--no-cache"], capsys)
    assert kept.to_json()["predicted"]["settings"]["keep_last_units"] == {"value": 1, "source": "given"}
    # a float prefetch as the command reads its number (the notebook turned it into "1.0" first and refused it)
    assert run.whatif(prefetch=1.0).to_json()["predicted"]["settings"]["prefetch"]["value"] == "1"
    assert predicted.page(tmp_path / "w.html").stat().st_size > 100_000
    compared = fsdpviz.compare([run, ZERO3], labels=["fsdp2", "zero3"])
    assert list(compared.headline.columns) == ["fsdp2", "zero3"]
    assert compared.headline.loc["step time", "fsdp2"] == run.summary.step_time_ms
    assert compared.to_json()["runs"][0]["label"] == "fsdp2"
    # the per-unit rows are compare --json's unit groups, with the same stars and spreads
    units, groups = compared.units, compared.to_json()["unit_groups"]
    assert len(units) == sum(len(values) for g in groups for values in g["values"].values())
    for g in groups:
        for label, values in g["values"].items():
            for metric, value in values.items():
                row = units[(units["group"] == g["name"]) & (units["run"] == label) & (units["metric"] == metric)]
                assert len(row) == 1
                got = row["value"].iloc[0]
                assert (value is None and pd.isna(got)) or got == value, (g["name"], label, metric)
                assert bool(row["best"].iloc[0]) == (label in g["best"].get(metric, []))
                assert row["spread_unknown"].iloc[0] == g["spread_unknown"].get(metric, {}).get(label, "")
    # zero3's groups share its buckets: their exposed time and its spread are null, and the row says why
    split = units[(units["run"] == "zero3") & (units["metric"] == "exposed_comm_ms")]
    assert len(split) and split["value"].isna().all() and split["spread_ms"].isna().all()
    assert split["spread_unknown"].str.startswith("its units share collectives (buckets)").all()


def test_errors_are_the_command_lines(run: fsdpviz.Run, tmp_path: Path) -> None:
    with pytest.raises(FsdpvizError, match="no such file or folder"):
        fsdpviz.open(tmp_path / "nothing")
    with pytest.raises(UsageError, match="analysed steps are"):
        run.gantt(step=99)
    with pytest.raises(UsageError, match="at least two runs"):
        fsdpviz.compare([run])
    with pytest.raises(UsageError, match="merge:K"):
        run.whatif(wrap="merge:0")
    # checked as the command checks its options, with its words
    with pytest.raises(UsageError, match="use root"):
        run.whatif(wrap=5)  # type: ignore[arg-type]  # a notebook's slip: the command's line, not an AttributeError
    for given, said in (({"keep_last_units": 0}, "--keep-last-units 0: needs at least 1 unit"),
                        ({"world_size": 0}, "--world-size 0: needs at least 1 rank"),
                        ({"world_size": 2.5}, "--world-size 2.5: needs a whole number"),
                        ({"inter_node_gbps": 0}, "--inter-node-gbps 0: needs a finite bandwidth above 0"),
                        ({"inter_node_gbps": float("inf")}, "--inter-node-gbps inf: needs a finite bandwidth above 0"),
                        ({"reshard_after_forward": 2}, "--reshard-after-forward 2: use true or false"),
                        ({"reshard_after_forward": "maybe"}, "--reshard-after-forward 'maybe': use true or false")):
        with pytest.raises(UsageError) as refused:
            run.whatif(**given)
        assert str(refused.value) == said


def test_importing_fsdpviz_stays_light() -> None:
    code = "import sys, fsdpviz; print(sorted(m for m in ('pandas', 'holoviews', 'torch') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_unknown_memory_categories_are_missing_not_zero() -> None:
    """A plain torch.profiler recording has no measurement of the recorder's: on CPU the sharded
    parameters and the optimizer state made before the trace are unknown -- missing, with why."""
    import pandas as pd

    run = fsdpviz.open(SAMPLE.parent / "fsdp2-cpu-2rank-plain", cache=False)
    why = run.memory_unknown
    assert set(why) == set(run.memory_categories["rank"].unique())
    for rank, unknown in why.items():
        assert {"sharded_params", "optimizer_state"} <= set(unknown)
        assert all("since the trace began" in text for text in unknown.values())
        mine = run.memory_categories[(run.memory_categories["rank"] == rank).to_numpy()]
        assert mine["sharded_params"].isna().all() and mine["optimizer_state"].isna().all()
        assert mine["activations"].notna().all() and (mine["activations"] > 0).any()
    peaks = run.memory_peaks
    assert peaks["sharded_params"].isna().all() and not pd.isna(peaks["activations"]).any()


def test_compare_tells_runs_of_one_name_apart_as_the_command_does(capsys: pytest.CaptureFixture[str]) -> None:
    """Two committed recordings, each in a folder named ``run`` (run.json's label "run" too): the notebook's
    compare names them by their parent folders, as ``fsdpviz compare`` does, rather than refusing them; a
    label given to ``open`` stays; one run given twice with one label is still refused."""
    block, root = (REPO / "tests" / "recorded" / f"fsdp2-d256-{n}" / "run" for n in ("block", "root"))
    runs = [fsdpviz.open(block, cache=False), fsdpviz.open(root, cache=False)]
    assert [r.label for r in runs] == ["run", "run"]
    compared = fsdpviz.compare(runs)
    assert compared.comparison.labels == ["fsdp2-d256-block/run", "fsdp2-d256-root/run"]
    with pytest.raises(SystemExit) as done:
        main(["compare", str(block), str(root), "--json", "--no-cache", "-q"])
    assert done.value.code in (0, None)
    assert json.loads(capsys.readouterr().out)["labels"] == compared.comparison.labels
    named = fsdpviz.open(root, label="root", cache=False)
    assert fsdpviz.compare([runs[0], named]).comparison.labels == ["run", "root"]
    with pytest.raises(UsageError, match="labels must be distinct"):
        fsdpviz.compare([named, named])
