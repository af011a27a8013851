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
    assert "; Bl measured none: it was recorded with --no-memory (run.json)." in finding.message
    # the estimate says what it assumed: Bl's bytes per element, with no memory recorded to measure them
    # from; B recorded the same model and setting with memory, and its estimate assumes nothing
    listed = finding.evidence.split("an estimate, not fsdpviz whatif's prediction): ")[1]
    entries = {e.split(" ")[0]: e for e in re.split(r", (?=(?:B|Bl|Broot) )", listed)}
    assert entries["Bl"].endswith("(the sharded bytes per element and the optimizer's bytes per element assumed, "
                                  "not measured)"), entries["Bl"]
    assert "assumed" not in entries["B"], entries["B"]


def test_two_runs_of_which_one_measured_no_memory_are_not_compared(gpu_h200_dir: Path) -> None:
    """B against Bl alone: one peak, nothing to compare it with; the finding says so and why."""
    c = compare_runs(load_runs([gpu_h200_dir / "B", gpu_h200_dir / "Bl"], ["B", "Bl"], cache=False))
    (finding,) = [f for f in c.findings if f.kind == "memory"]
    assert finding.better is None and c.best["memory.peak_allocated_bytes"] == []
    assert finding.message == ("Peak allocated memory is not compared, as Bl measured none: it was recorded with "
                               "--no-memory (run.json).")
