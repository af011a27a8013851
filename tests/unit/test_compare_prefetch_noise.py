"""compare's prefetch finding names a better run only where the runs' exposed communication is told
apart: the exposed all-gather time it quotes is a part of that, and a part moving inside the whole's
noise is not a gain. Two committed CPU recordings of the example (FSDP2, 2 ranks), by default and with
explicit prefetch: the prefetched one issues its gathers earlier, and its exposed communication is
within the noise of the other's."""

from __future__ import annotations

from pathlib import Path

from fsdpviz.analysis.compare.runs import compare_runs
from fsdpviz.report.compare.build import load_runs

RECORDED = Path(__file__).parents[1] / "recorded"


def test_a_prefetch_inside_the_noise_of_exposed_communication_names_no_better_run() -> None:
    c = compare_runs(load_runs([RECORDED / "example-fsdp2" / "run", RECORDED / "fsdp2-prefetch" / "run"],
                               ["default", "prefetched"], cache=False))
    exposed = next(f for f in c.findings if f.kind == "exposed_comm")
    assert exposed.better is None and "not told apart" in exposed.message
    (forward,) = [f for f in c.findings if f.kind == "prefetch" and "forward all-gathers" in f.message]
    depth = forward.values["forward_issue_depth"]
    assert depth["prefetched"] > depth["default"] + 0.5  # it does issue earlier
    assert forward.better is None
    assert "but the runs' exposed communication is not told apart (within noise" in forward.message
    gathered = forward.values["exposed_forward_all_gather_ms"]
    assert f"reads {gathered['prefetched']:.2f} ms vs {gathered['default']:.2f} ms per step" in forward.message
