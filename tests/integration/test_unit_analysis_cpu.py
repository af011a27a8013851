"""Per-unit analysis of real 2-rank CPU/gloo recordings that use explicit prefetch.

The recordings are example runs of ``recording.py`` (``test_record.py`` checks the FSDP1 one's run
folder too): the example trainer with three blocks, FSDP2 ``--prefetch 1``
(``set_modules_to_forward_prefetch`` / ``set_modules_to_backward_prefetch`` one unit ahead), FSDP1
``--prefetch 1`` (``forward_prefetch=True``) and DeepSpeed ZeRO-3 ``--prefetch 1`` (a prefetch bucket
of one block; blocks as ZeRO-3 leaf modules), optimizer steps 2-5 profiled and analysed (fsdpviz's
own traces hold every profiled step complete). Independent facts: the prefetch setting the trainer was given (and run.json
reports), FSDP2's own ``FSDP::forward_prefetch for X`` labels, the ProfilerStep ranges (step time),
and ``fsdpviz export`` reproducing the same numbers from the run folder.
"""

from __future__ import annotations

import importlib.util
import json
import runpy
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from helpers.jobs import EXAMPLE, REPO
from recording import EXAMPLE_RUNS, LAYERS, PROFILED, Recordings

from fsdpviz.analysis.run import RunAnalysis, analyse_run
from fsdpviz.structure.intervals import intersect_intervals, subtract_intervals, total_ns, union_intervals
from fsdpviz.trace import load_traces

pytestmark = pytest.mark.recorded

RECORDINGS = {"fsdp2": EXAMPLE_RUNS["fsdp2-prefetch"], "fsdp1": EXAMPLE_RUNS["fsdp1"]}
if importlib.util.find_spec("deepspeed") is not None:
    RECORDINGS["zero3"] = EXAMPLE_RUNS["zero3-block"]
FRAMEWORKS = list(RECORDINGS)
BLOCKS = [f"blocks.{i}" for i in range(LAYERS)]
ANALYSED_STEPS = PROFILED  # every profiled step: fsdpviz's traces hold them complete


@pytest.fixture(scope="module")
def runs(recordings: Recordings) -> dict[str, tuple[Path, RunAnalysis]]:
    out = {}
    for framework, config in RECORDINGS.items():
        rec = recordings.get(config)
        assert rec.proc.returncode == 0, rec.proc.stderr[-2000:]
        out[framework] = (rec.run_dir, analyse_run(load_traces([rec.run_dir], cache=False)))
    return out


@pytest.mark.slow
@pytest.mark.parametrize("framework", ["fsdp2", "fsdp1"])
def test_explicit_prefetch_gathers_one_unit_ahead(runs, framework: str) -> None:
    _, analysis = runs[framework]
    us = analysis.unit_steps
    blocks = us[(us["phase"] == "forward") & us["unit"].str.startswith("blocks.")]
    later = blocks[blocks["unit"] != "blocks.0"]
    assert analysis.steps == ANALYSED_STEPS
    assert len(later) == (LAYERS - 1) * len(analysis.steps) * 2  # blocks after the first, two ranks, every step
    assert (later["issue_depth"] == 1).all()
    # issued before the previous block started computing, by the previous block
    for (_, _), rows in blocks.groupby(["rank", "step"]):
        rows = rows.sort_values("compute_start_ns")
        assert (rows["ag_issue_ns"].to_numpy()[1:] < rows["compute_start_ns"].to_numpy()[:-1]).all()
        assert (rows["ag_issue_ns"].to_numpy()[1:] > rows["window_start_ns"].to_numpy()[:-1]).all()
    stats = analysis.unit_stats.set_index("unit")
    assert (stats.loc[BLOCKS[1:], "forward_issue_depth"] == 1).all()


@pytest.mark.slow
@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_run_json_reports_the_prefetch_the_trainer_was_given(runs, framework: str) -> None:
    folder, _ = runs[framework]
    units = {u["unit"]: u for u in json.loads((folder / "run.json").read_text())["units"]}
    if framework == "fsdp2":  # every unit prefetches the next one in forward order and the previous one in backward
        for order, key in ((["(root)", *BLOCKS], "forward_prefetch"),
                           (["(root)", *reversed(BLOCKS)], "backward_prefetch")):
            for unit, following in zip(order, [*order[1:], None]):
                assert units[unit][key] == ([following] if following else "default"), (unit, key)
    elif framework == "fsdp1":
        assert all(units[u]["forward_prefetch"] is True and units[u]["backward_prefetch"] == "BACKWARD_PRE"
                   for u in ["(root)", *BLOCKS])
    else:  # the bucket the example's own DeepSpeed config asks for: one block's parameters
        example = runpy.run_path(str(EXAMPLE))
        args = example["parse_args"](list(RECORDINGS["zero3"].train_args))
        bucket = example["deepspeed_config"](example["build_model"](args), args)["zero_optimization"][
            "stage3_prefetch_bucket_size"]
        assert bucket == units["blocks.0"]["param_numel"] > 0
        fetched = [u for u in units.values() if u["param_numel"] > 0]
        assert fetched and all(u["forward_prefetch"] == bucket == u["backward_prefetch"] for u in fetched)


@pytest.mark.slow
@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_every_block_unit_gathers_computes_and_reduces(runs, framework: str) -> None:
    stats = runs[framework][1].unit_stats.set_index("unit")
    for col in ("all_gather_ns", "forward_ns", "backward_ns", "reduce_scatter_ns"):
        assert (stats.loc[BLOCKS, col] > 0).all(), col


# The script's own code in the step, by what the example's F.cross_entropy leaves in a CPU trace:
# the loss's forward op and its two backward nodes (which zero and fill a tokens x vocabulary gradient).
LOSS_OPS = ("aten::cross_entropy_loss", "autograd::engine::evaluate_function: NllLossBackward0",
            "autograd::engine::evaluate_function: LogSoftmaxBackward0")


def _script_ns(analysis: RunAnalysis, events: pd.DataFrame, rank: int, lo: int, hi: int) -> int:
    """Of the step ``[lo, hi)`` on ``rank`` (reference clock), the time that is the script's loss
    outside every framework and fsdpviz range, or that the main thread spent in no profiled op at all
    (Python between calls, a collection, the thread waiting for a core), inside a unit's range or not:
    such a gap inside a unit's forward is none of the unit's ops."""
    shift = analysis.clock.set_index("rank")
    offset = int(shift.loc[rank, "offset_ns"]) if bool(shift.loc[rank, "applied"]) else 0
    main = events[(events["rank"] == rank) & (events["lane"] == "main") & (events["kind"] == "cpu_op")]
    starts = main["start_ns"].to_numpy(np.int64) - offset
    ends = starts + main["dur_ns"].to_numpy(np.int64)
    step = (np.array([lo]), np.array([hi]))
    idle = subtract_intervals(step, union_intervals(starts, ends))
    loss = main["name"].isin(LOSS_OPS).to_numpy()
    labels = analysis.labels[analysis.labels["rank"] == rank]
    outside = subtract_intervals(intersect_intervals(union_intervals(starts[loss], ends[loss]), step),
                                 union_intervals(labels["start_ns"].to_numpy(), labels["end_ns"].to_numpy()))
    return total_ns(union_intervals(np.concatenate([idle[0], outside[0]]), np.concatenate([idle[1], outside[1]])))


@pytest.mark.slow
@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_unit_compute_framework_and_optimizer_reconcile_with_step_time(runs, framework: str) -> None:
    """The step's categories never overlap, and what they leave ("other") is the script's own code:
    its loss, or time its main thread ran no profiled op (between a unit's ops too: on a loaded core
    the thread waits for it there). How large that is hangs on the machine (a loaded core stretches
    the loss's fill of a fresh gradient), so the check is what "other" holds, read from the raw
    trace, not its share of the step: no op of a unit, the framework or the optimizer."""
    folder, analysis = runs[framework]
    times = analysis.step_times
    assert len(times) == 2 * len(ANALYSED_STEPS)  # two ranks, steps 6-9
    attributed = times["unit_compute_ns"] + times["framework_ns"] + times["optimizer_ns"]
    assert (attributed <= times["step_ns"]).all()
    events = load_traces([folder], cache=False).events
    script = np.array([_script_ns(analysis, events, int(r.rank), int(r.start_ns), int(r.end_ns))
                       for r in times.itertuples()])
    # every op the units, the framework or the optimizer ran is attributed: within 1 % of the step
    # (the data's few ops, a loss.item())
    excess = (times["other_ns"].to_numpy() - script) / times["step_ns"].to_numpy()
    assert (excess <= 0.01).all(), times.assign(script_ns=script).to_string()
    if framework == "zero3":  # the root's own code (embeddings, head) is a unit's compute, not "other"
        stats = analysis.unit_stats.set_index("unit")
        assert stats.loc["(root)", "param_numel"] == 0 and stats.loc["(root)", "forward_ns"] > 0


@pytest.mark.slow
def test_fsdp2_prefetch_labels_name_the_unit_gathered_next(runs) -> None:
    folder, analysis = runs["fsdp2"]
    traces = load_traces([folder], cache=False)
    names = set(traces.events["name"].astype(str))
    assert {f"FSDP::forward_prefetch for {unit}" for unit in BLOCKS[1:]} <= names
    spans = analysis.spans
    gathers = spans[(spans["kind"] == "all_gather") & (spans["phase"] == "forward")]
    assert set(gathers["unit"]) == {"(root)", *BLOCKS}


@pytest.mark.slow
def test_export_of_a_recorded_run_matches_the_analysis(runs, tmp_path: Path) -> None:
    folder, analysis = runs["fsdp1"]
    out = tmp_path / "tables"
    # the console command in a fresh process: the only successful export outside this test process
    done = subprocess.run([sys.executable, "-m", "fsdpviz", "export", str(folder), "-o", str(out), "--no-cache"],
                          check=False, capture_output=True, text=True, timeout=300, cwd=REPO)
    assert done.returncode == 0, done.stderr
    units = pd.read_parquet(out / "units.parquet").set_index("unit")
    want = analysis.unit_stats.set_index("unit")
    assert list(units.index) == list(want.index)
    assert (units["forward_ns"] == want["forward_ns"]).all()
    assert (units["framework"] == "fsdp1").all()
    spans = pd.read_parquet(out / "spans.parquet")
    assert len(spans) == len(analysis.spans)
