"""A script that profiles itself under ``fsdpviz record``: one process runs one torch profiler, so where
the script's own profiler and fsdpviz's profiled steps meet, the script's keeps the thread and fsdpviz
stands aside (no trace, a note saying why, the timers still run). The script's own profiler counts what
it counts in a bare run, its losses are the bare run's, and the run ends as it would bare.

Four meetings, each against a bare run of the same window (``record_scripts/own_profiler_train.py``):
the script's profiler on from step 0, before fsdpviz's profiler starts (with fsdpviz's defaults, steps
2-4 profiled, and with --warmup 0, fsdpviz's first step profiled); on from step 3, inside fsdpviz's
profiled steps; and on for steps 0-2 with --warmup 4, past the end of optimizer step 2 where fsdpviz's
profiler warm-up step begins. Before that fsdpviz's profiler is idle (no backend started, no step range
opened): the script's profiler on for steps 0-1 only meets nothing, and both traces are written. What the
script's profiler counts includes any step range (``ProfilerStep#N``) of fsdpviz's it would see: bare it
sees none.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from helpers.jobs import retried, run_job, torchrun
from recordrun import SCRIPTS, check_complete, run_record, trace_steps

SCRIPT = SCRIPTS / "own_profiler_train.py"


def _bare(tmp_path: Path, first: int, last: int) -> subprocess.CompletedProcess:
    """The script bare, tried again (up to helpers.jobs.TRIES times) where PyTorch's gloo aborted a rank at
    exit (helpers.jobs.TEARDOWN_CRASH: the script has no pause after destroy_process_group; its outputs are
    written before it)."""
    return retried(lambda: run_job(torchrun(SCRIPT, str(first), str(last), str(tmp_path / "bare")), timeout=180))


def _outputs(folder: Path) -> list[dict]:
    return [json.loads((folder / f"rank{rank}.json").read_text()) for rank in (0, 1)]


@pytest.mark.slow
@pytest.mark.lifecycle
@pytest.mark.parametrize(("first", "last", "options", "said"), [
    (0, 3, (), "ran its own torch.profiler at step 1"),  # step 0: fsdpviz idle
    (0, 3, ("--warmup", "0"), "ran its own torch.profiler at step 0"),
    (0, 2, ("--warmup", "4", "--steps", "2"), "ran its own torch.profiler at step 3"),  # on past step 3's start
    (3, 4, (), "started its own torch.profiler at step 3")])
def test_the_scripts_own_profiler_keeps_the_thread(tmp_path: Path, first: int, last: int, options: tuple[str, ...],
                                                   said: str) -> None:
    # GIVEN the script bare, profiling steps FIRST-LAST itself
    bare = _bare(tmp_path, first, last)
    assert bare.returncode == 0, bare.stderr[-3000:]
    # WHEN it is recorded
    run_dir = tmp_path / "run"
    done = run_record(run_dir, torchrun(SCRIPT, str(first), str(last), str(tmp_path / "recorded")), *options)
    # THEN it ends as bare, its own profiler counted what it counted bare, its losses are the bare ones
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    assert _outputs(tmp_path / "recorded") == _outputs(tmp_path / "bare")
    counted = _outputs(tmp_path / "bare")[0]["counted"]
    assert counted["my_step"] == last - first + 1 and not any(n.startswith("ProfilerStep") for n in counted)
    # AND fsdpviz stood aside: no trace, the timers kept, run.json says why on every rank
    run = check_complete(run_dir)
    assert run["status"] == "ok" and run["exit_code"] == 0
    assert not list((run_dir / "traces").glob("*"))
    assert all(len((run_dir / "timers" / f"rank{rank}.jsonl").read_text().splitlines()) > 0 for rank in (0, 1))
    note = next(n for n in run["notes"] if "stood aside" in n)
    assert note.startswith("every rank: no trace: the script ") and said in note, note


@pytest.mark.slow
@pytest.mark.lifecycle
def test_a_scripts_profiler_done_before_fsdpviz_warms_up_meets_nothing(tmp_path: Path) -> None:
    # GIVEN the script bare, profiling its steps 0-1 itself: with --warmup 4 fsdpviz's profiler warm-up step 3
    # begins at the end of optimizer step 2 (the script's profiler on to step 2 meets it: the case above)
    last, profiled = 1, [4, 5]
    bare = _bare(tmp_path, 0, last)
    assert bare.returncode == 0, bare.stderr[-3000:]
    # WHEN it is recorded
    run_dir = tmp_path / "run"
    done = run_record(run_dir, torchrun(SCRIPT, "0", str(last), str(tmp_path / "recorded")),
                      "--warmup", "4", "--steps", "2")
    # THEN the script's profiler counted what it counts bare (no step range of fsdpviz's), its losses are bare's
    assert done.returncode == 0, done.stderr[-3000:]
    assert _outputs(tmp_path / "recorded") == _outputs(tmp_path / "bare")
    counted = _outputs(tmp_path / "bare")[0]["counted"]
    assert counted["my_step"] == last + 1 and not any(n.startswith("ProfilerStep") for n in counted)
    # AND fsdpviz did not stand aside: each rank's trace holds the profiled steps, no note of it
    run = check_complete(run_dir)
    assert run["status"] == "ok" and run["profile"]["steps"] == profiled
    assert [sorted(trace_steps(run_dir, rank)) for rank in (0, 1)] == [profiled, profiled]
    assert not [n for n in run["notes"] if "stood aside" in n or "no trace" in n]
    # AND the steps the script's profiler was on in are not clean: 0-1, and step 2, which begins where
    # optimizer step 1 ends, before the script's loop closes its profiler; of steps 2-7 only 7 is clean
    # (3 warms fsdpviz's profiler up, 4-5 profiled, 6 follows the export and is unit-timed)
    assert [r["script_profiled_steps"] for r in run["ranks"]] == [[0, 1, 2], [0, 1, 2]]
    assert ("every rank: in step(s) 0-2 the script's own torch.profiler was on: they are not clean steps (a profiler "
            "slows them), so neither the step time nor the units' timed passes are read from them") in run["notes"]
    assert [r["observer"]["clean_steps"] for r in run["ranks"]] == [[7], [7]]
