"""A torch profiler that another thread of the script starts while fsdpviz's records its trace: Kineto is
one per process, and two profilers at once crash it (a segfault). fsdpviz's profiler stands aside, with
its note; the process ends as it would bare. Run in a child process, which a crash would end. And a
profiler of the training thread's own, on and off again inside step 0, while fsdpviz's is idle (before its
warm-up step): left alone, it records no step range of fsdpviz's, fsdpviz's trace is written, and step 0
is noted as the script's profiled step."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

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
def test_another_threads_profiler_does_not_crash_the_process(on: int, off: int, said: str, noted: str) -> None:
    done = subprocess.run([sys.executable, "-c", PROGRAM, str(on), str(off)], capture_output=True, text=True,
                          timeout=120, check=False, cwd=Path(__file__).parents[2])
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


def test_a_profiler_off_before_fsdpviz_warms_up_is_left_alone() -> None:
    done = subprocess.run([sys.executable, "-c", IDLE_PROGRAM], capture_output=True, text=True, timeout=120,
                          check=False, cwd=Path(__file__).parents[2])
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
def test_the_steps_a_scripts_profiler_was_on_in_are_noted(mode: str, trace: str, noted: str) -> None:
    done = subprocess.run([sys.executable, "-c", MODES_PROGRAM, mode], capture_output=True, text=True, timeout=120,
                          check=False, cwd=Path(__file__).parents[2])
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1].split(" | ") == [trace, noted]
