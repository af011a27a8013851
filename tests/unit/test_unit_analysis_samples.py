"""Per-unit analysis of the committed real CPU recordings (sample_traces/: FSDP2, FSDP1, ZeRO-3).

Independent facts: the frameworks' own labels counted straight from the JSON (one all-gather and
one reduce-scatter per label), run.json's unit sizes (from the model's parameters), and the step
time of the ProfilerStep ranges.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable
from pathlib import Path

import pandas as pd
import pytest

from fsdpviz.analysis.run import RunAnalysis, analyse_run
from fsdpviz.structure.labels import parse_labels
from fsdpviz.structure.spans import unit_tables
from fsdpviz.trace import load_traces

RUNS = {"fsdp2-cpu-2rank": "fsdp2", "fsdp1-cpu-2rank": "fsdp1", "zero3-cpu-2rank": "zero3",
        "fsdp2-cpu-2rank-plain": "fsdp2"}
GATHER_LABEL = {"fsdp2": "FSDP::all_gather", "fsdp1": "fsdpviz::all_gather ("}
REDUCE_LABEL = {"fsdp2": "FSDP::post_backward_reduce", "fsdp1": "fsdpviz::reduce_scatter ("}


@pytest.fixture(scope="session")
def sample(repo_root: Path, session_memo: Callable[..., RunAnalysis]) -> Callable[[str], RunAnalysis]:
    """``sample(name)``: a bundled sample recording analysed once per session."""
    def analysed(name: str) -> RunAnalysis:
        folder = repo_root / "sample_traces" / name
        if not folder.is_dir():
            pytest.skip(f"sample recording {folder} is missing")
        return session_memo(("sample", name), lambda: analyse_run(load_traces([folder], cache=False)))
    return analysed


def block_units(analysis: RunAnalysis) -> list[str]:
    """FSDP: the blocks.N units; ZeRO-3 (a unit per submodule): the fetched units inside blocks.N."""
    units = analysis.units
    if len(units) and (units["parent"].str.startswith("blocks.")).any():
        return list(units.loc[units["parent"].str.startswith("blocks."), "unit"])
    return [u for u in analysis.unit_stats["unit"] if u.startswith("blocks.")]


@pytest.mark.parametrize("name", list(RUNS))
def test_every_block_unit_gathers_computes_and_reduces(sample: Callable[[str], RunAnalysis], name: str) -> None:
    analysis = sample(name)
    assert analysis.framework == RUNS[name] and analysis.has_units
    stats = analysis.unit_stats.set_index("unit")
    blocks = block_units(analysis)
    assert len(blocks) >= 2
    for col in ("all_gather_ns", "forward_ns", "backward_ns", "reduce_scatter_ns"):
        assert (stats.loc[blocks, col] > 0).all(), col


@pytest.mark.parametrize("name", list(RUNS))
def test_unit_peaks_exceed_unsharded_parameters(sample: Callable[[str], RunAnalysis], name: str) -> None:
    stats = sample(name).unit_stats
    fetched = stats[stats["param_numel"] != 0]  # ZeRO-3's root and blocks hold no parameters of their own
    assert (fetched["param_bytes"] > 0).all() and len(fetched) >= len(stats) - 3
    assert (fetched["peak_allocated_bytes"] > fetched["param_bytes"]).all()


@pytest.mark.parametrize("name", list(RUNS))
def test_unit_compute_and_framework_time_reconcile_with_step_time(sample: Callable[[str], RunAnalysis], name: str) -> None:
    times = sample(name).step_times
    attributed = (times["unit_compute_ns"] + times["framework_ns"] + times["optimizer_ns"]) / times["step_ns"]
    assert (attributed <= 1.0).all()  # the categories never overlap
    assert attributed.median() >= 0.95


def test_zero3_blocks_and_root_compute_their_own_code_between_their_units(repo_root: Path, sample: Callable[[str], RunAnalysis]) -> None:
    """With a unit per submodule, a block's own code (attention scores, residual adds) lies between
    its units: it is the block's compute (a unit without parameters), and no time counts twice."""
    analysis = sample("zero3-cpu-2rank")
    stats = analysis.unit_stats.set_index("unit")
    for group in ("(root)", "blocks.0", "blocks.1"):
        assert stats.loc[group, "param_numel"] == 0 and stats.loc[group, "all_gather_ns"] == 0
        assert stats.loc[group, "forward_ns"] > 0 and stats.loc[group, "backward_ns"] > 0
    # the block's own pieces never overlap its units' windows
    w, p = analysis_windows_and_pieces(repo_root)
    for (rank, step, phase), pieces in p[p["unit"] == "blocks.0"].groupby(["rank", "step", "phase"]):
        kids = w[(w["rank"] == rank) & (w["step"] == step) & (w["phase"] == phase)
                 & w["unit"].str.startswith("blocks.0.")]
        for piece in pieces.itertuples():
            assert not ((kids["start_ns"] < piece.end_ns) & (kids["end_ns"] > piece.start_ns)).any()


def analysis_windows_and_pieces(repo_root: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    traces = load_traces([repo_root / "sample_traces" / "zero3-cpu-2rank"], cache=False)
    tables = unit_tables(traces.events, traces.lanes, parse_labels(traces.events))
    return tables.windows, tables.pieces


def _labels_per_step(repo_root: Path, name: str, rank: int, prefix: str) -> dict[int, int]:
    path = repo_root / "sample_traces" / name / ("traces" if "plain" not in name else "")
    path = next(p for p in path.iterdir() if p.name == f"rank{rank}.trace.json.gz")
    events = [e for e in json.loads(gzip.decompress(path.read_bytes()))["traceEvents"] if e.get("ph") == "X"]
    steps = [(e["ts"], e["ts"] + e["dur"], int(e["name"].split("#")[1])) for e in events
             if e["name"].startswith("ProfilerStep#")]
    counts: dict[int, int] = {}
    for e in events:
        if e["name"].startswith(prefix) and (prefix.endswith("(") or e["name"][len(prefix):][:1] in ("", " ")):
            for lo, hi, step in steps:
                if lo <= e["ts"] < hi:
                    counts[step] = counts.get(step, 0) + 1
    return counts


@pytest.mark.parametrize("name", ["fsdp2-cpu-2rank", "fsdp1-cpu-2rank", "fsdp2-cpu-2rank-plain"])
def test_every_gather_and_reduce_label_has_its_collective(repo_root: Path, sample: Callable[[str], RunAnalysis], name: str) -> None:
    analysis = sample(name)
    framework = RUNS[name]
    spans = analysis.spans
    for rank in analysis.ranks:
        gathers = _labels_per_step(repo_root, name, rank, GATHER_LABEL[framework])
        reduces = _labels_per_step(repo_root, name, rank, REDUCE_LABEL[framework])
        for step in analysis.steps:
            mine = spans[(spans["rank"] == rank) & (spans["step"] == step)]
            assert (mine["kind"] == "all_gather").sum() == gathers[step]
            assert (mine["kind"] == "reduce_scatter").sum() == reduces[step]


def test_units_read_from_labels_match_run_json(sample: Callable[[str], RunAnalysis]) -> None:
    """A plain profiler recording has no run.json: units, order and sizes come from the labels and
    the gathered bytes, and agree with what fsdpviz record wrote for the same model."""
    plain = sample("fsdp2-cpu-2rank-plain").units
    recorded = sample("fsdp2-cpu-2rank").units
    assert list(plain["unit"]) == list(recorded["unit"])
    assert list(plain["param_bytes"]) == list(recorded["param_bytes"])
    assert list(plain["parent"]) == ["", "(root)", "(root)"]


@pytest.mark.parametrize("name", list(RUNS))
def test_first_forward_gather_finding_says_what_happened(repo_root: Path, sample: Callable[[str], RunAnalysis], name: str) -> None:
    """The step's first forward all-gather (FSDP2: the root's bare ``FSDP::all_gather``; ZeRO-3: one
    bucket of many modules, listed first in the first ``fsdpviz::all_gather (...)`` range) has
    nothing to hide behind: its finding says so, with the numbers, whatever the framework."""
    analysis = sample(name)
    traces = load_traces([repo_root / "sample_traces" / name], cache=False)
    ev = traces.events
    names = ev["name"].astype(str)
    gathers = ev[((ev["rank"] == 0) & ev["step"].isin(analysis.steps)
                  & (names.str.startswith("FSDP::all_gather") | names.str.startswith("fsdpviz::all_gather ("))
                  & ~names.str.contains("copy_out")).to_numpy()]
    first_label = str(gathers.sort_values("start_ns")["name"].iat[0])
    inner = first_label.partition(" (")[2][:-1]  # "fsdpviz::all_gather ((root))" -> "(root)"
    first_unit = inner.split(", ")[0] if inner else "(root)"
    f = analysis.findings
    mine = f[(f["kind"] == "exposed_all_gather") & (f["unit"] == first_unit) & (f["phase"] == "forward")]
    assert len(mine) == 1, f[["unit", "phase", "message"]]
    row = mine.iloc[0]
    assert "the first all-gather of the forward pass, with no compute before it to hide behind" in row["message"]
    assert "units' compute in the pass before it" in row["evidence"] and row["knob"] == ""
    if ", " in inner:  # a bucket of several units: its whole duration and this unit's share
        assert f"carrying up to {len(inner.split(', '))} units (its share" in row["evidence"]
    # nor is the first forward gather said to be prefetched behind the root's compute (in backward,
    # a gather prefetched during the root's backward may well outlast it: that is another finding)
    forward = f[(f["phase"] == "forward").to_numpy()]
    assert not forward["message"].str.contains("prefetched, but it outlasts the compute of (root)", regex=False).any()
