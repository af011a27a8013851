"""What a rank leaves for the launcher, and the hooks that make sure it leaves it.

Each recording rank writes ``ranks/rank{R}.json``: the facts the launcher merges into run.json
(framework, units, versions, the profiled steps, status). It is written when recording starts
(status ``running``) and again when the rank finishes -- at a normal exit, after an uncaught
exception, or on SIGTERM, which torchrun sends to the surviving ranks when one fails.
:class:`ExitHooks` installs those three hooks and remembers how the script ended; every file is
written under a temporary name and renamed, so the launcher never reads half a file.

At a normal exit the hooks also give gloo's work threads a moment without the GIL (see
:func:`gloo_workers`): PyTorch aborts a rank whose interpreter finalizes while one of them still
waits for the GIL to release the last collective, and that abort would fail the recording.
"""

from __future__ import annotations

import atexit
import json
import os
import platform
import signal
import sys
import threading
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch

from fsdpviz import __version__
from fsdpviz.runfolder import PARTIAL_SUFFIX
from fsdpviz.vocabulary import GLOO_THREAD_PREFIX

Finish = Callable[[str, "str | None"], None]  # finish(status, reason)

GLOO_WORKER = b"pt_gloo_runloop"  # the thread name ProcessGroupGloo gives its work loops
GLOO_RENAMED = GLOO_THREAD_PREFIX.encode()  # the name record/groups.py gives a worker while it profiles
GLOO_PAUSE_S = 0.1


def now_iso() -> str:
    """The local time with its offset, to the millisecond (run.json's timestamps)."""
    return datetime.now(timezone.utc).astimezone().isoformat(timespec="milliseconds")


def write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    """Write ``data`` to ``path`` through a temporary name."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + PARTIAL_SUFFIX)
    try:
        tmp.write_text(json.dumps(data, indent=1, default=str) + "\n", encoding="utf-8")
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)
        raise


def versions() -> dict[str, str | None]:
    """Versions of everything that shapes a recording, as seen by this rank."""
    found: dict[str, str | None] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "fsdpviz": __version__,
        "cuda": torch.version.cuda,
        "nccl": None,
        "deepspeed": None,
    }
    if torch.cuda.is_available():
        try:
            found["nccl"] = ".".join(str(v) for v in torch.cuda.nccl.version())
        except (AttributeError, RuntimeError):  # NCCL not built in: leave None
            found["nccl"] = None
    if "deepspeed" in sys.modules:
        found["deepspeed"] = getattr(sys.modules["deepspeed"], "__version__", None)
    return found


class ExitHooks:
    """atexit, ``sys.excepthook`` and SIGTERM hooks that call ``finish(status, reason)`` once.

    ``finish`` must be idempotent: a failing script runs the excepthook (which only notes the
    failure) and then atexit (which finishes with it); SIGTERM finishes at once.
    """

    def __init__(self, finish: Finish) -> None:
        self._finish = finish
        self.status: str | None = None  # how the script ended, when it did not end normally
        self.failure: str | None = None
        self._previous_excepthook: Any = None
        self._previous_sigterm: Any = None

    def install(self) -> None:
        atexit.register(self._at_exit)
        self._previous_excepthook = sys.excepthook
        sys.excepthook = self._excepthook
        if threading.current_thread() is threading.main_thread():
            self._previous_sigterm = signal.getsignal(signal.SIGTERM)
            signal.signal(signal.SIGTERM, self._on_sigterm)

    def _excepthook(self, exc_type: type[BaseException], exc: BaseException, tb: Any) -> None:
        self.failure = f"{exc_type.__name__}: {exc}"
        self.status = "interrupted" if issubclass(exc_type, KeyboardInterrupt) else "failed"
        self._previous_excepthook(exc_type, exc, tb)

    def _at_exit(self) -> None:
        self._finish(self.status or "ok", self.failure)
        # Registered first, this handler runs last: after it the interpreter finalizes, and a gloo
        # work thread still waiting for the GIL to drop the last collective's Python state then
        # aborts the rank ("terminate called without an active exception"; how often:
        # docs/testing.md). Sleeping releases the GIL to it.
        if gloo_workers():
            time.sleep(GLOO_PAUSE_S)

    def _on_sigterm(self, signum: int, frame: Any) -> None:
        self._finish("interrupted", f"received {signal.Signals(signum).name}")
        previous = self._previous_sigterm
        if callable(previous):
            previous(signum, frame)
        elif previous != signal.SIG_IGN:
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)  # die of the signal, as without fsdpviz

    def ignore_sigterm(self) -> bool:
        """While finishing: a second SIGTERM (torchrun's) must not cut the writing short.
        Returns whether it did (only the main thread can); undo with :meth:`restore_sigterm`."""
        if threading.current_thread() is not threading.main_thread():
            return False
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        return True

    def restore_sigterm(self) -> None:
        if self._previous_sigterm is not None:
            signal.signal(signal.SIGTERM, self._on_sigterm)


def gloo_workers() -> int:
    """How many of this process's threads are gloo work loops (0 where /proc is not there)."""
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return 0
    count = 0
    for task in tasks:
        try:
            with open(f"/proc/self/task/{task}/comm", "rb") as comm:
                name = comm.read().strip()
                # torch's name, or the one the recorder gives a worker while it profiles (record/groups.py)
                count += name == GLOO_WORKER or name.startswith(GLOO_RENAMED)
        except OSError:  # the thread ended meanwhile
            continue
    return count


def usable_cpus() -> int:
    """CPU cores this process may run on (its affinity mask where the OS has one)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1
