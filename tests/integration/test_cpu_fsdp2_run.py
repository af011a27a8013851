"""A real 2-rank FSDP2 run on CPU/gloo under torchrun, profiled with plain torch.profiler (its traces
committed in tests/recorded/fsdp2-cpu-profile: helpers/committed.py)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from helpers.committed import recorded_once
from helpers.jobs import retried, run_job, torchrun
from helpers.once import session_root

from fsdpviz.analysis.overlap import compute_overlap
from fsdpviz.analysis.pipeline import analyse_traces
from fsdpviz.trace import load_traces

SCRIPT = Path(__file__).with_name("fsdp2_cpu_profile.py")
pytestmark = pytest.mark.recorded

RANKS = 2
UNIT_PARAMS = 256 * 256 + 256  # one Linear(256, 256): what each unit's all-gather returns


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = session_root(tmp_path_factory) / "fsdp2-cpu-profile"
    out = folder / "traces"

    def make() -> dict[str, subprocess.CompletedProcess | None]:
        out.mkdir()
        # same files each try
        return {"proc": retried(lambda: run_job(torchrun(SCRIPT, str(out), nproc=RANKS), timeout=600))}

    proc = recorded_once(folder, "fsdp2-cpu-profile", {"ranks": RANKS}, [SCRIPT], make)["proc"]
    assert proc is not None and proc.returncode == 0, proc.stderr[-3000:] if proc else ""
    return out


@pytest.mark.slow
def test_gloo_comm_steps_and_overlap(run_dir: Path) -> None:
    traces = load_traces([run_dir], cache=False)
    assert traces.rank_ids == [0, 1] and traces.world_size == 2
    assert set(traces.ranks["backend"]) == {"gloo"}
    for rank in (0, 1):
        lanes = traces.lanes[traces.lanes["rank"] == rank]
        assert (lanes["lane_kind"] == "cpu_main").sum() == 1
        gloo_lanes = set(lanes.loc[lanes["lane_kind"] == "cpu_gloo", "lane"])
        assert gloo_lanes, lanes
        ev = traces.events[traces.events["rank"] == rank]
        gloo_ops = ev[ev["name"].astype(str).str.startswith("gloo:")]
        assert set(gloo_ops["lane"].astype(str)) <= gloo_lanes
        assert {"all_gather", "all_reduce"} <= set(gloo_ops["comm"].astype(str))
        # Each unit's gather returns one unsharded Linear(256, 256) in float32.
        gathers = gloo_ops[gloo_ops["comm"] == "all_gather"]
        assert set(gathers["comm_bytes"]) == {UNIT_PARAMS * 4}
        issued = ev[ev["name"] == "c10d::_allgather_base_"]
        assert set(issued["comm_bytes"]) == {UNIT_PARAMS * 4} and len(issued) == len(gathers)
        assert traces.steps.loc[traces.steps["rank"] == rank, "step"].tolist() == [2, 3, 4]

    overlap = compute_overlap(traces)
    assert list(overlap["device"]) == ["cpu", "cpu"]
    assert ((overlap["overlap_pct"] >= 0) & (overlap["overlap_pct"] <= 100)).all()
    assert (overlap["comm_ns"] > 0).all() and (overlap["compute_ns"] > 0).all()
    assert (overlap["busy_ns"] <= overlap["window_ns"]).all()
    summary = analyse_traces(traces).summary.to_json()
    assert summary["framework"] == "fsdp2" and summary["steps"] == [2, 3]
    assert 0 <= summary["overlap"]["overlap_pct"] <= 100


@pytest.mark.slow
def test_steps_lie_on_the_wall_clock(run_dir: Path) -> None:
    """ProfilerStep#N starts inside the N-th ``prof.step()`` call and ends inside the next one, so on
    one wall clock each boundary must fall between the script's own before/after readings."""
    traces = load_traces([run_dir], cache=False)
    slack_ns = 1_000_000  # Kineto's ts has µs resolution and baseTimeNanoseconds its own rounding
    for rank in (0, 1):
        calls = json.loads((run_dir / f"rank{rank}.clock.json").read_text())["step_boundaries_ns"]
        steps = traces.steps[traces.steps["rank"] == rank].sort_values("step")
        for step, start_ns, end_ns in steps[["step", "start_ns", "end_ns"]].itertuples(index=False):
            before, after = calls[step - 1]  # ProfilerStep#N begins in the N-th call (1-based)
            assert before - slack_ns <= start_ns <= after + slack_ns, (rank, step)
            if step < len(calls):
                before, after = calls[step]
                assert before - slack_ns <= end_ns <= after + slack_ns, (rank, step)
        durations = (steps["end_ns"] - steps["start_ns"]).to_numpy()
        assert (durations > 0).all()
