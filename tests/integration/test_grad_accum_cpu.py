"""Gradient accumulation and activation checkpointing in real 2-rank CPU/gloo recordings.

``fsdpviz record`` runs the example trainer with ``--grad-accum 2`` (two micro-batches, each a whole
forward and backward, per optimizer step): FSDP2 as is, FSDP1 and ZeRO-3 also with ``--checkpoint``
(every block's forward is recomputed inside its backward, and fsdpviz's module hooks label that
recomputation ``fsdpviz::forward (blocks.N)`` inside ``fsdpviz::backward (blocks.N)``).

Independent facts the analysis must agree with: FSDP2's own ``FSDP::pre_forward (u)`` /
``FSDP::pre_backward (u)`` labels (one per unit and micro-batch), the recorder's timers (their
``n``: how many intervals a unit's phase had in the step, counted by hooks on the framework), and
FSDP2's rules for its collectives: a block is gathered in every forward and again in every
backward (``reshard_after_forward=True``) and reduce-scattered after every backward; the root
(``reshard_after_forward=False``) is gathered in forward only and reduce-scattered every backward.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from recording import Config, Recordings, grad_accum_config

from fsdpviz.analysis.run import RunAnalysis, analyse_run
from fsdpviz.trace import load_traces

pytestmark = pytest.mark.recorded

BLOCKS = ["blocks.0", "blocks.1"]
MICRO_BATCHES = 2
RUNS = {"fsdp2": [], "fsdp1": ["--checkpoint"]}
if importlib.util.find_spec("deepspeed") is not None:
    RUNS["zero3"] = ["--checkpoint"]


def _config(framework: str) -> Config:
    return grad_accum_config(framework, *RUNS[framework])


@pytest.fixture(scope="module")
def runs(recordings: Recordings) -> dict[str, tuple[Path, RunAnalysis]]:
    out = {}
    for framework in RUNS:
        rec = recordings.get(_config(framework))
        assert rec.proc.returncode == 0, rec.proc.stderr[-2000:]
        out[framework] = (rec.run_dir, analyse_run(load_traces([rec.run_dir], cache=False)))
    return out


def _timer_counts(folder: Path) -> pd.Series:
    """(rank, step, unit, phase) -> intervals the recorder's hooks timed (the ``n`` of ``total``)."""
    rows = []
    for path in sorted((folder / "timers").glob("rank*.jsonl")):
        rows += [json.loads(line) for line in path.read_text().splitlines()]
    frame = pd.DataFrame(rows)
    frame = frame[(frame["unit"] != "") & (frame["kind"] == "total")]
    return frame.set_index(["rank", "step", "unit", "phase"])["n"]


@pytest.mark.slow
@pytest.mark.parametrize("framework", list(RUNS))
def test_every_unit_runs_one_forward_and_backward_per_micro_batch(runs, framework: str) -> None:
    folder, analysis = runs[framework]
    # one ProfilerStep per optimizer step, not per micro-batch; all three profiled steps are complete
    assert analysis.steps == [1, 2, 3]
    us = analysis.unit_steps
    blocks = us[us["unit"].isin(BLOCKS)]
    assert len(blocks) == 2 * len(analysis.steps) * len(BLOCKS) * 2  # ranks x steps x blocks x phases
    assert (blocks["n_passes"] == MICRO_BATCHES).all(), blocks[["rank", "step", "unit", "phase", "n_passes"]]
    # the recorder's own hooks timed the same number of forward and backward intervals in each profiled
    # step and in the unit-timed step after the trace (a recomputed forward inside backward is no forward
    # interval); in the clean steps none
    timers = _timer_counts(folder)
    unit_timed = json.loads((folder / "run.json").read_text())["profile"]["unit_timed_steps"]
    assert unit_timed == [analysis.steps[-1] + 1]
    assert set(timers.index.get_level_values("step")) == {*analysis.steps, *unit_timed}
    for row in blocks.itertuples():
        assert timers.loc[(row.rank, row.step, row.unit, row.phase)] == MICRO_BATCHES
        assert timers.loc[(row.rank, unit_timed[0], row.unit, row.phase)] == MICRO_BATCHES
    # the root's forward too: the second micro-batch's opens while the first one's backward was the
    # step's last phase (FSDP1 timed it as a recomputed forward inside backward, and counted one)
    for rank in sorted(set(blocks["rank"])):
        for step in (*analysis.steps, *unit_timed):
            assert timers.loc[(rank, step, "(root)", "forward")] == MICRO_BATCHES, (rank, step)
    # a step's per-unit time is the sum over its micro-batches
    spans = analysis.spans
    compute = spans[(spans["kind"] == "compute") & spans["unit"].isin(BLOCKS)]
    per_micro = (compute["end_ns"] - compute["start_ns"]).groupby(
        [compute["rank"], compute["step"], compute["unit"], compute["phase"], compute["micro"]]).sum()
    assert set(per_micro.index.get_level_values("micro")) == {0, 1}
    summed = per_micro.groupby(level=["rank", "step", "unit", "phase"]).sum()
    got = blocks.set_index(["rank", "step", "unit", "phase"])["compute_ns"]
    assert (summed.reindex(got.index).to_numpy() == got.to_numpy()).all()
    assert (per_micro > 0).all()


@pytest.mark.slow
def test_fsdp2_collectives_follow_its_rules_per_micro_batch(runs) -> None:
    folder, analysis = runs["fsdp2"]
    spans = analysis.spans
    comm = spans[spans["kind"].isin(["all_gather", "reduce_scatter"])]
    counts = comm.groupby(["rank", "step", "unit", "phase", "kind"]).size()
    for rank in (0, 1):
        for step in analysis.steps:
            for unit in BLOCKS:
                assert counts.loc[(rank, step, unit, "forward", "all_gather")] == MICRO_BATCHES
                assert counts.loc[(rank, step, unit, "backward", "all_gather")] == MICRO_BATCHES
                assert counts.loc[(rank, step, unit, "backward", "reduce_scatter")] == MICRO_BATCHES
            assert counts.loc[(rank, step, "(root)", "forward", "all_gather")] == MICRO_BATCHES
            assert (rank, step, "(root)", "backward", "all_gather") not in counts.index
            assert counts.loc[(rank, step, "(root)", "backward", "reduce_scatter")] == MICRO_BATCHES
    # FSDP2's own labels: one pre_forward and one pre_backward per unit and micro-batch
    traces = load_traces([folder], cache=False)
    ev = traces.events[traces.events["step"].isin(analysis.steps)]
    names = ev["name"].astype(str).value_counts()
    n_rank_steps = 2 * len(analysis.steps)
    for unit in BLOCKS:
        assert names[f"FSDP::pre_forward ({unit})"] == MICRO_BATCHES * n_rank_steps
        assert names[f"FSDP::pre_backward ({unit})"] == MICRO_BATCHES * n_rank_steps
    assert names["FSDP::root_pre_forward"] == MICRO_BATCHES * n_rank_steps
    assert sorted(set(analysis.spans["micro"])) == [0, 1]


@pytest.mark.slow
@pytest.mark.parametrize("framework", [f for f in RUNS if "--checkpoint" in RUNS[f]])
def test_recomputed_forward_is_read_as_backward(runs, framework: str) -> None:
    """With activation checkpointing each block's forward range appears again inside its backward
    range; those ranges are recomputation (backward), not another micro-batch's forward."""
    folder, analysis = runs[framework]
    traces = load_traces([folder], cache=False)
    ev = traces.events[traces.events["step"].isin(analysis.steps) & (traces.events["kind"] == "annotation")]
    for unit in BLOCKS:
        fwd = ev[ev["name"].astype(str) == f"fsdpviz::forward ({unit})"]
        bwd = ev[ev["name"].astype(str) == f"fsdpviz::backward ({unit})"]
        b_start, b_end = bwd["start_ns"].to_numpy(), (bwd["start_ns"] + bwd["dur_ns"]).to_numpy()
        starts = fwd["start_ns"].to_numpy()
        inside = np.array([((b_start <= t) & (t < b_end) & (bwd["rank"].to_numpy() == r)).any()
                           for t, r in zip(starts, fwd["rank"].to_numpy())])
        n_rank_steps = 2 * len(analysis.steps)
        assert inside.sum() == MICRO_BATCHES * n_rank_steps  # one recomputation per micro-batch
        assert (~inside).sum() == MICRO_BATCHES * n_rank_steps  # one real forward per micro-batch
    us = analysis.unit_steps
    fwd_blocks = us[(us["phase"] == "forward") & us["unit"].isin(BLOCKS)]
    assert (fwd_blocks["n_passes"] == MICRO_BATCHES).all()


@pytest.mark.parametrize("framework", list(RUNS))
def test_traces_alone_size_each_unit_by_one_gather(runs, framework: str) -> None:
    """Read without run.json (the traces folder alone), a unit's size is what one of its all-gathers
    moved, as the recorder read it off FSDP's own modules (run.json's ``param_bytes``): each micro-batch
    gathers the unit again, and a size summed over the step's passes was twice the unit (FSDP1). A
    ZeRO-3 bucket carrying several units is no one unit's size: unknown, not the bucket's (which every
    unit was given, twice over)."""
    run_dir, _ = runs[framework]
    declared = {u["unit"]: u["param_bytes"] for u in json.loads((run_dir / "run.json").read_text())["units"]}
    alone = analyse_run(load_traces([run_dir / "traces"], cache=False))
    sizes = dict(zip(alone.units["unit"].astype(str), alone.units["param_bytes"].astype(int)))
    buckets = alone.spans[(alone.spans["kind"] == "all_gather").to_numpy() & (alone.spans["n_units"] > 1).to_numpy()]
    for unit, nbytes in declared.items():
        if unit in set(buckets["unit"].astype(str)) or nbytes <= 0:
            assert sizes.get(unit, -1) == -1, unit  # unknown
        else:
            assert sizes[unit] == nbytes, unit
    unknown = [u for u in declared if sizes.get(u, -1) == -1]
    said = [n for n in alone.notes if n.code == "unit_sizes_unknown"]
    assert bool(said) == bool(unknown) and all(u in said[0] for u in unknown[:5])
    if framework != "zero3":
        assert all(sizes[u] == n for u, n in declared.items())


@pytest.mark.parametrize("framework", ["fsdp2", "fsdp1"])
def test_run_json_says_which_units_reshard_as_the_trace_shows_them_gathered(runs, framework: str) -> None:
    """run.json's ``reshard_after_forward`` per unit is what ran: a unit gathered again in backward (the
    trace's all-gathers in its backward, every micro-batch) resharded after forward, one never gathered
    there kept its parameters. FSDP1 keeps a root's parameters whatever its sharding strategy (its
    ``_post_forward_reshard`` never frees a root's), so FULL_SHARD's root was said to reshard."""
    folder, analysis = runs[framework]
    declared = {u["unit"]: u["reshard_after_forward"] for u in json.loads((folder / "run.json").read_text())["units"]}
    spans = analysis.spans
    again = set(spans[(spans["kind"] == "all_gather").to_numpy() & (spans["phase"] == "backward").to_numpy()]["unit"])
    assert declared == {unit: unit in again for unit in declared}
    assert declared["(root)"] is False and all(declared[b] for b in BLOCKS)
