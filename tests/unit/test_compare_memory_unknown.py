"""compare of runs of which one measured no memory (H200 model B, Bl recorded with --no-memory): the
memory finding ranks the runs that measured a peak and says why the other has none; the ZeRO
arithmetic's estimate says which of its bytes it assumed."""

from __future__ import annotations

import json
import re
from pathlib import Path

from fsdpviz.analysis.compare.runs import compare_runs
from fsdpviz.report.compare.build import load_runs


def test_a_run_without_memory_is_named_not_ranked(gpu_h200_dir: Path) -> None:
    labels = ["B", "Bl", "Broot"]
    runs = load_runs([gpu_h200_dir / n for n in labels], labels, cache=False)
    c = compare_runs(runs)
    options = {n: json.loads((gpu_h200_dir / n / "run.json").read_text())["options"] for n in labels}
    assert [n for n in labels if options[n]["memory"] is False] == ["Bl"]
    peaks = {r.label: r.summary.memory.peak_allocated_bytes for r in runs}
    assert peaks["Bl"] is None and peaks["B"] is not None and peaks["Broot"] is not None
    lowest = min(("B", "Broot"), key=lambda n: peaks[n] or 0)
    finding = next(f for f in c.findings if f.kind == "memory")
    assert finding.better == lowest
    assert finding.message.startswith(f"{lowest} has the lowest peak allocated memory of the runs that measured it: ")
    assert "; Bl measured none (Bl: it was recorded with --no-memory (run.json))." in finding.message
    # the estimate names what it assumed, run by run, as each run's memory model says
    for r in runs:
        model = r.analysis.memory_model
        assert model is not None
        assumed = not model.sharded_bytes_measured or not model.optimizer_bytes_measured
        listed = finding.evidence.split("an estimate, not fsdpviz whatif's prediction): ")[1]
        entry = next(e for e in re.split(r", (?=(?:B|Bl|Broot) )", listed) if e.startswith(f"{r.label} "))
        assert ("assumed, not measured" in entry) is assumed, entry
    # Bl's were assumed (no memory recorded to measure them from), B's measured
    assert not runs[1].analysis.memory_model.sharded_bytes_measured
    assert runs[0].analysis.memory_model.sharded_bytes_measured
