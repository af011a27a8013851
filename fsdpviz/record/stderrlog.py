"""Keep the profiler's own log lines out of the user's terminal while a rank profiles.

torch.profiler and Kineto write to the process's stderr from C++: ``USDT: ... profiler_start`` /
``profiler_stop`` at every start and stop, and c10's warning ``Memory block of unknown size was
allocated before the profiling started`` once per rank. They land between the training's own output
and progress bars, once per rank, and say nothing the user asked for. While the profiler is active
the rank's file descriptor 2 therefore points into a pipe; a thread reads it and forwards every
byte to the real stderr unchanged, except whole lines that match :data:`PROFILER_LINES`, which go to
``logs/rank{R}.log`` in the run folder instead.

Where the rank's stdout and stderr go to one file or pipe (``> log 2>&1``, or the launcher's one pipe
for both: record/tail.py), descriptor 1 points into the same pipe while the filter runs, so that what
the rank writes to the two keeps its order.

Forwarding is immediate: a partial line (a progress bar redrawn with ``\\r``) is passed on as soon as
it arrives, unless it could still become a profiler line (it starts like one); such a line is held
until its end arrives or for at most :data:`HOLD_S`. The pipe gets a large buffer, so a burst of
output never waits on the thread. When the profiler stops, descriptor 2 is restored; a forked child
that still writes into the pipe keeps being forwarded until it closes it.

Linux only in practice (``os.pipe`` and ``dup2`` exist elsewhere too, but anything unexpected simply
leaves stderr as it is: recording never changes a run's behaviour over a log line).
"""

from __future__ import annotations

import os
import re
import select
import sys
import threading
from pathlib import Path
from typing import BinaryIO, Final

from fsdpviz.record.tail import one_destination

PROFILER_LINES: Final = re.compile(
    rb"^(?:USDT:|STAGE:)"  # Kineto's start / stop / stage lines
    rb"|Memory block of unknown size was allocated before the profiling started"
    rb"|Profiler is not initialized: skipping step\(\) invocation"
    # the profiler's collection warns, once per rank, of a range still open when the trace is taken (the
    # optimizer's own step range: the trace is written from the optimizer's step hook)
    rb"|collection\.cpp:\d+\] Warning: "
    # Kineto's, when fsdpviz's profiler stops as a script's own starts (record/profiling.py)
    rb"|disableProfiler called but no active profiling session found"
)
# A partial line that starts like this may still become a profiler line: hold it for its end.
_MAYBE_PROFILER: Final = re.compile(rb"^(?:U(?:S(?:D(?:T:?)?)?)?|S(?:T(?:A(?:G(?:E:?)?)?)?)?|\[)$|^(?:USDT:|STAGE:|\[)")
_PIECES: Final = re.compile(rb"(?<=[\r\n])")
HOLD_S: Final = 0.05
PIPE_BYTES: Final = 1 << 20
_F_SETPIPE_SZ: Final = 1031  # fcntl command (Linux)


class ProfilerLogFilter:
    """Routes descriptor 2 through the filter between :meth:`start` and :meth:`stop` (idempotent)."""

    def __init__(self, log_path: Path) -> None:
        self.log_path = log_path
        self.captured = 0  # profiler lines moved to the log
        self._saved: int | None = None
        self._saved_out: int | None = None  # descriptor 1, where it went where 2 goes
        self._read: int | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    @property
    def active(self) -> bool:
        return self._saved is not None

    def start(self) -> None:
        if self.active:
            return
        try:
            sys.stderr.flush()
            saved = os.dup(2)
            read, write = os.pipe()
        except (OSError, ValueError, AttributeError):
            return
        try:
            import fcntl

            fcntl.fcntl(write, _F_SETPIPE_SZ, PIPE_BYTES)
        except (ImportError, OSError):  # a smaller buffer still works
            pass
        if one_destination(1, 2):
            try:
                sys.stdout.flush()
                self._saved_out = os.dup(1)
                os.dup2(write, 1)
            except (OSError, ValueError, AttributeError):
                self._saved_out = None
        os.dup2(write, 2)
        os.close(write)
        self._saved, self._read = saved, read
        self._thread = threading.Thread(target=self._forward, args=(read, saved), name="fsdpviz-stderr",
                                        daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Restore descriptor 2; what is already in the pipe is still forwarded."""
        saved = self._saved
        if saved is None:
            return
        try:
            sys.stderr.flush()
        except (OSError, ValueError, AttributeError):
            pass
        self._saved = None
        if self._saved_out is not None:
            try:
                sys.stdout.flush()
            except (OSError, ValueError, AttributeError):
                pass
            os.dup2(self._saved_out, 1)
            os.close(self._saved_out)
            self._saved_out = None
        os.dup2(saved, 2)  # closes this process's last write end of the pipe
        if self._thread is not None:
            self._thread.join(timeout=1.0)  # EOF unless a forked child still holds the pipe

    def _forward(self, read: int, out: int) -> None:
        pending = b""
        log = None
        try:
            while True:
                ready, _, _ = select.select([read], [], [], HOLD_S if pending else None)
                if not ready:  # a held partial line did not become a profiler line in time
                    _write_all(out, pending)
                    pending = b""
                    continue
                chunk = os.read(read, 1 << 16)
                if not chunk:
                    break
                # pieces end at a newline or at a carriage return (progress bars redraw with "\r")
                lines = _PIECES.split(pending + chunk)
                pending = lines.pop()
                passed: list[bytes] = []
                moved: list[bytes] = []
                for line in lines:
                    (moved if PROFILER_LINES.search(line) else passed).append(line)
                if pending and not _MAYBE_PROFILER.match(pending[:6]):
                    passed.append(pending)
                    pending = b""
                if passed:
                    _write_all(out, b"".join(passed))
                if moved:
                    log = log or self._open_log()
                    if log is not None:
                        log.write(b"".join(moved))
                        log.flush()
                    with self._lock:
                        self.captured += len(moved)
            if pending:
                _write_all(out, pending)
        except OSError:
            pass
        finally:
            if log is not None:
                log.close()
            for fd in (read, out):
                try:
                    os.close(fd)
                except OSError:
                    pass

    def _open_log(self) -> BinaryIO | None:
        """The log file, opened for appending once there is a line for it (None: cannot be written)."""
        try:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            return open(self.log_path, "ab")  # lives as long as the filter
        except OSError:
            return None


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
