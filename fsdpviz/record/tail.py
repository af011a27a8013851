"""The recorded command's stderr, passed through unchanged, with its last lines kept.

When a command fails before any rank records (a mistyped script name, an import error, a bad
argument), what the user needs to read is what the command said last. ``fsdpviz record`` therefore
gives the command's descriptor 2 a pipe, or a pseudo-terminal when its own stderr is a terminal (so
that the command still sees one: colours and progress bars stay as they were), and a thread copies
every byte to the real stderr as it arrives and keeps the last :data:`KEEP_BYTES` of it. stdin and
stdout are the command's own, untouched, unless stdout and stderr go to one file or pipe that is not a
terminal (``> train.log 2>&1``, ``2>&1 | tee``): the command's stdout then goes into the same pipe, so
that what it writes to the two keeps its order in that file, as bare (:func:`one_destination`).

Anything unexpected (no pty on this system, no file descriptors left) leaves stderr as it is: the
command runs as it would without fsdpviz, and no lines are kept.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Iterator
from typing import Any, Final

KEEP_BYTES: Final = 64 * 1024  # the last 64 KiB of the command's stderr (a few hundred lines)
LAST_LINES_KEPT: Final = 200  # of those, the lines :meth:`StderrTail.finish` answers
DRAIN_S: Final = 2.0  # after the command ends: how long to wait for the rest (a process it left behind)


class StderrTail:
    """Forwards a descriptor's bytes to stderr and keeps the last of them; see the module docstring.

    Use :meth:`start` (returns the descriptor to give the command as its stderr, or None), then
    :meth:`child_started` once the command holds its end, then :meth:`finish` when it has ended."""

    def __init__(self) -> None:
        self._read_fd: int | None = None
        self._write_fd: int | None = None
        self._pty = False
        self._kept = bytearray()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._old_winch: Any = None
        self.stdout_too = False  # the command's stdout goes into the same pipe (see the module docstring)

    def start(self) -> int | None:
        """Open the pipe or pty and start forwarding; the descriptor for the command, or None."""
        try:
            out_fd = sys.stderr.fileno()
        except (AttributeError, OSError, ValueError):  # replaced by an object without a descriptor
            return None
        try:
            if os.isatty(out_fd):
                import pty
                import tty

                self._read_fd, self._write_fd = pty.openpty()
                tty.setraw(self._write_fd)  # bytes pass as written: no \n -> \r\n, no echo
                self._pty = True
                self._copy_size(out_fd)
            else:
                self._read_fd, self._write_fd = os.pipe()
                self.stdout_too = _one_destination_as_stdout(out_fd)
        except (OSError, ImportError):
            self._close_all()
            return None
        self._thread = threading.Thread(target=self._forward, args=(out_fd,), name="fsdpviz-stderr", daemon=True)
        self._thread.start()
        return self._write_fd

    def child_started(self) -> None:
        """The command holds the writing end now: close ours, so that its end is the pipe's end."""
        if self._write_fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._write_fd)
            self._write_fd = None

    def finish(self) -> list[str]:
        """Wait briefly for the last bytes; the kept lines (text, without line ends)."""
        self.child_started()
        if self._thread is not None:
            self._thread.join(DRAIN_S)
        if self._old_winch is not None:
            with contextlib.suppress(ValueError, OSError):
                signal.signal(signal.SIGWINCH, self._old_winch)
            self._old_winch = None
        with self._lock:
            data = bytes(self._kept)
        text = data.decode("utf-8", errors="replace")
        # a progress bar redrawn with \r: each redraw is a line of its own; keep the last
        lines = [line.rstrip("\r").rsplit("\r", 1)[-1] for line in text.split("\n")]
        if len(data) >= KEEP_BYTES and lines:
            lines = lines[1:]  # the first line was cut
        return [line.rstrip() for line in lines if line.strip()][-LAST_LINES_KEPT:]

    def _forward(self, out_fd: int) -> None:
        assert self._read_fd is not None
        try:
            for chunk in _chunks(self._read_fd):
                with contextlib.suppress(OSError):
                    _write_all(out_fd, chunk)
                with self._lock:
                    self._kept += chunk
                    if len(self._kept) > KEEP_BYTES:
                        del self._kept[:len(self._kept) - KEEP_BYTES]
        finally:
            with contextlib.suppress(OSError):
                os.close(self._read_fd)

    def _copy_size(self, out_fd: int) -> None:
        """The pty gets the terminal's size, now and whenever the terminal is resized."""
        import fcntl
        import termios

        def copy(*_: object) -> None:
            with contextlib.suppress(OSError):
                if self._read_fd is not None:
                    size = fcntl.ioctl(out_fd, termios.TIOCGWINSZ, b"\0" * 8)
                    fcntl.ioctl(self._read_fd, termios.TIOCSWINSZ, size)

        copy()
        if threading.current_thread() is threading.main_thread():
            self._old_winch = signal.signal(signal.SIGWINCH, copy)

    def _close_all(self) -> None:
        for fd in (self._read_fd, self._write_fd):
            if fd is not None:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._read_fd = self._write_fd = None


def _one_destination_as_stdout(fd: int) -> bool:
    """:func:`one_destination` of this process's stdout and ``fd``; False where stdout has no descriptor
    (replaced by an object without one)."""
    try:
        return one_destination(sys.stdout.fileno(), fd)
    except (AttributeError, OSError, ValueError):
        return False


def one_destination(first: int, second: int) -> bool:
    """Whether descriptors ``first`` and ``second`` write to one file or pipe that is not a terminal
    (``> log 2>&1``): what a process writes to the two must then reach it in the order written."""
    try:
        return os.path.samestat(os.fstat(first), os.fstat(second)) and not os.isatty(first)
    except OSError:
        return False


def _chunks(fd: int) -> Iterator[bytes]:
    while True:
        try:
            chunk = os.read(fd, 65536)
        except OSError:  # a pty whose every writer has closed reads as EIO
            return
        if not chunk:
            return
        yield chunk


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]
