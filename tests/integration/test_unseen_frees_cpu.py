"""The CPU peak against torch's own FSDP memory tracker, in the same run.

record_scripts/memtracker_train.py (FSDP2, CPU/gloo, 2 ranks) runs each step inside
``FSDPMemTracker`` and writes its peak. torch's CPU profiler never sees gloo's threads free a block,
and its running total never comes down: the level it wrote climbs from step to step. fsdpviz must
find those frees and report each profiled step's peak as the tracker measured it (to the byte on the
committed recording; on one made now, short of it by at most a block gloo's thread freed late), and
compare must see no climbing level.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from helpers import committed
from helpers.jobs import NO_OUTPUT
from recording import SCRIPTS, Config, Recordings

from fsdpviz.analysis.compare.memory import drift_bytes, step_levels
from fsdpviz.analysis.memory import device_samples
from fsdpviz.analysis.pipeline import analyse

pytestmark = [pytest.mark.slow, pytest.mark.recorded]

TRACKED = Config(("--steps", "7"), (*NO_OUTPUT, "--warmup", "2", "--steps", "3"),
                 script=SCRIPTS / "memtracker_train.py", output_flag="--truth", committed="memtracker-fsdp2")
MIB = 1 << 20


def test_peak_is_what_fsdp_mem_tracker_measured(recordings: Recordings) -> None:
    rec = recordings.get(TRACKED)
    assert rec.proc.returncode == 0, rec.proc.stderr[-3000:]
    truth = {rank: json.loads(Path(str(rec.losses).format(rank=rank)).read_text()) for rank in (0, 1)}
    result = analyse([rec.run_dir], cache=False)
    raw = result.traces.memory.copy()  # the profiler's samples, before the analysis settles them
    analysis = result.analysis
    steps = analysis.steps
    assert len(steps) == 3
    # the problem: the profiler's own level climbs past the truth by whole blocks, as many as gloo's
    # thread freed unseen -- a race between it and the training thread, which a run can also lose none of
    over = []
    for rank in (0, 1):
        samples = device_samples(raw, rank, "cpu")
        last = result.traces.steps[((result.traces.steps["rank"] == rank)
                                    & (result.traces.steps["step"] == max(steps))).to_numpy()].iloc[0]
        t = samples["t_ns"].to_numpy(np.int64)
        inside = samples["allocated_bytes"].to_numpy(np.int64)[(t >= last["start_ns"]) & (t < last["end_ns"])]
        over.append(int(inside.max()) - truth[rank]["peak_bytes"][max(steps)])
    lost = analysis.unseen_frees
    # which ranks lost a free is the race's; each rank whose level climbed past the truth has one found
    climbed = {rank for rank, extra in zip((0, 1), over, strict=True) if extra > 0}
    assert climbed <= set(lost["rank"]) <= {0, 1}, (over, sorted(set(lost["rank"])))
    assert (lost["free_ns"] > lost["alloc_ns"]).all()
    # every profiled step's peak, on every rank, is the tracker's (ProfilerStep N is the script's step N),
    # to the byte on the committed recording. A block gloo's thread freed unseen died at the earliest
    # where fsdpviz frees it, and whenever that thread got to it: on a recording made now beside other
    # jobs the tracker (which follows the storage itself) can count one a few milliseconds longer (an
    # all-gather output of 1,053,696 B made its peak 4,096 B higher once in three such runs), so there a
    # step's peak may read short of the tracker's by at most the largest block freed unseen in the step
    exact = committed.copy_is_read(TRACKED.committed or "", TRACKED.identity(), [TRACKED.script])
    peaks = analysis.memory_peaks
    spans = result.traces.steps
    shortest = []
    for row in peaks.itertuples():
        rank, step = int(row.rank), int(row.step)
        span = spans[((spans["rank"] == rank) & (spans["step"] == step)).to_numpy()].iloc[0]
        mine = lost[((lost["rank"] == rank) & (lost["alloc_ns"] < span["end_ns"])
                     & (lost["free_ns"] >= span["start_ns"])).to_numpy()]
        short = truth[rank]["peak_bytes"][step] - row.peak_allocated_bytes
        largest = 0 if exact or mine.empty else int(mine["bytes"].max())
        assert 0 <= short <= largest, (row, short, mine)
        shortest.append(largest)
    highest = max(truth[r]["peak_bytes"][s] for r in (0, 1) for s in steps)
    assert 0 <= highest - result.summary.to_json()["memory"]["peak_allocated_bytes"] <= max(shortest)
    # an all-gather's output freed unseen (made in FSDP2's gather label, before its collective's op) died no
    # earlier than FSDP2's copy-out of it ended (the copy-out reads it): read off the trace's own labels,
    # per rank (on the committed recording one such block of rank 1 had been let go at its collective's
    # end, 0.95 ms before its copy-out ended)
    events = result.traces.events
    names = events["name"].astype(str)
    for rank in (0, 1):
        of_rank = (events["rank"] == rank).to_numpy()
        start = events["start_ns"].to_numpy(np.int64)[of_rank]
        end = start + events["dur_ns"].to_numpy(np.int64)[of_rank]
        label = names[of_rank].to_numpy()
        gathers = [(s, e, n.split("(")[-1]) for s, e, n in zip(start, end, label) if n.startswith("FSDP::all_gather (")]
        copies = sorted((s, e, n.split("(")[-1]) for s, e, n in zip(start, end, label)
                        if n.startswith("FSDP::all_gather_copy_out ("))
        ops = [(s, e) for s, e, n in zip(start, end, label) if n.startswith("c10d::")]
        for block in lost[(lost["rank"] == rank).to_numpy()].itertuples():
            unit = next((u for s, e, u in gathers if s <= block.alloc_ns <= e), None)
            if unit is None or any(s <= block.alloc_ns <= e for s, e in ops):
                continue
            copy_end = next((e for s, e, u in copies if u == unit and s >= block.alloc_ns), None)
            assert copy_end is not None, f"no copy-out of {unit} after the gather output made at {block.alloc_ns}"
            assert block.free_ns >= copy_end or block.basis == "address_reuse", (block, copy_end)
    # the categories at the peak add up to it (nothing freed unseen is left in any of them)
    at_peak = analysis.category_peaks[(analysis.category_peaks["unit"] == "").to_numpy()]
    cats = at_peak.drop(columns=["rank", "step", "unit", "phase", "t_ns", "allocated_bytes"])
    assert np.array_equal(cats.sum(axis=1).to_numpy(), at_peak["allocated_bytes"].to_numpy())
    # compare reads the same settled levels: no climbing level between steps
    levels = step_levels(result.traces, steps)
    assert drift_bytes(levels) is None
    later = levels[(levels["step"] > min(steps)).to_numpy()]  # the first starts with the gradients before the trace
    assert later.groupby("rank")["start_bytes"].nunique().max() == 1


def test_every_view_says_what_was_not_seen_freed(recordings: Recordings, capsys: pytest.CaptureFixture[str]) -> None:
    """summary --json, the terminal, the page's headline and compare's notes count the same blocks."""
    from helpers.cli import json_here, stdout_here

    from fsdpviz.analysis.compare.runs import compare_runs
    from fsdpviz.analysis.pipeline import LabelledRun
    from fsdpviz.formatting import format_bytes
    from fsdpviz.report.data import prepare_report
    from fsdpviz.report.headline import headline_section

    rec = recordings.get(TRACKED)
    assert rec.proc.returncode == 0, rec.proc.stderr[-3000:]
    result = analyse([rec.run_dir], cache=False)
    lost = result.analysis.unseen_frees
    printed = json_here(capsys, "summary", str(rec.run_dir), "--json", "--no-cache")["memory"]["not_seen_freed"]
    text = " ".join(stdout_here(capsys, "summary", str(rec.run_dir), "--no-cache").split())
    if lost.empty:  # the race can leave every free seen: then no view speaks of any
        assert printed is None and "not seen freed" not in text
        return
    assert printed["blocks"] == len(lost) > 0
    assert printed["bytes"] == int(lost["bytes"].sum())
    assert printed["at_collective_end"] + printed["at_address_reuse"] == len(lost)
    assert f"not seen freed {len(lost)} block(s), {format_bytes(printed['bytes'])}" in text
    facts = {f.label: f for f in headline_section(prepare_report(result)).facts}
    assert facts["not seen freed"].value == format_bytes(printed["bytes"])
    other = analyse([rec.run_dir], cache=False)
    notes = compare_runs([LabelledRun(label="a", source=str(rec.run_dir), result=result),
                          LabelledRun(label="b", source=str(rec.run_dir), result=other)]).notes
    assert sum(n.startswith(("a: not seen freed", "b: not seen freed")) for n in notes) == 2
    assert not any("climbs" in n for n in notes)
