"""``RunResult.summary`` and ``fsdpviz summary --json``: the contract keys, values known by construction."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

import msgspec
import pytest
from helpers.kineto import TraceBuilder

from fsdpviz.analysis.pipeline import analyse_traces
from fsdpviz.cli import main
from fsdpviz.trace import load_traces
from fsdpviz.whatif.gains import completed_summary

NCCL_AG = "ncclKernel_AllGather_RING_LL_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)"
GEMM = "volta_sgemm_128x64_nn"
CONTRACT_KEYS = {"framework", "world_size", "ranks", "steps", "step_time_ms", "overlap", "memory", "units"}


def _rank_trace(tmp: Path, rank: int, *, label: str | None = None, comm_start_us: float = 100,
                world_size: int = 2) -> Path:
    b = TraceBuilder(rank=rank, world_size=world_size)
    b.step(3, 0, 1000).step(4, 1000, 1200).step(5, 2200, 500)  # step 5 = last, dropped
    if label:
        b.annotation(label, 5, 50)
    b.kernel(NCCL_AG, comm_start_us, 100, stream=20, launch_us=10)
    b.kernel(GEMM, 150, 100, stream=7, launch_us=11)  # overlaps comm 150..200 for rank 0
    b.kernel(NCCL_AG, 1100, 100, stream=20, launch_us=1010)
    b.memory(20, allocated=1 << 20, reserved=2 << 20, delta=1 << 20)
    b.memory(1500, allocated=(3 << 20) + rank, reserved=4 << 20, delta=2 << 20)
    b.memory(2300, allocated=9 << 30, reserved=9 << 30, delta=1)  # in the dropped step
    return b.write(tmp / f"rank{rank}.trace.json")


def test_summary_numbers_by_construction(tmp_path: Path) -> None:
    _rank_trace(tmp_path, 0, label="FSDP::pre_forward (blocks.0)")
    _rank_trace(tmp_path, 1, label="FSDP::pre_forward (blocks.0)", comm_start_us=300)
    result = analyse_traces(load_traces([tmp_path], cache=False)).summary.to_json()
    assert CONTRACT_KEYS <= set(result)
    assert result["framework"] == "fsdp2"
    assert (result["world_size"], result["ranks"], result["steps"]) == (2, [0, 1], [3, 4])
    assert result["step_time_ms"] == 1.1  # mean of 1.0 and 1.2 ms
    ov = result["overlap"]
    # rank 0: comm 200 µs over 2 steps, 50 µs hidden; rank 1: comm 200 µs, none hidden.
    assert ov["per_rank"]["0"]["overlap_pct"] == 25.0 and ov["per_rank"]["1"]["overlap_pct"] == 0.0
    # the run: the share hidden of its own figures (the median comm, 100 µs, and exposed, 87.5 µs, shown
    # to the µs), not HTA's pooled share, which as_traced keeps (50 of 400 µs: 12.5 %)
    assert (ov["comm_ms"], ov["exposed_comm_ms"]) == (0.1, 0.087) and ov["overlap_pct"] == 13.0
    assert ov["as_traced"]["overlap_pct"] == 12.5
    traced = ov["as_traced"]  # HTA's definitions: per step, median over ranks (of two: their mean)
    assert traced["comm_ms"] == 0.1 and traced["compute_ms"] == 0.05
    assert traced["exposed_comm_ms"] == pytest.approx((0.075 + 0.1) / 2, abs=0.001)
    # without timers the clock is the trace's: the same time, the busy time split into the model's
    # compute and FSDP's per-unit work (the compute here runs inside FSDP's pre_forward range)
    # (the bound's parts are medians over ranks of their step windows, HTA's means over the busy span)
    assert ov["comm_ms"] == 0.1 and ov["compute_ms"] + ov["fsdp_overhead_ms"] == pytest.approx(0.05, abs=0.005)
    assert ov["exposed_comm_ms"] == pytest.approx((0.075 + 0.1) / 2, abs=0.001)
    assert result["memory"]["peak_allocated_bytes"] == (3 << 20) + 1
    assert result["memory"]["peak_reserved_bytes"] == 4 << 20
    assert isinstance(result["units"], list)  # filled by the per-unit analysis when it finds units
    assert any("step 5" in n for n in result["notes"])


def test_the_traced_figures_are_medians_over_ranks_as_the_headline_is(tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """Three ranks whose exposed communication differs by construction (step 3's all-gather hidden
    for 50, 0 and 10 µs of its 100 behind the GEMM at 150-250 µs; step 4's never): 75, 100 and 95 µs
    a step. The trace's own figure is their median, 95 µs, as the headline's is (a mean, 90 µs, would
    read as a profiler's share on a run that has none), and the terminal shows one figure."""
    for rank, start in ((0, 100), (1, 300), (2, 240)):
        _rank_trace(tmp_path, rank, label="FSDP::pre_forward (blocks.0)", comm_start_us=start, world_size=3)
    summary = analyse_traces(load_traces([tmp_path], cache=False)).summary
    per_rank = {r: o.exposed_comm_ms for r, o in summary.overlap.as_traced.per_rank.items()}
    assert per_rank == pytest.approx({"0": 0.075, "1": 0.1, "2": 0.095}, abs=0.001)
    assert summary.overlap.as_traced.exposed_comm_ms == pytest.approx(0.095, abs=0.001)
    assert summary.exposed_comm_ms == pytest.approx(0.095, abs=0.001)
    with pytest.raises(SystemExit) as done:
        main(["summary", str(tmp_path), "--no-cache", "-q"])
    assert done.value.code in (0, None)
    line = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("exposed comm"))
    assert "as traced" not in line, line


@pytest.mark.parametrize(
    ("label", "run_framework", "expected"),
    [
        ("FSDP::all_gather (layers.0)", None, "fsdp2"),
        ("FullyShardedDataParallel.forward", None, "fsdp1"),
        ("fsdpviz::forward (blocks.0)", "zero3", "zero3"),
        ("fsdpviz::forward (blocks.0)", "fsdp1", "fsdp1"),
        ("DistributedDataParallel.forward", None, "ddp"),
        ("aten::mm", None, "unknown"),
        ("aten::mm", "ddp", "ddp"),
    ],
)
def test_framework_from_labels(tmp_path: Path, label: str, run_framework: str | None, expected: str) -> None:
    if run_framework:
        (tmp_path / "traces").mkdir()
        _rank_trace(tmp_path / "traces", 0, label=label)
        (tmp_path / "run.json").write_text(json.dumps({"framework": run_framework, "world_size": 1}))
    else:
        _rank_trace(tmp_path, 0, label=label)
    result = analyse_traces(load_traces([tmp_path], cache=False)).summary.to_json()
    assert result["framework"] == expected
    if expected == "unknown":
        assert result["units"] == []
        assert any("no FSDP labels" in n and "units is empty" in n for n in result["notes"])
    if expected == "ddp":  # said in words, not only as a key
        assert result["units"] == []
        assert any(n.startswith("the model was wrapped in DistributedDataParallel, not FSDP") for n in result["notes"])


def test_summary_json_command_prints_exactly_the_dict(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _rank_trace(tmp_path, 0)
    with pytest.raises(SystemExit) as exc:
        main(["summary", "--json", "--no-cache", str(path)])
    out, err = capsys.readouterr()
    assert exc.value.code == 0 and err == ""
    assert json.loads(out) == json.loads(json.dumps(
        completed_summary(analyse_traces(load_traces([path], cache=False))).to_json()))


def test_summary_table_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _rank_trace(tmp_path, 0)
    with pytest.raises(SystemExit) as exc:
        main(["summary", "--no-cache", str(path)])
    out, _ = capsys.readouterr()
    assert exc.value.code == 0
    assert "overlap" in out and "25.00 %" in out and "step time" in out and "1.10 ms" in out


def test_no_comm_gives_null_overlap(tmp_path: Path) -> None:
    b = TraceBuilder()
    b.step(1, 0, 100).step(2, 100, 100).kernel(GEMM, 10, 10, launch_us=1)
    result = analyse_traces(load_traces([b.write(tmp_path / "r.json")], cache=False)).summary.to_json()
    assert result["overlap"]["overlap_pct"] is None
    assert result["memory"]["peak_allocated_bytes"] is None
    json.dumps(result, allow_nan=False)  # strict JSON: no NaN anywhere


def test_sample_cpu_traces(repo_root: Path) -> None:
    sample = repo_root / "sample_traces" / "fsdp2-cpu-2rank"
    if not sample.is_dir():
        pytest.skip(f"{sample} not present")
    result = analyse_traces(load_traces([sample], cache=False)).summary.to_json()
    assert result["framework"] == "fsdp2" and result["ranks"] == [0, 1] and result["world_size"] == 2
    assert result["device"] == "cpu" and result["steps"]
    assert 0 <= result["overlap"]["overlap_pct"] <= 100
    assert result["overlap"]["comm_ms"] > 0 and result["overlap"]["compute_ms"] > 0
    assert result["memory"]["peak_allocated_bytes"] > 0
    assert not math.isnan(result["step_time_ms"])


def test_terminal_summary_prints_bracketed_names_and_knobs_as_text(capsys: pytest.CaptureFixture[str]) -> None:
    """Unit names like ``[norm, output]`` and knobs like ``[next units]`` are text, not rich markup."""
    from fsdpviz.analysis.memory_categories import CATEGORIES, PeakCategories
    from fsdpviz.analysis.summary import MemorySummary, OverlapSummary, Summary
    from fsdpviz.analysis.units import UnitSummary
    from fsdpviz.commands.summary import print_summary
    from fsdpviz.structure.records import Finding, Note

    unit = UnitSummary(**dict.fromkeys(UnitSummary.__struct_fields__))
    unit = msgspec.structs.replace(unit, name="[norm, output]", param_numel=10, order=0, samples=1)
    summary = Summary(
        framework="fsdp2", world_size=1, ranks=[0], steps=[3], step_time_ms=1.0, device="cpu",
        overlap=OverlapSummary(comm_ms=1.0, compute_ms=1.0, exposed_comm_ms=0.5, overlap_pct=1.0, idle_ms=0.0,
                               per_rank={}),
        memory=MemorySummary(peak_allocated_bytes=3 << 20, peak_reserved_bytes=None, device=None, per_rank={},
                             categories=dict.fromkeys(CATEGORIES, 1 << 20),
                             categories_at=PeakCategories(rank=0, step=3, unit="[norm, output]", phase="backward",
                                                          allocated_bytes=3 << 20,
                                                          categories=dict.fromkeys(CATEGORIES, 1 << 20))),
        units=[unit], sources=[], run_dir="runs/[x]", missing_ranks=[], skipped_events=0,
        findings=[Finding(kind="exposed_all_gather", lost_ms_per_step=0.5, message="[norm, output]: exposed",
                          knob="module.set_modules_to_forward_prefetch([next units])")],
        notes=[Note("test", "[rank 0] said so")])
    from fsdpviz.analysis.actions import build_actions

    summary = msgspec.structs.replace(summary, actions=build_actions(summary.findings, None))
    print_summary(summary)
    out = " ".join(capsys.readouterr().out.split())
    for text in ("runs/[x]", "[norm, output]", "set_modules_to_forward_prefetch([next units])", "[rank 0] said so",
                 "(rank 0, step 3, during [norm, output] backward)"):  # where the peak was
        assert text in out, text


def test_the_per_rank_tables_all_row_is_the_runs_figures_and_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    """The ZeRO-3 sample's ranks hide 0.52 % and 0.45 % of their communication; the table's ``all`` row
    shows the run's 0.46 % (of the run's median communication and exposed communication), not the
    ranks' median (0.485 %): the row is the headline's figures, and the title says so."""
    sample = Path(__file__).resolve().parents[2] / "sample_traces" / "zero3-cpu-2rank"
    with pytest.raises(SystemExit) as done:
        main(["summary", str(sample), "--no-cache", "-q", "--json"])
    assert done.value.code in (0, None)
    result = json.loads(capsys.readouterr().out)
    with pytest.raises(SystemExit) as done:
        main(["summary", str(sample), "--no-cache", "-q"])
    lines = capsys.readouterr().out.splitlines()
    title = " ".join(ln.strip() for ln in lines[next(i for i, ln in enumerate(lines) if ln.startswith("per rank")):][:2])
    assert title.endswith("; all: the run's figures, as above"), title
    row = next(ln for ln in lines if ln.startswith("│  all "))
    cells = [c.strip() for c in row.strip("│ ").split("│")]
    ranks = [r["overlap_pct"] for r in result["overlap"]["per_rank"].values()]
    assert float(cells[4]) == pytest.approx(result["overlap"]["overlap_pct"], abs=0.005)
    assert abs(float(cells[4]) - statistics.median(ranks)) > 0.01  # not the ranks' median
    assert float(cells[5]) == pytest.approx(result["overlap"]["exposed_comm_ms"], abs=0.005)
