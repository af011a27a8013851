"""A torch profiler that another thread of the script starts while fsdpviz's records its trace: Kineto is
one per process, and two profilers at once crash it (a segfault). fsdpviz's profiler stands aside, with
its note; the process ends as it would bare. Run in a child process, which a crash would end. And a
profiler of the training thread's own, on and off again inside step 0, while fsdpviz's is idle (before its
warm-up step): left alone, it records no step range of fsdpviz's, fsdpviz's trace is written, and step 0
is noted as the script's profiled step.

Each program is still a process of its own, but forked from one that has imported what every program
starts with (torch, fsdpviz's profiler driver, and what torch.profiler imports the first time a profiler
starts): they take two thirds of the 3 CPU-seconds a fresh ``python -c PROGRAM`` runs for."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).parents[2]
TIMEOUT_S = 120

# Reads one request a line (a program, its arguments, the files for its stdout and stderr), forks, and
# answers the child's pid, then its exit code (-N: killed by signal N, as subprocess says). The fork is
# made from this process's only Python thread, the one that imported torch: the program's main thread is
# that thread, as it is in ``python -c PROGRAM`` (Kineto checks that its client is initialised on the
# thread that registered it). The child leaves the loop by SystemExit, or by the program's own
# exception, so that the interpreter ends as ``python -c PROGRAM``'s does: its threads joined, atexit
# handlers and C++ destructors run (a crash there is the process's crash too).
FORK_SERVER = textwrap.dedent('''
    import json, os, sys
    import torch
    import fsdpviz.record.profiling
    hasattr(torch, "_inductor")  # what torch.profiler imports as it first starts (prepare_trace)
    for request in sys.stdin:
        program, args, out, err = json.loads(request)
        pid = os.fork()
        if pid == 0:
            os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
            os.dup2(os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), 1)
            os.dup2(os.open(err, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), 2)
            sys.argv = ["-c", *args]
            exec(compile(program, "<string>", "exec"), {"__name__": "__main__"})
            sys.exit()
        print(pid, flush=True)
        print(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), flush=True)
''')


@pytest.fixture(scope="module")
def run_program(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., subprocess.CompletedProcess]]:
    """``run_program(PROGRAM, *args)``: ``python -c PROGRAM ARGS`` (in the repository) as a process of
    its own, forked by :data:`FORK_SERVER`; its exit code and what it printed, as ``subprocess.run``
    gives them (``TimeoutExpired`` after :data:`TIMEOUT_S`, the program killed)."""
    folder = tmp_path_factory.mktemp("programs")
    log = folder / "server.log"
    with log.open("w") as server_err:
        server = subprocess.Popen([sys.executable, "-c", FORK_SERVER], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=server_err, cwd=REPO, bufsize=0)
    assert server.stdin is not None and server.stdout is not None
    stdin, stdout = server.stdin, server.stdout
    count = 0

    def line(timeout: float | None) -> int | None:
        """The server's next number, None on timeout (its stdout is unbuffered here: nothing is read ahead
        of the line asked for, so that select sees every line still to read)."""
        if not select.select([stdout], [], [], timeout)[0]:
            return None
        text = stdout.readline()
        assert text, f"the fork server ended: {log.read_text()[-2000:]}"
        return int(text)

    def run(program: str, *args: str) -> subprocess.CompletedProcess:
        nonlocal count
        count += 1
        out, err = folder / f"{count}.out", folder / f"{count}.err"
        stdin.write(json.dumps([program, list(args), str(out), str(err)]).encode() + b"\n")
        pid = line(TIMEOUT_S)
        assert pid is not None, f"the fork server did not fork: {log.read_text()[-2000:]}"
        code = line(TIMEOUT_S)
        if code is None:
            os.kill(pid, signal.SIGKILL)
            line(None)
            raise subprocess.TimeoutExpired(["python", "-c", "PROGRAM", *args], TIMEOUT_S,
                                            out.read_text(), err.read_text())
        return subprocess.CompletedProcess(["python", "-c", "PROGRAM", *args], code, out.read_text(), err.read_text())

    yield run
    stdin.close()
    server.wait(timeout=30)


PROGRAM = textwrap.dedent('''
    import sys, tempfile, threading, torch
    from pathlib import Path
    from fsdpviz.record.options import RecordOptions
    from fsdpviz.record.profiling import ProfilerDriver
    on, off = int(sys.argv[1]), int(sys.argv[2])
    driver = ProfilerDriver(RecordOptions(run_dir=Path(tempfile.mkdtemp()), warmup=2, steps=2))
    x = torch.randn(64, 64)
    go, on_now, stop, stopped = threading.Event(), threading.Event(), threading.Event(), threading.Event()
    def other():
        go.wait()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
            on_now.set()
            stop.wait(10)
        stopped.set()
    thread = threading.Thread(target=other)
    thread.start()
    driver.start(0, 0)
    for step in range(7):
        if step == on:
            go.set()
            on_now.wait(10)
        for _ in range(10):
            torch.add(x, x)
        if step == off:
            stop.set()
            stopped.wait(5)
        driver.step_ended(step)
        driver.advance()
    stop.set(); go.set(); thread.join()
    driver.finish(7)
    print(driver.trace_file, "|", driver.stood_aside, "|", driver.script_profiled_steps(), "|", driver.left_on_from)
''')


@pytest.mark.parametrize(("on", "off", "said", "noted"), [
    # fsdpviz's profiler, stopped from the other thread, stays on in the training thread's own state to the
    # end: every later step is slowed, none is clean, and fsdpviz's is said to be left on from step 2
    (2, 4, "started its own torch.profiler at step 2", "[2, 3, 4, 5, 6] | 2"),
    # on from step 0, while fsdpviz's is idle: met at its warm-up, from the training thread (nothing left on)
    (0, 3, "ran its own torch.profiler at step 1", "[0, 1, 2, 3] | None")])
def test_another_threads_profiler_does_not_crash_the_process(on: int, off: int, said: str, noted: str,
                                                             run_program: Callable[..., subprocess.CompletedProcess],
                                                             ) -> None:
    done = run_program(PROGRAM, str(on), str(off))
    assert done.returncode == 0, done.stderr[-2000:]
    trace, note, *noted_now = done.stdout.strip().splitlines()[-1].split(" | ")
    assert trace == "None" and note.startswith("no trace: the script ") and said in note, note
    assert " | ".join(noted_now) == noted


IDLE_PROGRAM = textwrap.dedent('''
    import tempfile, torch
    from pathlib import Path
    from fsdpviz.record.options import RecordOptions
    from fsdpviz.record.profiling import ProfilerDriver
    driver = ProfilerDriver(RecordOptions(run_dir=Path(tempfile.mkdtemp()), warmup=3, steps=2))
    x = torch.randn(64, 64)
    driver.start(0, 0)
    seen = []
    for step in range(7):
        if step == 0:
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as mine:
                torch.add(x, x)
            seen = sorted({e.name for e in mine.events()})
        torch.add(x, x)
        driver.step_ended(step)
        driver.advance()
    driver.finish(7)
    print(driver.trace_file, "|", driver.stood_aside, "|", driver.script_profiled_steps(), "|", seen)
''')


def test_a_profiler_off_before_fsdpviz_warms_up_is_left_alone(
        run_program: Callable[..., subprocess.CompletedProcess]) -> None:
    done = run_program(IDLE_PROGRAM)
    assert done.returncode == 0, done.stderr[-2000:]
    trace, stood_aside, script_profiled, seen = done.stdout.strip().splitlines()[-1].split(" | ")
    assert trace == "traces/rank0.trace.json.gz" and stood_aside == "None"
    assert script_profiled == "[0]"
    assert "aten::add" in seen and "ProfilerStep" not in seen


MODES_PROGRAM = textwrap.dedent('''
    import sys, tempfile, torch
    from pathlib import Path
    from fsdpviz.record.options import RecordOptions
    from fsdpviz.record.profiling import ProfilerDriver
    mode = sys.argv[1]
    driver = ProfilerDriver(RecordOptions(run_dir=Path(tempfile.mkdtemp()), warmup=2, steps=2))
    x = torch.randn(64, 64)
    if mode != "timers":  # --mode timers: fsdpviz's profiler never starts
        driver.start(0, 0)
    mine = None
    for step in range(9):
        if mode == "after" and step == 5:  # on and off inside one step, after fsdpviz's trace
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
                torch.add(x, x)
        if mode == "timers" and step == 6:  # on across the end of step 6, off in step 7
            mine = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
            mine.__enter__()
        if mode == "timers" and step == 7:
            mine.__exit__(None, None, None)
        torch.add(x, x)
        driver.step_ended(step)
        driver.advance()
    driver.finish(9)
    print(driver.trace_file, "|", driver.script_profiled_steps())
''')


@pytest.mark.parametrize(("mode", "trace", "noted"), [
    ("plain", "traces/rank0.trace.json.gz", "[]"),  # fsdpviz's own profiler is never taken for the script's
    ("after", "traces/rank0.trace.json.gz", "[5]"),  # seen as it starts, after fsdpviz's trace is written
    ("timers", "None", "[6, 7]")])  # seen at a step's end where fsdpviz's profiler never ran
def test_the_steps_a_scripts_profiler_was_on_in_are_noted(mode: str, trace: str, noted: str,
                                                         run_program: Callable[..., subprocess.CompletedProcess],
                                                         ) -> None:
    done = run_program(MODES_PROGRAM, mode)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1].split(" | ") == [trace, noted]
