"""Compare of synthetic GPU FSDP2 runs whose better policy is known by construction.

Two runs of the same model (4 blocks + root, 2 ranks, NCCL-like streams) simulated by ``tests/synth``:
``prefetch`` sets explicit forward and backward prefetch one unit ahead; ``none`` prefetches nothing
and synchronises after every unit, so no gather can overlap compute. The simulation's own record
of what it created (``expected.unit_steps``) gives the exposed all-gather time of each run, and
explicit prefetch keeps exactly one more unit gathered. The findings must name ``prefetch`` as the
better run with those numbers.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from synth import Scenario, generate_run, make_root, make_units

from fsdpviz.analysis.compare.runs import compare_runs, comparison_json
from fsdpviz.formatting import ms_text
from fsdpviz.report.compare.build import build_compare, load_runs

UNIT_NUMEL = 4_000_000
DTYPE_BYTES = 2  # the scenario's bf16 parameters
SCENARIOS = {
    "prefetch": Scenario(units=make_units(4, numel=UNIT_NUMEL), root=make_root(), forward_prefetch=1,
                         backward_prefetch=1, steps=(3, 4, 5), gradients_per_kernel=False),
    "none": Scenario(units=make_units(4, numel=UNIT_NUMEL), root=make_root(), forward_prefetch=0,
                     backward_prefetch=0, sync_per_unit=True, steps=(3, 4, 5),
                     gradients_per_kernel=False),
}


@pytest.fixture(scope="module")
def synth_runs(tmp_path_factory: pytest.TempPathFactory):
    base = tmp_path_factory.mktemp("synth-compare")
    made = {name: generate_run(sc, base / name, run_folder=True) for name, sc in SCENARIOS.items()}
    loaded = load_runs([made[n].folder for n in SCENARIOS], list(SCENARIOS), cache=False)
    return made, loaded, compare_runs(loaded)


def _expected_exposed_gather_ms(run, phase: str | None = None) -> float:
    """Per-step exposed all-gather as the summary adds it: per unit and phase the median over
    ranks and analysed steps (the last step is not analysed), in ms rounded to the µs, summed."""
    us = run.expected.unit_steps
    us = us[us["step"] < max(run.scenario.steps)]
    if phase is not None:
        us = us[us["phase"] == phase]
    medians = us.groupby(["unit", "phase"])["ag_exposed_ns"].median()
    return sum(round(v / 1e6, 3) for v in medians)


def _finding(comparison, kind: str) -> dict:
    found = [f.to_json() for f in comparison.findings if f.kind == kind]
    assert len(found) == 1, [f.kind for f in comparison.findings]
    return found[0]


def test_exposed_communication_names_prefetch_with_the_constructed_numbers(synth_runs) -> None:
    made, _, comparison = synth_runs
    finding = _finding(comparison, "exposed_comm")
    assert finding["better"] == "prefetch"
    assert finding["message"].startswith("prefetch exposes the least communication")
    exposed = finding["values"]["units_exposed_all_gather_ms"]
    for name in SCENARIOS:
        assert exposed[name] == pytest.approx(_expected_exposed_gather_ms(made[name]), abs=2e-3), name
    for phase in ("forward", "backward"):
        got = finding["values"][f"units_exposed_{phase}_all_gather_ms"]
        for name in SCENARIOS:
            assert got[name] == pytest.approx(_expected_exposed_gather_ms(made[name], phase), abs=2e-3)
    # No prefetch exposes far more by construction: every gather waits for the synchronised GPU.
    assert exposed["none"] > 3 * exposed["prefetch"]
    assert f"{exposed['prefetch']:.2f} ms vs {exposed['none']:.2f} ms" in finding["message"]
    # Both runs gather every unit in forward and all but the root (not resharded) again in backward.
    assert finding["values"]["all_gathers_per_step"] == {"prefetch": 9.0, "none": 9.0}


def test_step_time_and_prefetch_depth_name_prefetch(synth_runs) -> None:
    _, _, comparison = synth_runs
    assert _finding(comparison, "step_time")["better"] == "prefetch"
    depth = [f.to_json() for f in comparison.findings if f.kind == "prefetch"]
    assert {f["better"] for f in depth} == {"prefetch"}
    backward = next(f for f in depth if "backward_issue_depth" in f["values"])
    assert backward["values"]["backward_issue_depth"]["prefetch"] == pytest.approx(1.0)


def test_memory_cost_of_prefetch_is_one_unit(synth_runs) -> None:
    _, _, comparison = synth_runs
    memory = _finding(comparison, "memory")
    peaks = memory["values"]["peak_allocated_bytes"]
    # Prefetching one unit ahead keeps one more unit's unsharded parameters alive.
    assert peaks["prefetch"] - peaks["none"] == UNIT_NUMEL * DTYPE_BYTES
    assert memory["better"] == "none"
    assert "1 unit(s)' unsharded parameters" in memory["message"]
    tradeoff = _finding(comparison, "tradeoff")
    assert tradeoff["message"].startswith("Trade-off: prefetch is")


def test_json_and_page_of_the_synthetic_pair(synth_runs, tmp_path: Path) -> None:
    _, loaded, comparison = synth_runs
    out = comparison_json(comparison)
    assert out["labels"] == ["prefetch", "none"]
    assert out["best"]["overlap.exposed_comm_ms"] == ["prefetch"]
    assert [g["name"] for g in out["unit_groups"]] == ["(root)", "blocks.0", "blocks.1", "blocks.2", "blocks.3"]
    assert not any(n.startswith(("Devices differ", "All runs are CPU")) for n in out["notes"])  # both GPU
    result = build_compare(loaded, tmp_path / "synth.html", comparison=comparison)
    text = result.path.read_text()
    assert "prefetch exposes the least communication" in text
    assert result.segments > 0


def test_no_trade_off_where_the_lean_run_is_within_the_fast_runs_spread(tmp_path: Path) -> None:
    """``prefetch`` loads 4 ms more data in one of its three steps (a 4 ms spread, 1.3 ms on its mean),
    ``slow`` is ``prefetch`` with 10 ms more in every step: ``prefetch`` is clearly the fastest, ``none``
    the leanest, but ``none``'s step is within ``prefetch``'s spread, so no speed is traded for memory."""
    scenarios = {
        "prefetch": Scenario(units=make_units(4, numel=UNIT_NUMEL), root=make_root(), forward_prefetch=1,
                             backward_prefetch=1, steps=(3, 4, 5), gradients_per_kernel=False,
                             step_data_ns={4: 4_000_000}),
        "none": SCENARIOS["none"],
        "slow": Scenario(units=make_units(4, numel=UNIT_NUMEL), root=make_root(), forward_prefetch=1,
                         backward_prefetch=1, steps=(3, 4, 5), gradients_per_kernel=False,
                         step_data_ns=dict.fromkeys((3, 4, 5), 10_000_000)),
    }
    made = {name: generate_run(sc, tmp_path / name, run_folder=True) for name, sc in scenarios.items()}
    comparison = compare_runs(load_runs([made[n].folder for n in scenarios], list(scenarios), cache=False))
    values, spread = comparison.values["step_time_ms"], comparison.spread["step_time_ms"]
    assert spread[0] == pytest.approx(4.0, abs=0.05)
    assert 0 < values[1] - values[0] < spread[0]  # none is slower, by less than prefetch's spread
    assert _finding(comparison, "step_time")["better"] == "prefetch"
    assert _finding(comparison, "memory")["better"] == "none"
    assert not [f for f in comparison.findings if f.kind == "tradeoff"]


def test_runs_of_one_command_apart_in_compute_are_said_to_differ_in_pace(tmp_path: Path) -> None:
    """Two synthetic runs of one command and one setting, the second's model kernels 1.5 times as long (a
    slower machine, by construction; the step's other work as before): compare says their model compute
    differs, by its own figures' ratio (1.47x), which no FSDP setting explains. The same slower kernels
    without prefetch (one command, another recorded setting) get no such note: a setting changed."""
    slow_units = make_units(4, numel=UNIT_NUMEL, fwd_ns=600_000, bwd_ns=1_200_000)
    slow_root = make_root(fwd_ns=300_000, bwd_ns=600_000)
    slow = Scenario(units=slow_units, root=slow_root, forward_prefetch=1, backward_prefetch=1,
                    steps=(3, 4, 5), gradients_per_kernel=False)
    slow_none = Scenario(units=slow_units, root=slow_root, forward_prefetch=0, backward_prefetch=0,
                         sync_per_unit=True, steps=(3, 4, 5), gradients_per_kernel=False)
    made = {"fast": generate_run(SCENARIOS["prefetch"], tmp_path / "fast", run_folder=True),
            "slow": generate_run(slow, tmp_path / "slow", run_folder=True),
            "slow-none": generate_run(slow_none, tmp_path / "slow-none", run_folder=True)}
    runs = load_runs([made["fast"].folder, made["slow"].folder], ["fast", "slow"], cache=False)
    (note,) = [n for n in compare_runs(runs).notes if n.startswith("Model compute differs")]
    fast, slow_ms = (r.summary.overlap.compute_ms for r in runs)
    assert slow_ms == pytest.approx(1.5 * fast, rel=0.03)  # the kernels; the optimizer's own work stays
    assert f"fast {fast:,.1f} ms, slow {slow_ms:,.1f} ms a step ({slow_ms / fast:.2f}x)" in note
    other = load_runs([made["fast"].folder, made["slow-none"].folder], ["fast", "slow-none"], cache=False)
    assert other[1].summary.overlap.compute_ms == pytest.approx(slow_ms, rel=0.01)  # as slow: only the setting differs
    assert not any(n.startswith("Model compute differs") for n in compare_runs(other).notes)


def test_runs_that_compute_the_model_at_different_paces_are_said_to(tmp_path: Path) -> None:
    """The same model under two prefetch settings, one run's unit kernels twice as long (a machine at half
    the pace; the root's and the loss's as before, so the step's compute 1.84x): the step time finding
    names the faster run and says the model's compute differs, as the compare table's figures give it,
    which no FSDP setting does. Runs of one command and setting get the pace note instead, not both."""
    slow = Scenario(units=make_units(4, numel=UNIT_NUMEL, fwd_ns=800_000, bwd_ns=1_600_000), root=make_root(),
                    forward_prefetch=0, backward_prefetch=0, sync_per_unit=True, steps=(3, 4, 5),
                    gradients_per_kernel=False)
    same = Scenario(units=make_units(4, numel=UNIT_NUMEL, fwd_ns=800_000, bwd_ns=1_600_000), root=make_root(),
                    forward_prefetch=1, backward_prefetch=1, steps=(3, 4, 5), gradients_per_kernel=False)
    made = {"fast": generate_run(SCENARIOS["prefetch"], tmp_path / "fast", run_folder=True),
            "slow": generate_run(slow, tmp_path / "slow", run_folder=True),
            "same": generate_run(same, tmp_path / "same", run_folder=True)}
    comparison = compare_runs(load_runs([made[n].folder for n in ("fast", "slow")], ["fast", "slow"], cache=False))
    finding = _finding(comparison, "step_time")
    assert finding["better"] == "fast"
    compute = {r.label: r.summary.overlap.compute_ms for r in comparison.runs}
    assert 1.6 < compute["slow"] / compute["fast"] < 2.0  # the units' kernels doubled, the rest as it was
    assert (f"Their model compute differs: slow computes {ms_text(compute['slow'])} a step against "
            f"{ms_text(compute['fast'])} in fast ({compute['slow'] / compute['fast']:.2f}x)") in finding["message"]
    assert not any(n.startswith("Model compute differs") for n in comparison.notes)
    # a third run the finding names only in passing ("Also, ...") gets the caveat in its clause
    made["none"] = generate_run(SCENARIOS["none"], tmp_path / "none", run_folder=True)
    three = compare_runs(load_runs([made[n].folder for n in ("none", "fast", "slow")], ["none", "fast", "slow"],
                                   cache=False))
    message = _finding(three, "step_time")["message"]
    assert message.startswith("fast has the shortest step") and "less than none" in message, message
    also = message[message.index(" Also, slow takes"):]
    assert f"but its model compute is {compute['slow'] / compute['fast']:.2f}x fast's" in also, message
    one_setting = compare_runs(load_runs([made[n].folder for n in ("fast", "same")], ["fast", "same"], cache=False))
    assert any(n.startswith("Model compute differs between runs of one command") for n in one_setting.notes)
    assert "Their model compute differs" not in _finding(one_setting, "step_time")["message"]


def test_runs_that_compute_alike_get_no_pace_caveat(synth_runs) -> None:
    _, _, comparison = synth_runs
    assert "compute differs" not in _finding(comparison, "step_time")["message"]
