"""``fsdpviz summary --json`` per-unit entries on a synthetic GPU FSDP2 run: the model's numbers."""

from __future__ import annotations

import json

import pytest
from synth import Scenario, generate_run, make_root, make_units

from fsdpviz.cli import main

CONTRACT = ("name", "param_numel", "all_gather_ms", "forward_ms", "backward_ms", "reduce_scatter_ms",
            "exposed_comm_ms", "prefetch_lead_ms", "peak_allocated_bytes")


def test_summary_units_carry_the_models_numbers(tmp_path, capsys) -> None:
    sc = Scenario(units=make_units(3, fwd_ns=500_000, bwd_ns=900_000), root=make_root(), world_size=2,
                  steps=(3, 4, 5), forward_prefetch=1)
    run = generate_run(sc, tmp_path / "run", run_folder=True)
    with pytest.raises(SystemExit) as done:
        main(["summary", str(run.folder), "--json", "--no-cache"])
    assert done.value.code == 0
    summary = json.loads(capsys.readouterr().out)
    units = {u["name"]: u for u in summary["units"]}
    assert list(units) == ["(root)", "blocks.0", "blocks.1", "blocks.2"]
    assert all(set(CONTRACT) <= set(u) for u in units.values())

    want = run.expected.unit_steps
    want = want[want["step"].isin(summary["steps"])]
    per_step = want.groupby(["rank", "step", "unit"]).agg(
        ag=("ag_ns", "sum"), rs=("rs_ns", "sum"), peak=("peak_allocated_bytes", "max"),
        exposed=("ag_exposed_ns", "sum"), rs_exposed=("rs_exposed_ns", "sum"))
    per_step["exposed"] += per_step["rs_exposed"]
    med = per_step.groupby("unit").median()
    lead = want[want["phase"] == "forward"].groupby("unit")["prefetch_lead_ns"].median()
    for spec in sc.all_units():
        got = units[spec.name]
        assert got["param_numel"] == spec.numel  # from run.json
        assert got["forward_ms"] == round(spec.fwd_ns / 1e6, 3)
        assert got["backward_ms"] == round(spec.bwd_ns / 1e6, 3)
        assert got["all_gather_ms"] == round(med.loc[spec.name, "ag"] / 1e6, 3)
        assert got["reduce_scatter_ms"] == round(med.loc[spec.name, "rs"] / 1e6, 3)
        assert got["exposed_comm_ms"] == round(med.loc[spec.name, "exposed"] / 1e6, 3)
        assert got["prefetch_lead_ms"] == round(lead.loc[spec.name] / 1e6, 3)
        assert got["peak_allocated_bytes"] == per_step.xs(spec.name, level="unit")["peak"].max()
    # explicit prefetch one ahead: every block after the first was gathered one unit ahead
    assert [units[f"blocks.{i}"]["forward_issue_depth"] for i in (1, 2)] == [1.0, 1.0]


def test_summary_lists_findings_with_the_models_exposed_time(tmp_path, capsys) -> None:
    """No overlap by construction: each block's forward gather waits for the previous block's compute."""
    sc = Scenario(units=make_units(3), world_size=2, steps=(3, 4, 5), backward_prefetch=0, sync_per_unit=True)
    run = generate_run(sc, tmp_path / "run", run_folder=True)
    with pytest.raises(SystemExit) as done:
        main(["summary", str(run.folder), "--json", "--no-cache"])
    assert done.value.code == 0
    out = json.loads(capsys.readouterr().out)
    findings, actions = out["findings"], out["actions"]
    assert findings, "a run with every gather exposed has findings"
    lost = [f["lost_ms_per_step"] for f in findings]
    assert lost == sorted(lost, reverse=True)
    late = [f for f in findings if (f["kind"], f["unit"], f["phase"]) == ("exposed_all_gather", "blocks.1", "forward")]
    assert len(late) == 1
    want = run.expected.unit_steps
    want = want[(want["unit"] == "blocks.1") & (want["phase"] == "forward") & want["step"].isin((3, 4))]
    assert late[0]["lost_ms_per_step"] == pytest.approx(want["ag_exposed_ns"].median() / 1e6, abs=0.002)
    assert "set_modules_to_forward_prefetch" in late[0]["knob"]

    with pytest.raises(SystemExit) as done:
        main(["summary", str(run.folder)])
    assert done.value.code == 0
    text = " ".join(capsys.readouterr().out.split())  # undo the terminal's line wrapping
    assert ("actions (the bound first; then the advised ones and the others, each by time lost per step; the "
            "profiler's cost, which the run does not pay, last)") in text
    # the actions --json lists, the first five shown (alike findings in one line), the rest counted
    shown = [a for a in actions if not a["folded"]]
    assert shown and all(" ".join(a["message"].split()) in text for a in shown)
    # every finding is counted once: in its own action, or in the one that leads to its setting (the
    # bound's own count is 1 before it takes the findings of its setting)
    assert sum(a["count"] for a in actions) - sum(1 for a in actions if a["kind"] == "bound") == len(findings)
    if len(shown) < len(actions):
        assert f"{len(actions) - len(shown)} more action(s) and all {len(findings)} finding(s)" in text
