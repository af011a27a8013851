"""The pure parts of ``fsdpviz record``: names, schedule, timers, process roles, run.json, CLI parsing."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from helpers.jobs import retried

from fsdpviz import cli
from fsdpviz.record import launcher, rankfacts, runinfo, schedule
from fsdpviz.record.activation import ROLE_CANDIDATE, ROLE_NONE, ROLE_RANK, classify_process
from fsdpviz.record.options import RecordOptions, options_from_env
from fsdpviz.record.timers import Interval, StepTimes, TimersWriter, salvage_partial, summarize_step
from fsdpviz.record.units import Unit, assign_order, clean_fqn, find_parent_block
from fsdpviz.runfolder import ProfileInfo, RankInfo, RunInfo, UnitInfo


@pytest.mark.parametrize(("fqn", "expected"), [
    ("", "(root)"),
    ("_fsdp_wrapped_module", "(root)"),
    ("_fsdp_wrapped_module.blocks.3", "blocks.3"),
    ("_fsdp_wrapped_module.blocks.3._fsdp_wrapped_module._checkpoint_wrapped_module", "blocks.3"),
    ("_orig_mod.layers.0+1", "layers.0+1"),
    ("blocks.10.attn", "blocks.10.attn"),
])
def test_clean_fqn_removes_wrapper_components(fqn: str, expected: str) -> None:
    assert clean_fqn(fqn) == expected


def test_find_parent_block_is_the_nearest_container_element() -> None:
    elements = ["blocks.0", "blocks.1", "blocks.0+1.0", "blocks.0+1"]
    assert find_parent_block("blocks.1.attn.qkv", elements) == "blocks.1"
    assert find_parent_block("blocks.0+1.0.qkv", elements) == "blocks.0+1.0"
    assert find_parent_block("blocks.1", elements) == ""  # a block is not its own parent
    assert find_parent_block("tok_emb", elements) == ""


def test_assign_order_follows_first_forward_then_module_order() -> None:
    units = [Unit(unit=n, param_numel=1, param_bytes=4, dtype="float32") for n in ("(root)", "a", "b", "c")]
    assign_order(units, ["(root)", "b", "a", "b"])
    assert {u.unit: u.order for u in units} == {"(root)": 0, "b": 1, "a": 2, "c": 3}


def test_default_schedule_gives_a_five_step_script_a_full_trace() -> None:
    # a first script is often short: 5 steps hold the whole default window, and the steps after
    # it (the one right after the export left out) are timed without the profiler
    from fsdpviz.record.options import DEFAULT_STEPS, DEFAULT_WARMUP

    actions = [schedule.profiler_action(step, warmup=DEFAULT_WARMUP, steps=DEFAULT_STEPS) for step in range(9)]
    assert actions == ["none", "warmup", "record", "record", "record_and_save", "none", "none", "none", "none"]
    assert max(schedule.profiled_steps(DEFAULT_WARMUP, DEFAULT_STEPS)) < 5


def test_profiler_schedule_skips_warmup_and_records_steps() -> None:
    actions = [schedule.profiler_action(step, warmup=2, steps=3) for step in range(7)]
    assert actions == ["none", "warmup", "record", "record", "record_and_save", "none", "none"]
    assert schedule.profiled_steps(2, 3) == [2, 3, 4]
    assert [schedule.profiler_action(s, warmup=0, steps=1) for s in range(2)] == ["record_and_save", "none"]


def test_time_window_fallback_needs_time_and_forwards_and_no_optimizer() -> None:
    kwargs = {"fallback_after_s": 10.0}
    assert schedule.should_fall_back(optimizer_stepped=False, elapsed_s=11, forwards=3, **kwargs)
    assert not schedule.should_fall_back(optimizer_stepped=True, elapsed_s=11, forwards=3, **kwargs)
    assert not schedule.should_fall_back(optimizer_stepped=False, elapsed_s=9, forwards=3, **kwargs)
    assert not schedule.should_fall_back(optimizer_stepped=False, elapsed_s=60, forwards=1, **kwargs)


def test_options_round_trip_through_the_environment(tmp_path: Path) -> None:
    options = RecordOptions(run_dir=tmp_path, steps=5, warmup=0, mode="timers", memory=False, stack=True, window_s=2.5)
    assert options_from_env(options.to_env()) == options
    assert options_from_env({}) is None
    assert (options.profile, options.timers) == (False, True)
    with pytest.raises(ValueError, match="--steps"):
        RecordOptions(run_dir=tmp_path, steps=0)
    with pytest.raises(ValueError, match="--mode"):
        RecordOptions(run_dir=tmp_path, mode="all")  # type: ignore[arg-type]


def test_classify_process_roles() -> None:
    run = {"FSDPVIZ_RUN_DIR": "/r"}
    assert classify_process({}, 10) == ROLE_NONE
    assert classify_process({**run, "RANK": "1", "WORLD_SIZE": "2"}, 10) == ROLE_RANK
    assert classify_process(run, 10) == ROLE_CANDIDATE  # torchrun's agent, plain python
    # a helper started by a recording rank (pid 10) inherits the owner pid: it never records
    assert classify_process({**run, "RANK": "1", "WORLD_SIZE": "2", "FSDPVIZ_OWNER_PID": "10"}, 11) == ROLE_NONE
    assert classify_process({**run, "RANK": "1", "WORLD_SIZE": "2", "FSDPVIZ_OWNER_PID": "10"}, 10) == ROLE_RANK


def _interval(unit: str, phase: str, kind: str, start: int, end: int) -> Interval:
    return Interval(unit, phase, kind, start * 1_000_000, end * 1_000_000)


def test_summarize_step_computes_exclusive_compute_from_nesting() -> None:
    # GIVEN root [0,100] ms holding its gather [0,30] and a child unit [40,70] with its gather [40,50]
    times = StepTimes(7, intervals=[
        _interval("", "step", "total", 0, 200),
        _interval("", "forward", "total", 0, 100),
        _interval("(root)", "forward", "total", 0, 100),
        _interval("(root)", "forward", "all_gather", 0, 30),
        _interval("blocks.0", "forward", "total", 40, 70),
        _interval("blocks.0", "forward", "all_gather", 40, 50),
        _interval("blocks.0", "forward", "all_gather", 55, 56),
    ], memory={"peak_rss": (123, "at_most")})
    # WHEN summarised
    records = {(r["unit"], r["phase"], r["kind"]): r for r in summarize_step(3, times)}
    # THEN totals and gathers are sums, compute excludes what lies directly inside
    assert records[("(root)", "forward", "compute")]["ms"] == 100 - 30 - 30
    assert records[("blocks.0", "forward", "compute")]["ms"] == 30 - 10 - 1
    assert records[("blocks.0", "forward", "all_gather")] == {
        "rank": 3, "step": 7, "unit": "blocks.0", "phase": "forward", "kind": "all_gather", "ms": 11.0, "n": 2}
    assert records[("", "step", "total")]["ms"] == 200
    assert records[("", "step", "peak_rss")] == {
        "rank": 3, "step": 7, "unit": "", "phase": "step", "kind": "peak_rss", "ms": None, "bytes": 123,
        "bound": "at_most"}
    assert ("", "step", "compute") not in records


def test_summarize_step_marks_partial_steps_and_skips_open_intervals() -> None:
    times = StepTimes(2, intervals=[_interval("a", "forward", "total", 0, 5), Interval("b", "forward", "total", 1)],
                      partial=True)
    records = summarize_step(0, times)
    assert {r["unit"] for r in records} == {"a"} and all(r["partial"] for r in records)


def test_timers_writer_renames_when_closed_and_salvage_keeps_complete_lines(tmp_path: Path) -> None:
    writer = TimersWriter(tmp_path / "rank0.jsonl")
    writer.write([{"step": 0}, {"step": 1}])
    assert not (tmp_path / "rank0.jsonl").exists() and (tmp_path / "rank0.jsonl.partial").exists()
    assert writer.close() == tmp_path / "rank0.jsonl"
    assert [json.loads(x)["step"] for x in (tmp_path / "rank0.jsonl").read_text().splitlines()] == [0, 1]

    torn = tmp_path / "rank1.jsonl.partial"
    torn.write_text('{"step": 0}\n{"step": 1}\n{"st')
    final = salvage_partial(torn)
    assert final.name == "rank1.jsonl" and final.read_text() == '{"step": 0}\n{"step": 1}\n' and not torn.exists()


def test_decide_status_from_exit_code_signal_and_ranks() -> None:
    failed_rank = [{"rank": 1, "status": "failed", "reason": "ValueError: x"}]
    assert runinfo.decide_status(0, None, []) == ("ok", "")
    assert runinfo.decide_status(1, None, failed_rank) == ("failed", "command exited with code 1; rank 1: ValueError: x")
    assert runinfo.decide_status(1, 15, failed_rank)[0] == "interrupted"
    assert runinfo.decide_status(143, None, [])[0] == "interrupted"
    assert runinfo.exit_code_of(-15) == 143 and runinfo.exit_code_of(3) == 3


def test_a_missing_script_is_named_though_the_launchers_report_comes_after_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from fsdpviz.commands.record import print_recording

    # torchrun of a script that is not there: python's line, then torchrun's report (a real run's stderr)
    lines = ["/usr/bin/python: can't open file '/tmp/run/nonexist_train.py': [Errno 2] No such file or directory",
             "W1202 16:12:56.433000 7849 api.py:1028] Sending process 7855 closing signal SIGTERM",
             "E1202 16:12:56.437000 7849 api.py:1002] failed (exitcode: 2) local_rank: 0 (pid: 7854)",
             "Traceback (most recent call last):", "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:",
             "  exitcode  : 2 (pid: 7854)", "  error_file: <N/A>"]
    run = runinfo.build_run_json(
        command=["torchrun", "nonexist_train.py"], cwd=str(tmp_path), label="run", start_time="", end_time="",
        exit_code=1, status="failed", reason="command exited with code 1",
        options=RecordOptions(run_dir=tmp_path), rank_infos=[], notes=[])
    print_recording(run, tmp_path, lines)
    said = [line.removeprefix("fsdpviz:   | ") for line in capsys.readouterr().err.splitlines() if "  | " in line]
    assert said == [lines[0], "...", *lines[-5:]]
    # where python's line is among the last five, it is said once, in its place
    print_recording(run, tmp_path, lines[:1] + lines[-2:])
    said = [line.removeprefix("fsdpviz:   | ") for line in capsys.readouterr().err.splitlines() if "  | " in line]
    assert said == [lines[0], *lines[-2:]]


def test_the_recorded_command_gets_the_users_environment_not_fsdpvizs_own(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from fsdpviz.record import environment
    from fsdpviz.record.launcher import child_env

    name = "ARROW_DEFAULT_MEMORY_POOL"
    monkeypatch.setenv(name, "restored at teardown")
    monkeypatch.delenv(name)
    monkeypatch.setattr(environment, "_OWN_DEFAULTS", {})
    options = RecordOptions(run_dir=tmp_path)
    # fsdpviz's own process uses the system allocator; the command it records does not inherit it
    environment.set_own_default(name, "system")
    assert os.environ[name] == "system" and name not in child_env(options)
    # a user's own setting is theirs: fsdpviz keeps it, and so does the command
    monkeypatch.setattr(environment, "_OWN_DEFAULTS", {})
    monkeypatch.setenv(name, "jemalloc")
    environment.set_own_default(name, "system")
    assert os.environ[name] == "jemalloc" and child_env(options)[name] == "jemalloc"


def test_the_reason_names_the_rank_that_failed_first() -> None:
    # rank 1 raised; rank 0 failed 1.3 s later only because its peer was gone (a real 2-rank run's rank files)
    peer_gone = {"rank": 0, "status": "failed", "end_time": "2026-12-02T16:10:12.669+00:00",
                 "reason": "RuntimeError: [pair.cc:553] Connection closed by peer [127.0.0.1]:16779."}
    raised = {"rank": 1, "status": "failed", "end_time": "2026-12-02T16:10:11.346+00:00",
              "reason": "RuntimeError: my deliberate failure at step 7"}
    for ranks in ([peer_gone, raised], [raised, peer_gone]):
        assert runinfo.decide_status(1, None, ranks) == (
            "failed", "command exited with code 1; rank 1: RuntimeError: my deliberate failure at step 7")
    # times of two nodes in different time zones: rank 0's 17:10:11 at +01:00 is 16:10:11 UTC, before rank 1
    east = {**peer_gone, "end_time": "2026-12-02T17:10:11.000+01:00", "reason": "RuntimeError: first, in the east"}
    assert runinfo.decide_status(1, None, [raised, east])[1].endswith("rank 0: RuntimeError: first, in the east")
    # a rank without an end time (an older rank file) comes after those with one
    assert runinfo.decide_status(1, None, [{**peer_gone, "end_time": None}, raised])[1].endswith("at step 7")


def _rank_info(rank: int, **extra: Any) -> dict[str, Any]:
    return {"rank": rank, "world_size": 4, "host": f"node{rank // 2}", "framework": "fsdp1", "pid": 100 + rank,
            "units": [{"unit": "(root)", "order": 0}], "versions": {"torch": "2.13.0", "cuda": None},
            "profile": {"schedule": "optimizer_steps", "steps": [2, 3, 4], "trace": f"traces/rank{rank}.trace.json.gz"},
            "timers": {"file": f"timers/rank{rank}.jsonl", "steps": 8}, "status": "ok", **extra}


def test_build_run_json_merges_ranks_and_notes_missing_ones(tmp_path: Path) -> None:
    run = runinfo.build_run_json(
        command=["torchrun", "train.py"], cwd="/w", label="block", start_time="t0", end_time="t1", exit_code=0,
        status="ok", reason="", options=RecordOptions(run_dir=tmp_path, warmup=2), notes=[],
        rank_infos=[_rank_info(0), _rank_info(1), _rank_info(2)],
    )
    assert run.format == 1 and run.framework == "fsdp1" and run.world_size == 4
    assert run.hosts == ["node0", "node1"] and run.units == [UnitInfo(unit="(root)", order=0)]
    assert run.profile == ProfileInfo(schedule="optimizer_steps", steps=[2, 3, 4], warmup=2, requested_steps=3,
                                      unit_timer_steps=1)
    assert run.versions["torch"] == "2.13.0" and run.versions["python"]
    assert [r.rank for r in run.ranks] == [0, 1, 2] and run.ranks[2].timer_steps == 8
    assert any("rank(s) [3]" in note for note in run.notes)
    assert run.options["steps"] == 3 and run.options["run_dir"] == str(tmp_path)


def test_child_env_puts_bootstrap_first_and_drops_owner(tmp_path: Path) -> None:
    env = launcher.child_env(RecordOptions(run_dir=tmp_path),
                             {"PYTHONPATH": "/mine", "FSDPVIZ_OWNER_PID": "5", "PATH": "/bin"})
    assert env["PYTHONPATH"].split(":") == [str(launcher.BOOTSTRAP_DIR), "/mine"]
    assert (launcher.BOOTSTRAP_DIR / "sitecustomize.py").is_file()
    assert "FSDPVIZ_OWNER_PID" not in env and env["FSDPVIZ_RUN_DIR"] == str(tmp_path) and env["PATH"] == "/bin"


def test_a_rank_takes_out_the_bootstrap_another_copy_of_fsdpviz_put_there(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """The ranks may import another copy of fsdpviz than the recorder's (the user's PYTHONPATH, an older
    install): the bootstrap the recorder named (``child_env``) still leaves PYTHONPATH and sys.path."""
    from fsdpviz.record import environment

    other = tmp_path / "elsewhere" / "fsdpviz" / "record" / "bootstrap"
    other.mkdir(parents=True)
    env = launcher.child_env(RecordOptions(run_dir=tmp_path), {"PYTHONPATH": "/mine"})
    env["PYTHONPATH"] = env["PYTHONPATH"].replace(str(launcher.BOOTSTRAP_DIR), str(other))
    env["FSDPVIZ_BOOTSTRAP"] = str(other)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(environment, "_LAUNCH_ENV", {})
    monkeypatch.setattr(sys, "path", [str(other), *sys.path])
    environment.leave_environment()
    assert os.environ["PYTHONPATH"] == "/mine" and str(other) not in sys.path
    assert "FSDPVIZ_BOOTSTRAP" not in os.environ and "FSDPVIZ_RUN_DIR" not in os.environ


@pytest.fixture()
def fake_launcher(monkeypatch: pytest.MonkeyPatch) -> list[tuple[list[str], RecordOptions]]:
    calls: list[tuple[list[str], RecordOptions]] = []

    def fake_record(command: list[str], options: RecordOptions, **kwargs: Any) -> launcher.RecordResult:
        calls.append((command, options))
        run = RunInfo(ranks=[], status="failed", reason="x", exit_code=7, notes=[])
        return launcher.RecordResult(run_dir=options.run_dir, exit_code=7, run=run)

    monkeypatch.setattr(launcher, "record", fake_record)
    return calls


@pytest.mark.parametrize("argv", [
    ["record", "--out", "R", "--steps", "5", "--", "torchrun", "--steps", "9", "train.py"],
    ["record", "--out", "R", "--steps", "5", "torchrun", "--steps", "9", "train.py"],
])
def test_cli_record_options_before_command_belong_to_fsdpviz(
        argv: list[str], fake_launcher: list, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        cli.main(argv)
    assert exit_info.value.code == 7  # the command's exit code
    (command, options), = fake_launcher
    assert command == ["torchrun", "--steps", "9", "train.py"] and options.steps == 5
    assert options.run_dir.name == "R" and options.run_dir.is_absolute()


@pytest.mark.parametrize(("argv", "message"), [
    (["record", "--out", "R"], "no command to record"),
    (["record", "--mode", "all", "--", "python", "x.py"], "--mode"),
    (["record", "--steps", "0", "--", "python"], "--steps"),
])
def test_cli_record_usage_errors_are_one_line(argv: list[str], message: str, fake_launcher: list,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        cli.main(argv)
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and not fake_launcher
    assert err.startswith("error: ") and message in err and len(err.strip().splitlines()) == 1


def test_tidy_partial_files_only_touches_ranks_that_are_gone(tmp_path: Path) -> None:
    # GIVEN rank 0 died on this host mid-write, rank 1 still runs on another node of a shared folder
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], check=True,
                          capture_output=True, text=True)
    infos = [{"rank": 0, "host": socket.gethostname(), "pid": int(dead.stdout), "status": "running"},
             {"rank": 1, "host": "other-node", "pid": 1, "status": "running"}]
    (tmp_path / "timers").mkdir()
    (tmp_path / "traces").mkdir()
    for rank in (0, 1):
        (tmp_path / "timers" / f"rank{rank}.jsonl.partial").write_text('{"step": 0}\n{"ste')
        (tmp_path / "traces" / f"rank{rank}.trace.json.gz.partial").write_bytes(b"half")
    # WHEN the launcher tidies up
    notes = runinfo.tidy_partial_files(tmp_path, infos)
    runinfo.mark_vanished_ranks(infos)
    # THEN rank 0's complete lines are kept and its half trace dropped; rank 1's files are untouched
    assert (tmp_path / "timers" / "rank0.jsonl").read_text() == '{"step": 0}\n'
    assert not (tmp_path / "traces" / "rank0.trace.json.gz.partial").exists() and len(notes) == 2
    assert (tmp_path / "timers" / "rank1.jsonl.partial").exists()
    assert (tmp_path / "traces" / "rank1.trace.json.gz.partial").exists()
    assert [i["status"] for i in infos] == ["killed", "running"]


def test_cli_record_keeps_the_exit_code_when_summary_and_report_break(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    # GIVEN a recording with ranks, and analysis/report layers that cannot even be imported
    def fake_record(command: list[str], options: RecordOptions, **kwargs: Any) -> launcher.RecordResult:
        rank = RankInfo(rank=0, trace="traces/rank0.trace.json.gz", timers=None, timer_steps=0)
        run = RunInfo(ranks=[rank], status="ok", reason="", exit_code=0, notes=[], units=[], world_size=1,
                      framework="fsdp2", profile=ProfileInfo(schedule="optimizer_steps", steps=[2]))
        return launcher.RecordResult(run_dir=options.run_dir, exit_code=0, run=run)

    monkeypatch.setattr(launcher, "record", fake_record)
    monkeypatch.setitem(sys.modules, "fsdpviz.analysis.pipeline", None)  # import raises ImportError
    monkeypatch.setitem(sys.modules, "fsdpviz.analysis.summary", None)
    monkeypatch.setitem(sys.modules, "fsdpviz.report.build", None)
    # WHEN recording
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["record", "--out", "R", "--", "python", "x.py"])
    # THEN the command's exit code survives, with one line for each failure
    err = capsys.readouterr().err
    assert exit_info.value.code == 0 and "Traceback" not in err
    assert "no summary (internal error" in err and "no report (internal error" in err


def test_summarize_step_gives_a_crossing_root_backward_to_the_unit_it_opens_in() -> None:
    # GIVEN the torchtitan shape: the root encloses [norm, output] in forward; in backward the root's
    # interval [25, 120] opens inside the unit's [20, 40], which holds the unit's reduce-scatter [32, 40]
    times = StepTimes(1, intervals=[
        _interval("(root)", "forward", "total", 0, 10),
        _interval("[norm, output]", "forward", "total", 2, 6),
        _interval("[norm, output]", "backward", "total", 20, 40),
        _interval("(root)", "backward", "total", 25, 120),
        _interval("[norm, output]", "backward", "reduce_scatter", 32, 40),
        _interval("blocks.0", "backward", "total", 50, 80),
        _interval("(root)", "backward", "reduce_scatter", 110, 120),
    ])
    # WHEN summarised
    records = {(r["unit"], r["phase"], r["kind"]): r["ms"] for r in summarize_step(0, times)}
    # THEN the unit keeps its whole backward but its own reduce-scatter, and the root keeps only what
    # no unit claims: 95 ms minus the 15 ms it shares with the unit, the block's 30 and its own 10
    assert records[("[norm, output]", "backward", "compute")] == 20 - 8
    assert records[("(root)", "backward", "compute")] == 95 - 15 - 30 - 10
    assert records[("blocks.0", "backward", "compute")] == 30
    assert records[("(root)", "forward", "compute")] == 10 - 4


def test_after_a_recording_a_broken_report_layer_costs_the_report_not_the_summary(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    # GIVEN the bundled example's run folder, and a report layer that cannot be imported
    import shutil

    from fsdpviz.commands.record import summarise_and_report

    run_dir = tmp_path / "run"
    example = Path(__file__).resolve().parents[2] / "sample_traces" / "fsdp2-cpu-2rank"
    shutil.copytree(example, run_dir, ignore=shutil.ignore_patterns(".fsdpviz-cache"))
    monkeypatch.setitem(sys.modules, "fsdpviz.report.build", None)  # import raises ImportError
    # WHEN summarising and reporting as `fsdpviz record` does after the command
    written = summarise_and_report(run_dir, summary=True, report=True)
    # THEN the summary is printed (its step time and overlap), and the report alone is one failure line
    out, err = capsys.readouterr()
    assert written is None and not (run_dir / "report.html").exists()
    assert "step time" in (out + err).lower() and "overlap" in (out + err).lower()
    assert "no report (internal error" in err and "no summary" not in err and "Traceback" not in err


GLOO_THREADS = """
import json, sys, tempfile, torch, torch.distributed as dist
from fsdpviz.record.rankfacts import gloo_workers
before = gloo_workers()
dist.init_process_group("gloo", init_method="file://" + tempfile.mktemp(), rank=0, world_size=1)
dist.all_reduce(torch.ones(4))
during = gloo_workers()
world = dist.group.WORLD  # held, as a model's FSDP state holds its process group
dist.destroy_process_group()
print(json.dumps([before, during, gloo_workers()]))
"""


def test_gloo_work_threads_are_found_by_name() -> None:
    """The threads a gloo process group starts, counted in a process of its own; while anything
    holds the group they outlive destroy_process_group (which is why a rank's exit gives them a moment).
    The group starts its threads without waiting for them, so a later count may see more, never fewer."""
    # once more where PyTorch aborts the process at exit (helpers.jobs.TEARDOWN_CRASH), after the count
    done = retried(lambda: subprocess.run([sys.executable, "-c", GLOO_THREADS], capture_output=True, text=True,
                                          timeout=120, check=False))
    assert done.returncode == 0, done.stderr[-2000:]
    before, during, after = json.loads(done.stdout.splitlines()[-1])
    assert before == 0 and during >= 1 and after >= during


@pytest.mark.parametrize(("workers", "pauses"), [(0, []), (2, [rankfacts.GLOO_PAUSE_S])])
def test_a_rank_exits_after_a_pause_only_with_gloo_threads(monkeypatch: pytest.MonkeyPatch, workers: int,
                                                           pauses: list[float]) -> None:
    finished: list[tuple[str, str | None]] = []
    slept: list[float] = []
    monkeypatch.setattr(rankfacts, "gloo_workers", lambda: workers)
    monkeypatch.setattr(rankfacts.time, "sleep", slept.append)
    hooks = rankfacts.ExitHooks(lambda status, reason: finished.append((status, reason)))
    hooks._at_exit()
    assert finished == [("ok", None)] and slept == pauses


@pytest.mark.parametrize(("cuda", "phased"), [(False, {2, 3, 4, 5, 6, 7}), (True, {2, 3, 4, 5})])
def test_a_gpu_clean_step_times_its_ends_only(tmp_path: Path, cuda: bool, phased: set[int]) -> None:
    """A clean step holds a host timestamp and at most one CUDA event pair (its ends): a CPU rank's clean
    steps also time their three phases with host timestamps, a GPU's do not (three CUDA event pairs more),
    and the profiled steps and the unit-timed step after the trace export time them on both. Default
    schedule: 0 warms up, 1 is the profiler's warm-up, 2-4 profiled, 5 unit-timed, 6 on clean."""
    from fsdpviz.record.agent import Agent

    agent = Agent(RecordOptions(run_dir=tmp_path), ROLE_RANK)
    agent._use_cuda_events = cuda
    agent._optimizer_stepped = True
    timed = set()
    for step in range(2, 8):
        agent.step = step
        agent.profiler.labels_on = step in (2, 3, 4)  # as the profiler's schedule sets it before each step
        agent._begin_step()
        assert agent.observer.unit_timing == (step <= 5)
        if agent._phase_timing:
            timed.add(step)
    assert timed == phased
