"""A CPU run is described in a CPU's words: its summary (terminal and JSON) and its report page never
say GPU or stream, which a CPU rank does not have (its lanes are the compute thread and gloo's
threads). The samples are real 2-rank CPU recordings; a GPU trace keeps its GPU words."""

from __future__ import annotations

import html
import json
import re
from pathlib import Path

import pytest

from fsdpviz.cli import main

SAMPLES = Path(__file__).parents[2] / "sample_traces"
CPU_SAMPLES = ["fsdp2-cpu-2rank", "fsdp1-cpu-2rank", "zero3-cpu-2rank", "fsdp2-cpu-2rank-plain"]
GPU_WORDS = re.compile(r"\bGPUs?\b|\bstreams?\b|\bCUDA\b|\bkernels?\b", re.IGNORECASE)


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    with pytest.raises(SystemExit) as done:
        main(list(argv))
    out, _ = capsys.readouterr()
    assert not done.value.code
    return out


def _strings(value: object) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for v in value.values() for s in _strings(v)]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return []


@pytest.mark.parametrize("sample", CPU_SAMPLES)
def test_cpu_summary_never_says_gpu_or_stream(sample: str, capsys: pytest.CaptureFixture[str]) -> None:
    path = str(SAMPLES / sample)
    data = json.loads(_run(capsys, "summary", path, "--json", "-q", "--no-cache"))
    assert data["device"] == "cpu"
    said = [s for s in _strings(data) if GPU_WORDS.search(s)]
    assert not said, said
    text = _run(capsys, "summary", path, "-q")
    assert not GPU_WORDS.search(text), text


@pytest.mark.parametrize("sample", ["fsdp2-cpu-2rank", "zero3-cpu-2rank"])
def test_cpu_report_never_says_gpu_or_stream(sample: str, tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    page = tmp_path / "report.html"
    _run(capsys, "report", str(SAMPLES / sample), "-q", "--no-cache", "-o", str(page))
    markup = page.read_text()
    visible = re.sub(r"<(script|style)\b.*?</\1>", "", markup, flags=re.DOTALL)
    text = html.unescape(re.sub(r"<[^>]+>", " ", visible))
    assert "compute thread" in text
    said = [line.strip() for line in text.splitlines() if GPU_WORDS.search(line)]
    assert not said, said


def test_cpu_whatif_never_says_gpu_or_stream(capsys: pytest.CaptureFixture[str]) -> None:
    text = _run(capsys, "whatif", str(SAMPLES / "fsdp2-cpu-2rank"), "--wrap", "merge:2", "-q", "--no-cache")
    assert "ranks per node 2 (recorded)" in text
    assert not GPU_WORDS.search(text), text


@pytest.mark.parametrize("level, baseline, said", [
    ("since_trace_start", None, "allocated since the trace began (the CPU profiler does not see what was made before)"),
    ("since_trace_start_plus_measured", 257_396,
     "including up to 251.36 KiB that fsdpviz record measured alive on a rank when the trace began"),
    # measured, and nothing alive: not the allocator's own level, which a caller's fallback would say
    ("since_trace_start_plus_measured", None,
     "allocated since the trace began (fsdpviz record measured nothing alive when it began)"),
    ("allocator", None, ""),
])
def test_a_cpu_level_is_said_for_what_it_counts(level: str, baseline: int | None, said: str) -> None:
    from fsdpviz.analysis.figures import level_words
    from fsdpviz.formatting import bytes_text

    assert level_words(level, baseline, bytes_text) == said


@pytest.mark.parametrize("sample", ["fsdp2-cpu-2rank", "fsdp1-cpu-2rank"])
def test_a_reduction_the_cpu_thread_waits_out_does_not_outlast_compute(sample: str,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """FSDP2's and FSDP1's training thread on a CPU rank waits out each gloo collective: no compute runs beside a
    reduce-scatter, so none runs "after it" for it to outlast. The trace's own figures say so: each unit's
    exposed reduce-scatter is all of its reduce-scatter, and the finding says the thread waited it out."""
    data = json.loads(_run(capsys, "summary", str(SAMPLES / sample), "--json", "-q", "--no-cache"))
    units = {u["name"]: u for u in data["units"]}
    reductions = [f for f in data["findings"] if f["kind"] == "exposed_reduce_scatter"]
    assert reductions
    for f in reductions:
        unit = units[f["unit"]]
        assert unit["exposed_reduce_scatter_ms"] == pytest.approx(unit["reduce_scatter_ms"], abs=0.011), unit
        assert "outlasts the compute" not in f["message"], f["message"]
        assert f["cause"] in ("waited_out", "nothing_left"), f
    waited = [f for f in reductions if f["cause"] == "waited_out"]
    assert waited and all("the training thread waits it out" in f["message"] for f in waited)
    actions = [a for a in data["actions"] if a["cause"] == "waited_out"]
    assert len(actions) == 1 and "reduce-scatters the training thread waits out" in actions[0]["message"]


def test_zero3_on_a_cpu_rank_keeps_its_overlapped_reductions_words(capsys: pytest.CaptureFixture[str]) -> None:
    # DeepSpeed issues its collectives asynchronously: its CPU ranks compute beside some, so nothing is
    # renamed "waited out" there
    data = json.loads(_run(capsys, "summary", str(SAMPLES / "zero3-cpu-2rank"), "--json", "-q", "--no-cache"))
    assert data["overlap"]["overlap_pct"] > 0
    assert not [f for f in data["findings"] if f["cause"] == "waited_out"]
