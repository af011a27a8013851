"""compare's prefetch finding names a better run only where the runs' exposed communication is told
apart: the exposed all-gather time it quotes is a part of that, and a part moving inside the whole's
noise is not a gain. Two committed CPU recordings of the example (FSDP2, 2 ranks), by default and with
explicit prefetch: the prefetched one issues its gathers earlier, and its exposed communication is
within the noise of the other's. And two synthetic GPU runs built so that the one issuing its backward
gathers earlier exposes less of them but more communication in all (its links are slower): told apart,
and still not named better, with the whole's figures in the words."""

from __future__ import annotations

from pathlib import Path

import pytest
from synth import Scenario, generate_run, make_root, make_units

from fsdpviz.analysis.compare.findings import prefetch_finding
from fsdpviz.analysis.compare.runs import compare_runs
from fsdpviz.report.compare.build import load_runs

RECORDED = Path(__file__).parents[1] / "recorded"


def test_a_prefetch_not_told_apart_as_less_exposed_names_no_better_run() -> None:
    """The committed recordings: on a CPU rank, which waits out every gather, the earlier gathers hide
    nothing, and the two runs' exposed communication falls as the machine's pace does -- within the noise
    in some sets of them, the prefetched run's more in another (31.23 against 23.75 ms). Either way the
    prefetch finding names no better run, and says why with the part's own figures."""
    c = compare_runs(load_runs([RECORDED / "example-fsdp2" / "run", RECORDED / "fsdp2-prefetch" / "run"],
                               ["default", "prefetched"], cache=False))
    exposed = next(f for f in c.findings if f.kind == "exposed_comm")
    (forward,) = [f for f in c.findings if f.kind == "prefetch" and "forward all-gathers" in f.message]
    depth = forward.values["forward_issue_depth"]
    assert depth["prefetched"] > depth["default"] + 0.5  # it does issue earlier
    assert forward.better is None
    gathered = forward.values["units_exposed_forward_all_gather_ms"]
    figures = f"{gathered['prefetched']:.2f} ms vs {gathered['default']:.2f} ms per step"
    if exposed.better is None:  # within the noise or the step-to-step spread, as the steps happened to fall
        assert "not told apart" in exposed.message
        assert "but the runs' exposed communication is not told apart (within " in forward.message
        assert f"reads {figures}" in forward.message
    else:  # told apart: the prefetched run exposes no less, in the part as in the whole
        assert exposed.better == "default" and gathered["prefetched"] >= gathered["default"]
        assert forward.message.endswith(f"its exposed forward all-gather time is not less: {figures}.")


def _exposed_gather_ms(run, phase: str) -> float:
    """The exposed all-gather time the simulation made, per step, as the summary adds it: per unit the
    median over ranks and analysed steps (the last step is not analysed), in ms to the µs, summed."""
    us = run.expected.unit_steps
    us = us[(us["step"] < max(run.scenario.steps)) & (us["phase"] == phase)]
    return sum(round(v / 1e6, 3) for v in us.groupby("unit")["ag_exposed_ns"].median())


def test_a_part_less_exposed_with_more_exposed_in_all_names_no_better_run_and_says_why(
        tmp_path: Path) -> None:
    # GIVEN "deep" prefetching one unit ahead over slow links (8 bytes/ns) and "shallow" prefetching
    # nothing and synchronising after every unit over fast ones (25): deep's backward gathers start
    # earlier and expose less, its reduce-scatters and forward gathers expose more
    units = make_units(4, numel=4_000_000)
    made = {"deep": generate_run(Scenario(units=units, root=make_root(), forward_prefetch=1, backward_prefetch=1,
                                          comm_bytes_per_ns=8.0, steps=(3, 4, 5), gradients_per_kernel=False),
                                 tmp_path / "deep", run_folder=True),
            "shallow": generate_run(Scenario(units=units, root=make_root(), forward_prefetch=0, backward_prefetch=0,
                                             sync_per_unit=True, steps=(3, 4, 5), gradients_per_kernel=False),
                                    tmp_path / "shallow", run_folder=True)}
    exposed = {name: _exposed_gather_ms(run, "backward") for name, run in made.items()}
    assert exposed["deep"] < exposed["shallow"]  # by construction, as the simulation made it
    # WHEN compared
    c = compare_runs(load_runs([made[n].folder for n in made], list(made), cache=False))
    whole = dict(zip(c.labels, c.values["overlap.exposed_comm_ms"]))
    assert next(f for f in c.findings if f.kind == "exposed_comm").better == "shallow"
    # THEN the backward prefetch finding quotes the part, says the whole is not less, and names no run
    (backward,) = [f for f in c.findings if f.kind == "prefetch" and "backward all-gathers" in f.message]
    assert backward.message.startswith("deep issues its backward all-gathers earlier")
    assert backward.values["units_exposed_backward_all_gather_ms"] == pytest.approx(exposed, abs=0.002)
    assert backward.better is None
    assert backward.message.endswith(
        f"but its whole exposed communication is not less ({whole['deep']:.2f} ms vs {whole['shallow']:.2f} ms per step), "
        "so it is not named better.")
    # AND the forward one, whose part is not less either, names none without that clause
    (forward,) = [f for f in c.findings if f.kind == "prefetch" and "forward all-gathers" in f.message]
    assert forward.better is None and "exposed forward all-gather time is not less" in forward.message
    assert "whole exposed" not in forward.message
    # AND where deep's whole exposed communication were unknown, the finding says that, and names none
    c.values["overlap.exposed_comm_ms"][c.labels.index("deep")] = None
    (unknown,) = [f for f in prefetch_finding(c) if "backward all-gathers" in f.message]
    assert unknown.better is None and unknown.message.endswith(
        "but the whole exposed communication of deep is unknown, so neither is named better.")
