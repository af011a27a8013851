"""Collectives of two gloo groups that move tensors of one size, told apart by group.

``record_scripts/groups_train.py`` issues, every step on rank 0, an all-gather on group ``first``
and then one of the same size on group ``second``; ``first``'s gloo workers are held by all-reduces
that rank 1 joins later, so ``second``'s all-gather ends first. The truth is the script's own: the
groups' names, and per step how much later ``first``'s all-gather ended than ``second``'s (its clock,
read as gloo completes each work's future). Paired by size in issue order, ``first``'s call would get ``second``'s run:
its end ~150 ms too early. The recording is read from its committed copy (helpers/committed.py;
``make test-recordings`` records it now).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pandas as pd
import pytest
from helpers.committed import recorded_once
from helpers.jobs import NO_OUTPUT, fsdpviz, record_env, retried, torchrun
from helpers.once import session_root
from recording import SCRIPTS

from fsdpviz import vocabulary
from fsdpviz.analysis.pipeline import RunResult, analyse
from fsdpviz.structure import crossrank
from fsdpviz.structure.collectives import find_collectives

pytestmark = [pytest.mark.slow, pytest.mark.recorded]

# The script's clock, read in each work's future callback on the gloo thread that ran it, against the
# trace's gloo op ends: 0.01-0.07 ms apart over eight steps, three of them beside three processes spinning
# on the two cores (a thread waiting on the work read it up to 24 ms late there); 10.0 ms once, in a fresh
# clone's `make test` beside another analysis and its benchmark, where a gloo thread was preempted
# between its op's end and the callback. Pairing by size would be off by twice the lag (~300 ms), the
# other way: 20 ms tells the two apart fifteen times over.
LAG_TOLERANCE_MS = 20.0
# The job, and what its committed copy is recorded from (helpers/committed.py): one place for both.
RANKS = 2
TRAIN_ARGS = ("--steps", "5")
RECORD_OPTIONS = (*NO_OUTPUT, "--warmup", "2", "--steps", "2")


@pytest.fixture(scope="module")
def groups_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict, RunResult]:
    folder = session_root(tmp_path_factory) / "groups"
    run_dir, truth = folder / "run", folder / "truth.json"

    def make() -> dict[str, subprocess.CompletedProcess | None]:
        command = torchrun(SCRIPTS / "groups_train.py", *TRAIN_ARGS, "--truth", str(truth), nproc=RANKS)
        return {"proc": retried(lambda: fsdpviz("record", "--out", str(run_dir), *RECORD_OPTIONS, "--", *command,
                                                env=record_env(), timeout=600),
                                tidy=lambda: shutil.rmtree(run_dir, ignore_errors=True))}

    identity = {"ranks": RANKS, "train_args": [*TRAIN_ARGS, "--truth"], "record_options": list(RECORD_OPTIONS)}
    proc = recorded_once(folder, "groups", identity, [SCRIPTS / "groups_train.py"], make)["proc"]
    assert proc is not None and proc.returncode == 0, proc.stderr[-3000:] if proc else ""
    return run_dir, json.loads(truth.read_text()), analyse([run_dir], cache=False)


def _gathers(result: RunResult, numel: int) -> pd.DataFrame:
    """The script's all-gathers (2 ranks x ``numel`` floats gathered) as fsdpviz found them."""
    coll = find_collectives(result.traces.events, result.traces.lanes)
    mine = (coll["comm"] == vocabulary.ALL_GATHER) & (coll["bytes"] == 2 * numel * 4)
    return coll[mine.to_numpy()]


def test_same_size_collectives_pair_by_group(groups_run: tuple[Path, dict, RunResult]) -> None:
    _, truth, result = groups_run
    first, second = truth["groups"]["first"], truth["groups"]["second"]
    gathers = _gathers(result, truth["numel"])
    rank0 = gathers[gathers["rank"] == 0]
    steps = sorted(set(rank0["step"].tolist()))
    assert steps == list(result.summary.steps) and len(steps) >= 2
    for step in steps:
        rows = rank0[rank0["step"] == step].set_index("pg")
        assert sorted(rows.index) == sorted([first, second]), rows
        # the script issued first's before second's on rank 0
        assert rows.loc[first, "issue_ns"] < rows.loc[second, "issue_ns"]
        # and first's ended that much later, by the script's own clock
        lag_ms = (rows.loc[first, "end_ns"] - rows.loc[second, "end_ns"]) / 1e6
        expected = truth["first_ends_after_second_ms"][step]
        assert expected > 100, truth  # the setup held first's workers, or the test proves nothing
        assert abs(lag_ms - expected) < LAG_TOLERANCE_MS, (step, lag_ms, expected)
        # each ran on its own group's gloo workers
        assert rows.loc[first, "lane"] != rows.loc[second, "lane"]


def test_ranks_match_each_group_s_collective(groups_run: tuple[Path, dict, RunResult]) -> None:
    """Across ranks the k-th all-gather of a group in a step is one collective: both ranks name both
    groups, and each match ends at about one instant on both ranks (a collective ends together)."""
    _, truth, result = groups_run
    gathers = crossrank.with_seq(_gathers(result, truth["numel"]))
    by_rank = [gathers[gathers["rank"] == r] for r in (0, 1)]
    matched = by_rank[0].merge(by_rank[1], on=crossrank.KEY, suffixes=("_0", "_1"))
    assert set(matched["pg"]) == set(truth["groups"].values())
    assert len(matched) == 2 * len(result.summary.steps)
    # the runs overlap in time on both ranks: the same collective (a swapped pair ends ~150 ms apart)
    assert ((matched["end_ns_0"] - matched["end_ns_1"]).abs() < 50e6).all(), matched
