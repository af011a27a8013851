"""The profiler's own log lines leave the user's terminal for the run folder's log; everything else
passes through unchanged and in order, partial lines (progress bars) included."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

PROGRAM = textwrap.dedent('''
    import os, sys, time
    from pathlib import Path
    from fsdpviz.record.stderrlog import ProfilerLogFilter
    f = ProfilerLogFilter(Path(sys.argv[1]))
    os.write(2, b"before\\n")
    f.start()
    os.write(2, b"USDT:2026-11-23 21:20:35 7789:7789 SyncActivityProfilerHandler.cpp:52] profiler_start\\n")
    os.write(2, b"training 10%\\r")                  # a progress bar: no newline, passed on at once
    time.sleep(0.2)
    os.write(2, b"training 20%\\r[rank0]:[W1123 CPUAllocator.cpp:245] Memory block of unknown size was "
                b"allocated before the profiling started, profiler results will not include the deallocation event\\n")
    os.write(2, b"[rank0]:[W1202 16:07:12.954682895 collection.cpp:664] Warning: Optimizer.step#AdamW.step "
                b"(function operator())\\n")
    print("a Python warning line", file=sys.stderr)
    os.write(2, b"[rank0]: a user line in brackets\\n")
    f.stop()
    os.write(2, b"USDT: after the profiler stopped, left alone\\n")
    print(f.captured)
''')


def test_profiler_lines_go_to_the_log_and_the_rest_passes_through(tmp_path: Path) -> None:
    log = tmp_path / "logs" / "rank0.log"
    done = subprocess.run([sys.executable, "-c", PROGRAM, str(log)], check=False, capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stderr == (b"before\ntraining 10%\rtraining 20%\ra Python warning line\n"
                           b"[rank0]: a user line in brackets\nUSDT: after the profiler stopped, left alone\n")
    assert log.read_bytes().splitlines() == [
        b"USDT:2026-11-23 21:20:35 7789:7789 SyncActivityProfilerHandler.cpp:52] profiler_start",
        (b"[rank0]:[W1123 CPUAllocator.cpp:245] Memory block of unknown size was allocated before the profiling "
         b"started, profiler results will not include the deallocation event"),
        b"[rank0]:[W1202 16:07:12.954682895 collection.cpp:664] Warning: Optimizer.step#AdamW.step (function operator())",
    ]
    assert done.stdout.strip() == b"3"
