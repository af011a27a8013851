"""``fsdpviz export``: the analysis tables as Parquet / CSV files, on a synthetic FSDP2 GPU run."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from synth import Scenario, generate_run, make_root, make_units

from fsdpviz.cli import main
from fsdpviz.commands.export import TABLE_TIMES
from fsdpviz.trace import schema

TABLES = ("spans", "units", "unit_steps", "memory", "memory_peaks", "steps", "findings", "clock", "skew")


def _run_cli(*argv: str) -> int:
    with pytest.raises(SystemExit) as done:
        main(list(argv))
    return int(done.value.code or 0)


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory):
    sc = Scenario(units=make_units(3), root=make_root(), world_size=2, steps=(3, 4, 5),
                  clock_offset_ns={1: 1_000_000_000})
    return generate_run(sc, tmp_path_factory.mktemp("run"), run_folder=True)


@pytest.mark.parametrize("fmt", ["parquet", "csv"])
def test_export_writes_every_table(run, tmp_path, fmt: str, capsys) -> None:
    out = tmp_path / "tables"
    assert _run_cli("export", str(run.folder), "--format", fmt, "-o", str(out), "--no-cache") == 0
    read = pd.read_parquet if fmt == "parquet" else pd.read_csv
    frames = {name: read(out / f"{name}.{fmt}") for name in TABLES}
    manifest = json.loads((out / "export.json").read_text())
    # a run folder of fsdpviz's schedule whose last step's kernels are all in the trace: every step analysed
    assert manifest["framework"] == "fsdp2" and manifest["steps"] == [3, 4, 5]
    assert {k: v["rows"] for k, v in manifest["files"].items()} == {k: len(f) for k, f in frames.items()}
    assert list(frames["spans"].columns) == list(schema.SPANS)
    assert list(frames["steps"].columns) == list(schema.STEP_TIMES)
    # spans carry the model's times, on rank 0's clock (rank 1's clock ran 1 s ahead)
    want = run.expected.spans
    want = want[want["step"].isin([3, 4, 5])]
    key = ["rank", "step", "unit", "phase", "kind", "lane", "start_ns"]
    spans = frames["spans"].assign(unit=frames["spans"]["unit"].fillna(""))  # CSV reads "" back as NaN
    merged = spans.merge(want, on=key, how="outer", indicator=True, suffixes=("", "_want"))
    assert (merged["_merge"] == "both").all() and (merged["end_ns"] == merged["end_ns_want"]).all()
    units = frames["units"].set_index("unit")
    assert units.loc["blocks.1", "param_numel"] == run.scenario.units[1].numel  # from run.json
    assert frames["memory"]["rank"].nunique() == 2 and len(frames["memory"]) > len(frames["memory_peaks"])
    assert "spans" in capsys.readouterr().out


def test_export_refuses_a_file_as_output(run, tmp_path, capsys) -> None:
    target = tmp_path / "file"
    target.write_text("x")
    assert _run_cli("export", str(run.folder), "-o", str(target)) == 2
    assert "exists and is not a folder" in capsys.readouterr().err
    assert _run_cli("export", str(run.folder), "--format", "xml", "-o", str(tmp_path / "x")) == 2


def _units_on_the_summarys_clock(folder, out, capsys) -> tuple[dict, dict]:
    """Export ``folder`` as CSV into ``out`` and hold the exported units and findings to its summary by
    the scales export.json gives; (export.json, the summary)."""
    assert _run_cli("export", str(folder), "--format", "csv", "-o", str(out), "--no-cache", "-q") == 0
    capsys.readouterr()
    assert _run_cli("summary", str(folder), "--json", "--no-cache", "-q") == 0
    summary = json.loads(capsys.readouterr().out)
    manifest = json.loads((out / "export.json").read_text())
    times = manifest["times"]
    assert set(times) == set(TABLES) == set(TABLE_TIMES)  # every table written says its clock
    assert times["findings"].startswith("the run's clock") and times["units"].startswith("traced")
    assert times["spans"] == times["steps"] == "traced"
    comm, host, device = manifest["comm_scale"], manifest["host_scale"], manifest["device_scale"]
    units = pd.read_csv(out / "units.csv").set_index("unit")
    for unit in summary["units"]:
        row = units.loc[unit["name"]]
        assert row["all_gather_ns"] * comm / 1e6 == pytest.approx(unit["all_gather_ms"], abs=1.5e-3)
        assert row["exposed_comm_ns"] * comm / 1e6 == pytest.approx(unit["exposed_comm_ms"], abs=1.5e-3)
        assert row["forward_clock_ns"] / 1e6 == pytest.approx(unit["forward_ms"], abs=1.5e-3)
        assert row["backward_clock_ns"] / 1e6 == pytest.approx(unit["backward_ms"], abs=1.5e-3)
        if unit["forward_prefetch_lead_ms"] is not None:
            assert row["forward_prefetch_lead_ns"] * device / 1e6 == pytest.approx(unit["forward_prefetch_lead_ms"],
                                                                                  abs=1.5e-3)
        if unit["host_wait_ms"] is not None:
            assert row["host_wait_ns"] * host / 1e6 == pytest.approx(unit["host_wait_ms"], abs=1.5e-3)
    findings = pd.read_csv(out / "findings.csv", keep_default_na=False)
    written = sorted((r.kind, r.unit, r.phase, round(r.lost_ns / 1e6, 3)) for r in findings.itertuples())
    said = sorted((f["kind"], f.get("unit") or "", f.get("phase") or "", f["lost_ms_per_step"])
                  for f in summary["findings"])
    assert written == said and len(written) >= 3
    return manifest, summary


def test_export_json_says_which_clock_each_tables_times_are_on(tmp_path, capsys) -> None:
    """A CPU recording's summary shows its units and findings on the run's clock (the timers' clean
    step, the profiler taken out); the export writes the per-unit analysis as traced under the schema's
    names. export.json says which each file is, and its scales move the traced figures onto the summary's:
    held here against the summary of the bundled FSDP2 sample, whose profiler slowed it by more than
    the figures' rounding can hide."""
    from pathlib import Path

    sample = Path(__file__).resolve().parents[2] / "sample_traces" / "fsdp2-cpu-2rank"
    manifest, summary = _units_on_the_summarys_clock(sample, tmp_path / "tables", capsys)
    assert manifest["comm_scale"] < 0.95  # the traced and the run's figures differ by more than their rounding
    units = pd.read_csv(tmp_path / "tables" / "units.csv").set_index("unit")
    for unit in summary["units"]:  # traced: not the summary's
        assert abs(units.loc[unit["name"], "all_gather_ns"] / 1e6 - unit["all_gather_ms"]) > 0.005


def test_export_json_names_the_scale_of_each_gpu_unit_figure(gpu_fsdp_dir, tmp_path, capsys) -> None:
    """On a GPU recording whose collectives ran on gloo (the shared H100 gloo2 run), the de-profiler moves
    the host's waits, the collectives and the kernels by three different factors: export.json's texts and
    scales hold each exported unit figure to the summary's by its own one."""
    manifest, _ = _units_on_the_summarys_clock(gpu_fsdp_dir / "h100-fsdp2-gloo2-block", tmp_path / "tables", capsys)
    host, comm, device = manifest["host_scale"], manifest["comm_scale"], manifest["device_scale"]
    assert host < 0.9 and abs(comm - device) > 0.01 and abs(host - comm) > 0.1  # three scales, told apart
    assert "host_wait_ns by host_scale" in manifest["times"]["units"]
