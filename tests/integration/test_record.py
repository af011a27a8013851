"""``fsdpviz record`` on real 2-rank CPU/gloo runs of the example trainer (FSDP2, FSDP1, ZeRO-3).

Each test checks a real ``torchrun`` job's run folder against independent facts: the model's own
module names and parameter counts, the frameworks' own labels, the losses of the same job run
without fsdpviz, the exit code of the command. The three frameworks' recordings are example runs of
``recording.py`` (``test_unit_analysis_cpu.py`` analyses the FSDP1 one too); the expectations here
follow from their arguments. The FSDP1 and ZeRO-3 run folders are read from their committed copies
(marker ``recorded``), which the recorder made under the same launchers: what they are checked for here
is what the recorder wrote; ``make test-recordings`` records them now, and only a job recorded now is
held to its bare run's losses. FSDP2's is recorded in every session.
"""

from __future__ import annotations

import gzip
import importlib.util
import json
import re
import runpy
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from helpers.cli import json_here
from helpers.jobs import EXAMPLE, NO_OUTPUT, REPO, record_env, retried, run_job, torchrun, unused_port
from recording import (
    EXAMPLE_RUNS,
    LAYERS,
    MODEL,
    PROFILED,
    SCRIPTS,
    STEPS,
    UNPROFILED,
    Config,
    Recording,
    Recordings,
    record,
)

from fsdpviz.record.options import LAUNCHER_VARIABLES
from fsdpviz.structure.profiler_cost import NOISE_SLOWDOWN

TINY = ["--layers", "2", "--dim", "32"]
BLOCKS = [f"blocks.{i}" for i in range(LAYERS)]


def _losses(pattern: Path) -> dict[int, list[str]]:
    return {rank: Path(str(pattern).format(rank=rank)).read_text().split("\n")[:-1] for rank in (0, 1)}


def _trace(run_dir: Path, rank: int) -> dict[str, Any]:
    with gzip.open(run_dir / "traces" / f"rank{rank}.trace.json.gz", "rt") as f:
        return json.load(f)


def _annotations(trace: dict[str, Any]) -> set[str]:
    return {e["name"] for e in trace["traceEvents"] if e.get("cat") == "user_annotation"}


def _timers(run_dir: Path, rank: int) -> list[dict[str, Any]]:
    lines = (run_dir / "timers" / f"rank{rank}.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def _model_units(train_args: tuple[str, ...] | list[str]) -> Any:
    """The example model as built for these flags (parameter counts are independent of sharding)."""
    example = runpy.run_path(str(EXAMPLE))
    return example["build_model"](example["parse_args"](list(train_args)))


def _check_run(rec: Recording, framework: str, expected_units: list[str], labels: list[str]) -> dict[str, Any]:
    """Everything every recorded framework must satisfy; returns run.json."""
    run_dir, proc = rec.run_dir, rec.proc
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = json.loads((run_dir / "run.json").read_text())
    assert run["status"] == "ok" and run["exit_code"] == 0 and run["reason"] == ""
    assert run["framework"] == framework
    assert run["world_size"] == 2 and [r["rank"] for r in run["ranks"]] == [0, 1]
    assert run["profile"] == {"schedule": "optimizer_steps", "steps": PROFILED, "warmup": PROFILED[0],
                              "requested_steps": len(PROFILED), "unit_timer_steps": 1,
                              "unit_timed_steps": [PROFILED[-1] + 1]}
    assert set(run["versions"]) >= {"python", "torch", "fsdpviz"} and run["versions"]["torch"].startswith("2.")
    assert [u["unit"] for u in sorted(run["units"], key=lambda u: u["order"])] == expected_units
    for rank in (0, 1):
        info = run["ranks"][rank]
        assert info["status"] == "ok" and info["trace"] == f"traces/rank{rank}.trace.json.gz"
        trace = _trace(run_dir, rank)
        assert trace["distributedInfo"]["rank"] == rank and trace["distributedInfo"]["world_size"] == 2
        names = _annotations(trace)
        assert {f"ProfilerStep#{s}" for s in PROFILED} <= names and f"ProfilerStep#{PROFILED[0] - 1}" not in names
        missing = [label for label in labels if label not in names]
        assert not missing, f"rank {rank}: labels missing from the trace: {missing}"
        records = _timers(run_dir, rank)
        whole = {r["step"]: r["ms"] for r in records if r["unit"] == "" and r["phase"] == "step" and r["kind"] == "total"}
        assert sorted(whole) == list(range(STEPS)) and all(ms > 0 for ms in whole.values())
        peaks = [r for r in records if r["kind"] == "peak_rss"]
        assert len(peaks) == STEPS and all(r["bytes"] > 10_000_000 and r["ms"] is None for r in peaks)
    return run


def _check_same_losses(tmp_path: Path, rec: Recording) -> None:
    """The recorded job's losses against the same job run bare now, bit for bit: on a recording made in
    this session only, on this machine (a committed copy's losses are another machine's, whose CPU may
    round differently; ``make test-recordings`` checks those jobs recorded now)."""
    if rec.from_copy:
        assert len(_losses(rec.losses)[0]) == STEPS
        return
    recorded, unrecorded = _losses(rec.losses), _losses(rec.unrecorded_losses(tmp_path))
    assert len(recorded[0]) == STEPS
    assert recorded == unrecorded  # float.hex of every loss: bit for bit


@pytest.mark.slow
def test_record_fsdp2_run_folder_units_timers_and_identical_losses(recordings: Recordings, tmp_path: Path) -> None:
    rec = recordings.get(EXAMPLE_RUNS["fsdp2"])
    run_dir, proc = rec.run_dir, rec.proc
    # the terminal summary of the run, on stderr: stdout is the script's own (its loss lines)
    assert "framework" in proc.stderr and "fsdp2" in proc.stderr and "framework" not in proc.stdout
    labels = ["FSDP::pre_forward (blocks.0)", "FSDP::all_gather (blocks.1)", "FSDP::post_backward_reduce (blocks.0)"]
    run = _check_run(rec, "fsdp2", ["(root)", *BLOCKS], labels)
    # every trace names its recording, as run.json does (the loader tells recordings apart by it)
    assert re.fullmatch(r"[0-9a-f]{16}", run["run_id"]) and run["command_log"] is None
    assert [_trace(run_dir, rank).get("fsdpvizRunId") for rank in (0, 1)] == [run["run_id"]] * 2

    model = _model_units(rec.config.train_args)
    by_name = {u["unit"]: u for u in run["units"]}
    for name in BLOCKS:
        numel = sum(p.numel() for p in model.get_submodule(name).parameters())
        assert by_name[name]["param_numel"] == numel and by_name[name]["param_bytes"] == 4 * numel
        assert by_name[name]["reshard_after_forward"] is True
        assert by_name[name]["shard_size"] == 2  # the whole world: not HSDP
    root_numel = sum(p.numel() for p in model.parameters()) - sum(p.numel() for p in model.blocks.parameters())
    assert by_name["(root)"]["param_numel"] == root_numel
    assert all(u["forward_prefetch"] == "default" == u["backward_prefetch"] for u in run["units"])  # implicit

    unit_timed = run["profile"]["unit_timed_steps"]
    for rank in (0, 1):
        records = _timers(run_dir, rank)
        # units are timed in the profiled steps and the unit-timed step (the one after the trace export)
        assert set(unit_timed) == {PROFILED[-1] + 1}
        assert {r["step"] for r in records if r["unit"]} == {*PROFILED, *unit_timed}
        for step in [*PROFILED, *unit_timed]:
            kinds = {(r["unit"], r["phase"], r["kind"]) for r in records if r["step"] == step}
            for unit in BLOCKS:
                assert {(unit, "forward", "total"), (unit, "forward", "compute"), (unit, "forward", "all_gather"),
                        (unit, "backward", "total"), (unit, "backward", "reduce_scatter")} <= kinds, (step, unit)
            unit_ms = [r for r in records if r["step"] == step and r["unit"] == "blocks.0" and r["phase"] == "forward"]
            ms = {r["kind"]: r["ms"] for r in unit_ms}
            assert ms["compute"] + ms["all_gather"] <= ms["total"] + 1e-3

    # report.html, as `fsdpviz record` writes by default, names every unit
    assert f"fsdpviz: report: {run_dir / 'report.html'}" in proc.stderr
    page = (run_dir / "report.html").read_text(encoding="utf-8")
    assert all(unit in page for unit in BLOCKS)
    _check_same_losses(tmp_path, rec)


# --stack on one profiled step: the trace of a stack-recorded step is several times larger
STACK_RUN = Config(("--framework", "fsdp2", "--wrap", "block", *MODEL), (*NO_OUTPUT, "--steps", "1", "--stack"),
                   committed="fsdp2-stack")


@pytest.mark.slow
@pytest.mark.recorded
def test_record_stack_puts_each_ops_source_and_module_in_the_trace_and_leaves_the_analysis(
        recordings: Recordings, capsys: pytest.CaptureFixture[str]) -> None:
    """``--stack``: the traces hold the script's own frames and one module range per block in the
    profiled step's forward (the model has LAYERS blocks), and what fsdpviz reads of the run is what it
    reads without stacks: the same units, two gathers per block (forward, and backward after
    resharding), one reduce-scatter, no Python frame taken for work."""
    rec = recordings.get(STACK_RUN)
    assert rec.proc.returncode == 0, rec.proc.stderr[-3000:]
    run = json.loads((rec.run_dir / "run.json").read_text())
    assert run["options"]["stack"] is True and run["profile"]["steps"] == [2]
    for rank in (0, 1):
        events = _trace(rec.run_dir, rank)["traceEvents"]
        frames = [e["name"] for e in events if e.get("cat") == "python_function"]
        assert any(re.fullmatch(r"train\.py\(\d+\): forward", f) for f in frames)
        blocks = [f for f in frames if re.fullmatch(r"nn\.Module: FSDPBlock_\d+", f)]
        # every block's forward, once (no checkpointing: no recomputation)
        assert len(blocks) == LAYERS and len(set(blocks)) == LAYERS
    from fsdpviz.analysis.pipeline import analyse

    result = analyse([rec.run_dir], cache=False)
    spans = result.analysis.spans
    for kind, per_block in (("all_gather", 2), ("reduce_scatter", 1)):
        counts = spans[spans["kind"] == kind].groupby(["rank", "step", "unit"]).size()
        assert {(rank, step) for rank, step, _ in counts.index} == {(0, 2), (1, 2)}
        assert all(counts[(rank, 2, unit)] == per_block for rank in (0, 1) for unit in BLOCKS)
    summary = json_here(capsys, "summary", "--json", str(rec.run_dir))
    assert [u["name"] for u in summary["units"]] == ["(root)", *BLOCKS]
    bound = summary["bound"]
    # the split adds up to the step: no Python frame counted twice as work
    parts = sum(bound[k] or 0.0 for k in ("compute_ms", "fsdp_overhead_ms", "exposed_comm_ms", "host_wait_ms",
                                           "other_idle_ms"))
    assert parts == pytest.approx(bound["step_ms"], rel=1e-3)


@pytest.mark.slow
def test_record_default_schedule_times_the_steps_after_the_window_for_the_headline(recordings: Recordings) -> None:
    """The default schedule times the steps after the profiled window (the one right after the trace
    export left out) unprofiled; the headline's step
    time is theirs, as the timers file's own step records (wall clock) say, or the traced step with a
    note when the profiled steps came out faster (a shared machine's noise)."""
    from fsdpviz.analysis.pipeline import analyse

    rec = recordings.get(EXAMPLE_RUNS["fsdp2"])
    assert rec.proc.returncode == 0, rec.proc.stderr[-3000:]
    summary = analyse([rec.run_dir], cache=False).summary
    wall: dict[int, dict[int, float]] = {}
    for rank in (0, 1):
        wall[rank] = {r["step"]: r["ms"] for r in _timers(rec.run_dir, rank)
                      if r["unit"] == "" and r["phase"] == "step" and r["kind"] == "total"}
        assert sorted(wall[rank]) == list(range(STEPS))  # every step timed, profiled or not
    cost = summary.profiler
    assert cost is not None and cost.profiled_steps == PROFILED
    assert cost.unprofiled_steps == UNPROFILED and len(UNPROFILED) >= 3
    assert cost.fewest_unprofiled_steps == len(UNPROFILED)
    assert cost.left_out_steps == sorted({0, 1, PROFILED[0] - 1, PROFILED[-1] + 1})
    unprofiled = statistics.median(statistics.median(wall[r][s] for s in UNPROFILED) for r in (0, 1))
    profiled = statistics.median(statistics.median(wall[r][s] for s in PROFILED) for r in (0, 1))
    assert cost.unprofiled_step_ms == pytest.approx(unprofiled, abs=1e-3)
    # the slowdown is the traced step's (one figure for it); whether the timers lead is their own call
    assert cost.profiled_step_ms == summary.traced_step_time_ms
    assert cost.slowdown == pytest.approx(summary.traced_step_time_ms / unprofiled, abs=1e-3)
    # the clean steps lead, whatever the profiled window's pace; where the timers timed the profiled
    # steps faster (the ratio as the run states it: just under 0.95 reads 0.950, within noise), a note
    # says the two windows ran at different paces and the profiler's share is not known
    assert summary.step_time_source == "timers" and summary.step_time_ms == pytest.approx(unprofiled, abs=1e-3)
    faster = [n for n in summary.notes if "cannot make a step faster" in n]
    if round(profiled / unprofiled, 3) >= NOISE_SLOWDOWN:
        assert not faster and cost.share_ms is not None
    else:
        assert len(faster) == 1 and cost.share_ms is None


# A step of the example trainer with many units (24 blocks of width 32): per-unit work in every step would
# weigh most there.
MANY_UNITS = Config(("--framework", "fsdp2", "--wrap", "block", "--layers", "24", "--dim", "32", "--seed", "0",
                     "--steps", "14"), NO_OUTPUT)


def _kind_of_steps(run: dict[str, Any], rank: int) -> tuple[set[int], set[int]]:
    """(the rank's clean steps, its unit-timed steps) as run.json names them."""
    info = run["ranks"][rank]
    return set(info["observer"]["clean_steps"]), set(info["unit_timed_steps"])


@pytest.mark.slow
@pytest.mark.parametrize("which", ["example", "24 blocks"])
def test_record_clean_steps_are_bare_and_the_agent_measures_its_own_cost(which: str, recordings: Recordings) -> None:
    """In a clean CPU step the recorder marks the step's ends and its three phases and nothing else: the
    timers hold no unit of it (each timed interval is a record), and the agent's own time there, measured
    by the agent (run.json ``ranks[].observer``), is at most 1 % of the step in at least half of them. The
    three phases add up to no more than the step, by the timers' own clock. The unit-timed step after the trace export still times
    every unit, so per-unit timer figures come out."""
    from fsdpviz.analysis.pipeline import analyse

    rec = recordings.get(EXAMPLE_RUNS["fsdp2"] if which == "example" else MANY_UNITS)
    assert rec.proc.returncode == 0, rec.proc.stderr[-3000:]
    run = json.loads((rec.run_dir / "run.json").read_text())
    profiled = run["profile"]["steps"]
    assert run["profile"]["unit_timed_steps"] == [profiled[-1] + 1]  # the step after the trace export
    units = {u["unit"] for u in run["units"]}
    for rank in (0, 1):
        clean, unit_timed = _kind_of_steps(run, rank)
        steps = {r["step"] for r in _timers(rec.run_dir, rank)}
        assert clean == {s for s in steps if s > profiled[-1] + 1}  # every step after the unit-timed one
        assert len(clean) >= 3
        phases: dict[int, dict[str, float]] = {}
        for line in _timers(rec.run_dir, rank):
            if line["step"] in clean:
                assert line["unit"] == "", line  # no unit
                assert line["kind"] in ("total", "peak_rss") and line.get("n", 1) == 1, line
                assert line["phase"] in ("step", "forward", "backward", "optimizer"), line
                if line["kind"] == "total":
                    phases.setdefault(line["step"], {})[line["phase"]] = line["ms"]
        for step, times in phases.items():
            assert set(times) == {"step", "forward", "backward", "optimizer"}, (step, times)
            assert times["forward"] + times["backward"] + times["optimizer"] <= times["step"], (step, times)
        timed = {r["unit"] for r in _timers(rec.run_dir, rank) if r["step"] in unit_timed and r["unit"]}
        assert timed == units  # every unit timed in the unit-timed step
        observer = run["ranks"][rank]["observer"]
        assert observer["unit_intervals_max"] == 0 and observer["cuda_events_max"] == 0  # a CPU run
        assert observer["pass_through_calls_per_step"] >= 4 * (len(units) - 1)  # FSDP's hooks, straight through
        # at least half of the rank's clean steps: a step can catch the machine's load inside the agent's own
        # code (beside the rest of make test, two of four clean steps took 2.4-2.6 ms, the others 0.16-0.22),
        # where an agent that did a unit-timed step's work in every clean step would cost every one of them
        step_ms = {r["step"]: r["ms"] for r in _timers(rec.run_dir, rank)
                   if r["unit"] == "" and r["phase"] == "step" and r["kind"] == "total"}
        shares = [ms / step_ms[s] for s, ms in zip(observer["clean_steps"], observer["agent_ms"], strict=True)]
        assert 0 < observer["agent_ms_median"] and all(ms > 0 for ms in observer["agent_ms"]), observer
        assert sum(share <= 0.01 for share in shares) >= len(shares) / 2, (shares, observer)
    summary = analyse([rec.run_dir], cache=False).summary
    assert all(u.forward_timer_ms is not None and u.forward_timer_ms > 0 for u in summary.units if u.name != "(root)")
    assert summary.profiler is not None and set(summary.profiler.unprofiled_steps) == _kind_of_steps(run, 0)[0]


@pytest.mark.slow
def test_record_leaves_what_the_script_reads_of_itself_as_a_bare_run_has_it(tmp_path: Path) -> None:
    """A script that reads its own process every step (peak RSS, RNG state, grad mode, cuDNN / TF32 flags,
    threads, its environment, PYTHONPATH, sys.path) and after its last step (gloo's worker threads' names,
    torch.distributed's group functions unwrapped) reads the same under ``fsdpviz record`` as bare,
    but for the RSS itself, which the profiler's buffers raise: its peak counter is never reset, so the
    256 MiB the script allocates in step 6 stays in its peak in every later step, as bare. fsdpviz's own
    per-step peak of the step that holds the spike is exact (the script allocates it after its optimizer
    step, which ends fsdpviz's step 6: the spike is in fsdpviz's step 7). The user's own PYTHONPATH names
    fsdpviz through a symlink (a home on a linked file system): the ranks import fsdpviz by that path while
    the recorder put its bootstrap there by the real one, and the script still sees its own PYTHONPATH."""
    script = SCRIPTS / "self_watch_train.py"
    run_dir = tmp_path / "run"
    checkout = tmp_path / "checkout"
    checkout.symlink_to(REPO, target_is_directory=True)
    env = record_env(PYTHONPATH=str(checkout))
    # fsdpviz sets Arrow's allocator for its own process: this worker may hold it from an earlier test that
    # ran the command line in-process, and a user who never set it must not see it in the script
    env.pop("ARROW_DEFAULT_MEMORY_POOL", None)
    proc = record(run_dir, torchrun(script, "--steps", "9", "--spike-step", "6",
                                    "--out", str(tmp_path / "recorded-{rank}.jsonl")), env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    bare = retried(lambda: run_job(torchrun(script, "--steps", "9", "--spike-step", "6",
                                            "--out", str(tmp_path / "bare-{rank}.jsonl")), env=env))
    assert bare.returncode == 0, bare.stderr[-3000:]
    spike = 256 << 20
    for rank in (0, 1):
        seen = {kind: [json.loads(line) for line in (tmp_path / f"{kind}-{rank}.jsonl").read_text().splitlines()]
                for kind in ("recorded", "bare")}
        for recorded, plain in zip(seen["recorded"], seen["bare"], strict=True):
            assert {k: v for k, v in recorded.items() if k != "peak_rss"} == {k: v for k, v in plain.items()
                                                                              if k != "peak_rss"}
        for lines in seen.values():
            peaks = [line["peak_rss"] for line in lines if "peak_rss" in line]
            assert peaks == sorted(peaks)  # a peak counter nobody resets never goes down
            assert peaks[6] - peaks[5] >= 0.9 * spike and min(peaks[6:]) >= spike
        own = {r["step"]: r for r in _timers(run_dir, rank) if r["kind"] == "peak_rss"}
        assert own[7]["bound"] == "exact" and own[7]["bytes"] >= spike
        assert own[7]["bytes"] == pytest.approx(seen["recorded"][6]["peak_rss"], rel=0.02)
        assert own[6]["bytes"] < own[7]["bytes"] - 0.9 * spike
        assert all(own[s]["bound"] in ("exact", "at_most") for s in own)



@pytest.mark.slow
def test_cpu_other_idle_is_said_of_the_compute_thread(tmp_path: Path) -> None:
    """A gloo CPU run whose largest loss is other idle says it of the compute thread. The script sleeps
    60 ms of every step between its backward and its optimizer step (a few ms of work): idle by
    construction. (Moved from tests/unit/test_cpu_words.py, which read the first committed recording
    whose loss was idle: which one is hangs on the machine that recorded them.)"""
    from fsdpviz.analysis.pipeline import analyse

    run_dir = tmp_path / "run"
    proc = record(run_dir, torchrun(SCRIPTS / "self_watch_train.py", "--steps", "9", "--idle-ms", "60",
                                    "--out", str(tmp_path / "watch-{rank}.jsonl")), env=record_env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = analyse([run_dir], cache=False).summary
    assert summary.bound is not None and summary.bound.loss is not None
    assert summary.bound.loss.kind == "idle" and summary.bound.other_idle_ms is not None
    assert summary.bound.other_idle_ms >= 0.5 * 60
    [action] = [a for a in summary.actions if a.kind == "bound"]
    assert "the compute thread runs no traced op" in action.message and "gloo" in action.message

@pytest.mark.slow
@pytest.mark.lifecycle
@pytest.mark.parametrize("steps", [5, 6])
def test_record_short_script_gets_complete_steps_with_the_defaults(steps: int, tmp_path: Path) -> None:
    """A script of 5 or 6 training steps, recorded with the default schedule, yields a trace of complete
    training steps (2-4) with its units and their communication; nothing calls its ranks unconnected,
    and the closing lines say what was profiled."""
    from fsdpviz.analysis.pipeline import analyse

    run_dir = tmp_path / "run"
    proc = record(run_dir, torchrun(EXAMPLE, *TINY, "--steps", str(steps)), env=record_env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "profile steps 2-4" in proc.stderr and "traces: 2 (optimizer_steps, steps 2-4)" in proc.stderr
    run = json.loads((run_dir / "run.json").read_text())
    assert run["profile"]["steps"] == [2, 3, 4] and run["notes"] == []
    for rank in (0, 1):  # the trace holds those steps and no step that never ran
        steps_in_trace = {n for n in _annotations(_trace(run_dir, rank)) if n.startswith("ProfilerStep#")}
        assert steps_in_trace == {"ProfilerStep#2", "ProfilerStep#3", "ProfilerStep#4"}
    summary = analyse([run_dir], cache=False).summary
    assert summary.steps == [2, 3, 4] and summary.framework == "fsdp2"
    units = {u.name: u for u in summary.units}
    assert set(BLOCKS[:2]) <= set(units)
    for name in BLOCKS[:2]:  # FSDP2's own gathers and reductions of every block, on both ranks
        assert units[name].all_gather_ms and units[name].all_gather_ms > 0
        assert units[name].reduce_scatter_ms and units[name].reduce_scatter_ms > 0
    assert summary.overlap.comm_ms > 0
    assert not any("no rank communicated" in n or "independently" in n for n in summary.notes)


@pytest.mark.slow
@pytest.mark.lifecycle
def test_record_script_shorter_than_the_warmup_says_why_it_has_no_trace(tmp_path: Path) -> None:
    """A 2-step script ends before the first profiled step: no trace of its exit posing as a step, and
    run.json and the closing lines say at which step it ended and which --warmup would profile it."""
    run_dir = tmp_path / "run"
    proc = record(run_dir, torchrun(EXAMPLE, *TINY, "--steps", "2"), "--summary", env=record_env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = json.loads((run_dir / "run.json").read_text())
    assert run["status"] == "ok" and run["profile"]["steps"] == []
    assert all(r["trace"] is None and r["timer_steps"] == 2 for r in run["ranks"])
    assert not list((run_dir / "traces").glob("*.gz")) if (run_dir / "traces").exists() else True
    [note] = run["notes"]
    assert "ended after 2 training step(s), before step 2" in note and "--warmup 1" in note
    assert note in proc.stderr and "no summary: no rank wrote a trace" in proc.stderr


@pytest.mark.slow
@pytest.mark.recorded
def test_record_fsdp1_adds_unit_labels(recordings: Recordings, tmp_path: Path) -> None:
    rec = recordings.get(EXAMPLE_RUNS["fsdp1"])
    units = ["(root)", *BLOCKS]
    labels = [f"fsdpviz::{kind} ({unit})" for kind in ("forward", "backward", "all_gather", "reduce_scatter")
              for unit in units]
    run = _check_run(rec, "fsdp1", units, labels)
    model = _model_units(rec.config.train_args)
    block = next(u for u in run["units"] if u["unit"] == "blocks.1")
    assert block["param_numel"] == sum(p.numel() for p in model.blocks[1].parameters())
    assert block["forward_prefetch"] is True and block["backward_prefetch"] == "BACKWARD_PRE"
    assert block["shard_size"] == 2

    # Every gloo all-gather issued on the main thread lies inside an fsdpviz::all_gather range.
    events = [e for e in _trace(rec.run_dir, 0)["traceEvents"] if e.get("ph") == "X"]
    gathers = [e for e in events if e["name"] in ("c10d::allgather_", "c10d::_allgather_base_")]
    ranges = [e for e in events if e["name"].startswith("fsdpviz::all_gather (")]
    assert gathers and all(any(r["ts"] <= g["ts"] and g["ts"] + g["dur"] <= r["ts"] + r["dur"] for r in ranges)
                           for g in gathers)
    _check_same_losses(tmp_path, rec)


@pytest.mark.slow
@pytest.mark.recorded
@pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None, reason="deepspeed not installed (the deepspeed extra)")
def test_record_zero3_units_are_fetched_submodules_with_parent_blocks(recordings: Recordings, tmp_path: Path) -> None:
    rec = recordings.get(EXAMPLE_RUNS["zero3-submodule"])
    model = _model_units(rec.config.train_args)
    fetched = [name or "(root)" for name, m in model.named_modules() if list(m.parameters(recurse=False))]
    # the root module and the parent blocks hold no parameters of their own: units of their own code
    groups = {"(root)", *BLOCKS}
    expected = [name or "(root)" for name, m in model.named_modules()
                if list(m.parameters(recurse=False)) or (name or "(root)") in groups]
    labels = ["fsdpviz::forward (blocks.1.qkv)", "fsdpviz::backward (blocks.0.fc_out)", "fsdpviz::forward ((root))",
              "fsdpviz::backward (blocks.1)", "fsdpviz::fetch (blocks.0.qkv)", "fsdpviz::release (blocks.0.qkv)",
              "fsdpviz::engine_forward", "fsdpviz::engine_backward", "fsdpviz::engine_step"]
    run = _check_run(rec, "zero3", expected, labels)
    by_name = {u["unit"]: u for u in run["units"]}
    assert by_name["blocks.1.qkv"]["parent"] == "blocks.1" and by_name["tok_emb"]["parent"] == ""
    assert by_name["head"]["parent"] == "" and by_name["blocks.1"]["parent"] == ""
    assert all(by_name[g]["param_numel"] == 0 == by_name[g]["param_bytes"] for g in groups)
    assert all(by_name[u]["param_numel"] == sum(p.numel() for p in model.get_submodule(
        "" if u == "(root)" else u).parameters(recurse=False)) and by_name[u]["shard_size"] == 2 for u in fetched)
    trace = _trace(rec.run_dir, 1)
    names = _annotations(trace)
    gathered = {u for n in names if n.startswith("fsdpviz::all_gather (") for u in n[21:-1].split(", ")}
    reduced = {u for n in names if n.startswith("fsdpviz::reduce_scatter (") for u in n[25:-1].split(", ")}
    assert gathered == set(fetched) and reduced == set(fetched)  # every unit gathered and reduced
    # A step ends when engine.step returns (DeepSpeed works on after the torch optimizer's step):
    # every engine.step range lies inside one ProfilerStep.
    ranges = [e for e in trace["traceEvents"] if e.get("ph") == "X" and e.get("cat") == "user_annotation"]
    steps = [(e["ts"], e["ts"] + e["dur"]) for e in ranges if e["name"].startswith("ProfilerStep#")]
    engine_steps = [e for e in ranges if e["name"] == "fsdpviz::engine_step"]
    assert len(engine_steps) >= 2
    assert all(any(lo <= e["ts"] and e["ts"] + e["dur"] <= hi for lo, hi in steps) for e in engine_steps)
    _check_same_losses(tmp_path, rec)


@pytest.mark.slow
@pytest.mark.lifecycle
def test_record_sigterm_interrupts_and_keeps_data(tmp_path: Path) -> None:
    """SIGTERM to `fsdpviz record` itself after the profiled steps (tests/robustness/test_record_faults.py
    covers SIGTERM, SIGKILL and Ctrl-C inside them, and a script that raises)."""
    run_dir = tmp_path / "run"
    command = torchrun(EXAMPLE, "--framework", "fsdp2", *TINY, "--steps", "2000")
    proc = subprocess.Popen([sys.executable, "-m", "fsdpviz", "record", "--out", str(run_dir), "--no-report",
                             "--no-summary", "--warmup", "2", "--",
                             *command], env=record_env(), cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    deadline = time.monotonic() + 180
    assert proc.stdout is not None
    for line in proc.stdout:  # rank 0 prints "step N loss ..."
        if re.match(r"step 8 ", line) or time.monotonic() > deadline:
            break
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=120)
    run = json.loads((run_dir / "run.json").read_text())
    assert run["status"] == "interrupted" and "SIGTERM" in run["reason"]
    assert proc.returncode == run["exit_code"] != 0
    for rank in (0, 1):
        assert run["ranks"][rank]["status"] == "interrupted"
        assert {"ProfilerStep#2", "ProfilerStep#4"} <= _annotations(_trace(run_dir, rank))
        steps = {r["step"] for r in _timers(run_dir, rank) if r["phase"] == "step" and r["kind"] == "total"}
        assert set(range(8)) <= steps and max(steps) < 2000


@pytest.mark.slow
@pytest.mark.lifecycle
def test_record_only_instruments_ranks(tmp_path: Path) -> None:
    run_dir, out = tmp_path / "run", tmp_path / "out"
    out.mkdir()
    top_helper = f"import json, os, sys, torch; json.dump(os.getpid(), open({str(out / 'top.json')!r}, 'w'))"
    launcher = " ".join(torchrun(SCRIPTS / "spawning_train.py", str(out), "--framework", "fsdp2", *TINY,
                                 "--steps", "4"))
    shell = f"{sys.executable} -c {top_helper!r} && {launcher}"
    proc = record(run_dir, ["sh", "-c", shell], "--warmup", "1", "--steps", "2")
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = json.loads((run_dir / "run.json").read_text())
    rank_pids = {r["pid"] for r in run["ranks"]}
    assert len(run["ranks"]) == 2 and sorted(p.name for p in (run_dir / "ranks").iterdir()) == ["rank0.json", "rank1.json"]
    assert json.loads((out / "top.json").read_text()) not in rank_pids  # a top-level helper never records
    for rank in (0, 1):
        helper = json.loads((out / f"helper-rank{rank}.json").read_text())
        # the rank took fsdpviz's variables out of its environment as it started: its helper has none
        assert helper["agent_loaded"] is False and helper["owner_pid"] is None
        assert not set(helper["fsdpviz_env"]) & set(LAUNCHER_VARIABLES), helper["fsdpviz_env"]
        forked = json.loads((out / f"forked-rank{rank}.json").read_text())
        assert forked["agent_active"] is False and forked["pid"] not in rank_pids


def test_record_refuses_existing_folder_and_bad_output(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "run.json").write_text("{}")
    proc = record(run_dir, [sys.executable, "-c", "print('ran')"])
    assert proc.returncode == 2 and "ran" not in proc.stdout
    assert proc.stderr.strip().splitlines()[-1].startswith("error: ") and "--force" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr

    blocker = tmp_path / "file"
    blocker.write_text("")
    proc = record(blocker / "run", [sys.executable, "-c", "print('ran')"])
    assert proc.returncode == 2 and "ran" not in proc.stdout
    assert proc.stderr.startswith("error: ") and len(proc.stderr.strip().splitlines()) == 1

    proc = record(tmp_path / "other", ["no-such-command-fsdpviz"])
    assert proc.returncode == 2 and "command not found" in proc.stderr and not (tmp_path / "other").exists()


def test_record_passes_exit_code_of_a_command_without_ranks(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    (run_dir / "traces").mkdir(parents=True)
    (run_dir / "traces" / "rank7.trace.json.gz").write_bytes(b"old")
    proc = record(run_dir, [sys.executable, "-c", "import sys; print('child ran'); sys.exit(3)"], "--force")
    assert proc.returncode == 3 and "child ran" in proc.stdout
    run = json.loads((run_dir / "run.json").read_text())
    assert run["status"] == "failed" and run["exit_code"] == 3 and run["ranks"] == []
    assert run["reason"] == "command exited with code 3"
    assert not (run_dir / "traces" / "rank7.trace.json.gz").exists()  # --force replaced the old recording
    assert "nothing recorded" in proc.stderr


@pytest.mark.slow
@pytest.mark.lifecycle
def test_record_plain_python_without_optimizer_falls_back_to_a_time_window(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    env = record_env(FSDPVIZ_FALLBACK_AFTER_S="1", FSDPVIZ_WINDOW_S="1")
    env.pop("RANK", None)
    command = [sys.executable, str(SCRIPTS / "no_optimizer_train.py"), "4", str(unused_port())]
    proc = record(run_dir, command, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = json.loads((run_dir / "run.json").read_text())
    assert run["framework"] == "fsdp2" and run["world_size"] == 1
    assert [u["unit"] for u in run["units"]] == ["0", "2"]  # the root holds no parameters of its own
    assert run["profile"]["schedule"] == "time_window" and run["profile"]["window_s"] == 1.0
    (window_step,) = run["profile"]["steps"]
    trace = _trace(run_dir, 0)
    window = [e for e in trace["traceEvents"] if e.get("name") == f"ProfilerStep#{window_step}"]
    assert len(window) == 1 and 0.9e6 <= window[0]["dur"] <= 3e6  # microseconds: about one second
    assert "FSDP::pre_forward (0)" in _annotations(trace)
    steps = {r["step"] for r in _timers(run_dir, 0) if r["phase"] == "step" and r["kind"] == "total"}
    assert len(steps) > 10  # without optimizer steps, each forward starts a timer step


@pytest.mark.slow
@pytest.mark.lifecycle
def test_record_shared_folder_merges_two_nodes(tmp_path: Path) -> None:
    # Two "nodes" on this machine: one fsdpviz record per node, one rank each, one shared folder.
    run_dir = tmp_path / "run"

    def both_nodes() -> subprocess.CompletedProcess:
        """The two nodes' recordings, as one result: exit code 0 if both are 0, their stderr joined."""
        port, procs = str(unused_port()), []
        for node in (0, 1):
            node_command = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node_rank", str(node),
                            "--nproc_per_node", "1", "--master_addr", "127.0.0.1", "--master_port", port,
                            str(EXAMPLE), "--framework", "fsdp2", *TINY, "--steps", str(STEPS)]
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "fsdpviz", "record", "--shared", "--no-report", "--no-summary", "--out",
                 str(run_dir), "--", *node_command],
                env=record_env(), cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        outputs = [p.communicate(timeout=240) for p in procs]
        codes = [p.returncode for p in procs]
        return subprocess.CompletedProcess([], max(codes, key=abs), "".join(o[0] for o in outputs),
                                           "".join(o[1] for o in outputs))

    done = retried(both_nodes, tidy=lambda: shutil.rmtree(run_dir, ignore_errors=True))
    assert done.returncode == 0, done.stderr[-4000:]
    run = json.loads((run_dir / "run.json").read_text())
    assert run["status"] == "ok" and run["world_size"] == 2 and not run["notes"]
    assert [(r["rank"], r["status"]) for r in run["ranks"]] == [(0, "ok"), (1, "ok")]
    assert sorted(p.name for p in (run_dir / "traces").glob("*.gz")) == ["rank0.trace.json.gz", "rank1.trace.json.gz"]
    # two launchers, one recording: both nodes' ranks carry the id the first launcher chose
    assert [_trace(run_dir, rank).get("fsdpvizRunId") for rank in (0, 1)] == [run["run_id"]] * 2


@pytest.mark.slow
@pytest.mark.recorded
@pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None, reason="deepspeed not installed (the deepspeed extra)")
def test_record_under_the_deepspeed_launcher(recordings: Recordings) -> None:
    """``deepspeed --num_gpus 2`` (CPU accelerator: two CPU processes) starts the ranks itself and
    passes ``--local_rank``: both ranks record, ZeRO-3 with its units and the profiler's cost. (The
    example's ZeRO-3 leaf-module recording is started this way; its analysis is checked in
    test_unit_analysis_cpu.py and test_whatif_cpu.py.) In `make test` the job is its committed copy, made
    under that launcher by the current recorder: what the recorder wrote there is checked; `make
    test-recordings` starts the launcher now."""
    from fsdpviz.analysis.pipeline import analyse

    rec = recordings.get(EXAMPLE_RUNS["zero3-block"])
    assert rec.config.command()[:3] == [sys.executable, "-m", "deepspeed.launcher.runner"]
    assert rec.proc.returncode == 0, rec.proc.stderr[-3000:]
    run = json.loads((rec.run_dir / "run.json").read_text())
    assert run["status"] == "ok" and run["framework"] == "zero3" and run["world_size"] == 2
    assert [r["rank"] for r in run["ranks"]] == [0, 1] and all(r["status"] == "ok" for r in run["ranks"])
    summary = analyse([rec.run_dir], cache=False).summary.to_json()
    assert set(BLOCKS) <= {u["name"] for u in summary["units"]}
    # the default schedule: 2-5 profiled; 6, right after the trace export, not counted; 7-10 timed unprofiled
    assert summary["profiler"]["profiled_steps"] == PROFILED and summary["profiler"]["unprofiled_steps"] == UNPROFILED
