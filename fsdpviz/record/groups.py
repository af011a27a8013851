"""Which process group each collective ran on, written into the trace where gloo names none.

On GPU, NCCL's ``record_param_comms`` names the process group of every collective. On CPU, gloo's
ops (``gloo:all_gather`` on a worker thread, ``c10d::*`` on the training thread) name none, and two
collectives of one kind and size in two groups (HSDP's shard and replica groups, a script's own
``dist.new_group``) look alike. The recorder runs in the process, so it names both ends:

- the call: every collective call of a ``ProcessGroup`` (the methods ``torch.distributed``'s
  functions call: ``all_gather_single``, ``allreduce``, ``reduce_scatter_single``, ``barrier``...)
  runs inside a ``fsdpviz.group <name>`` range while the profiler records, so the ``c10d::*`` op
  it issues sits inside its group's range;
- the run: a ``ProcessGroupGloo`` runs its collectives on worker threads it starts when created
  (named ``pt_gloo_runloop`` by torch). The recorder notes which threads appear while torch creates
  a group (``distributed_c10d._new_process_group_helper``) and, when the profiler starts, renames
  those workers ``gloo pg <name>``: Kineto writes thread names into the trace, so the lane says its
  group. Linux only (``/proc/self/task``); the OS keeps 15 characters of a thread name, so a group
  whose name is longer than 7 characters keeps torch's name.

``<name>`` is the group's name as distributedInfo's ``pg_config`` (and NCCL's ``Process Group
Name``) gives it. What is not named (functional collectives, issued by C++ without a Python call;
groups made another way) is paired by size as before (structure/collectives.py).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

from fsdpviz.vocabulary import GLOO_THREAD_PREFIX, GROUP_LABEL_PREFIX

# ProcessGroup methods that issue a collective (torch 2.x spellings; absent ones are skipped)
COLLECTIVE_METHODS: Final = (
    "allgather", "all_gather_single", "_allgather_base", "allgather_coalesced", "allgather_into_tensor_coalesced",
    "all_gather_single_coalesced", "allreduce", "allreduce_coalesced", "reduce_scatter", "reduce_scatter_single",
    "_reduce_scatter_base", "reduce_scatter_tensor_coalesced", "reduce_scatter_single_coalesced", "broadcast",
    "reduce", "gather", "scatter", "alltoall", "alltoall_base", "all_to_all_single", "barrier", "send", "recv",
    "recv_anysource",
)
GLOO_WORKER_NAME: Final = "pt_gloo_runloop"  # torch's name for ProcessGroupGloo's worker threads
THREAD_NAME_MAX: Final = 15  # characters Linux keeps of a thread name
_TASKS: Final = Path("/proc/self/task")


def thread_ids() -> set[int]:
    """The OS ids of this process's threads (empty where /proc is missing)."""
    try:
        return {int(t) for t in os.listdir(_TASKS)}
    except OSError:
        return set()


def thread_name(tid: int) -> str:
    """The OS name of thread ``tid`` of this process, "" once it is gone."""
    try:
        return (_TASKS / str(tid) / "comm").read_text().strip()
    except OSError:
        return ""


def worker_thread_name(group_name: str) -> str | None:
    """The name a gloo worker of ``group_name`` gets, None when it would not fit."""
    name = f"{GLOO_THREAD_PREFIX}{group_name}"
    return name if group_name and len(name) <= THREAD_NAME_MAX else None


class GroupLabels:
    """Labels collective calls with their group and notes each group's gloo workers; ``remove()``
    puts torch back. ``enter_range(label)`` returns a range to exit, or None while not profiling."""

    def __init__(self, enter_range: Callable[[str], Any], observer: Any) -> None:
        self._enter_range = enter_range
        self._observer = observer  # observer.Observer: ``labels`` while the profiler records
        self._restore: list[tuple[Any, str, Any]] = []
        self.threads: dict[int, str] = {}  # OS thread id -> the group it works for

    def install(self) -> None:
        """Wrap the ProcessGroup collectives and the group factory (no-op without torch.distributed)."""
        import torch.distributed as dist

        if not dist.is_available():
            return
        from torch.distributed import distributed_c10d as c10d

        for method in COLLECTIVE_METHODS:
            original = c10d.ProcessGroup.__dict__.get(method)
            if original is not None:
                self._replace(c10d.ProcessGroup, method, self._labelled(original))
        factory = getattr(c10d, "_new_process_group_helper", None)
        if factory is not None:
            self._replace(c10d, "_new_process_group_helper", self._watched(factory))

    def remove(self) -> None:
        """Put torch back: its functions unwrapped, its gloo workers under their own name again
        (idempotent; the profiler is done with them)."""
        for owner, name, original in reversed(self._restore):
            setattr(owner, name, original)
        self._restore.clear()
        for tid, group in self.threads.items():
            if thread_name(tid) == worker_thread_name(group):
                try:
                    (_TASKS / str(tid) / "comm").write_text(GLOO_WORKER_NAME)
                except OSError:
                    pass
        self.threads.clear()  # done: a later call costs a step nothing

    def name_workers(self) -> int:
        """Rename the gloo workers noted so far after their group; returns how many were renamed."""
        renamed = 0
        for tid, group in self.threads.items():
            name = worker_thread_name(group)
            if name is None or thread_name(tid) not in (GLOO_WORKER_NAME, name):
                continue  # another kind of thread (transport loop, store), or gone
            try:
                (_TASKS / str(tid) / "comm").write_text(name)
                renamed += 1
            except OSError:
                pass
        return renamed

    def _replace(self, owner: Any, name: str, wrapper: Any) -> None:
        self._restore.append((owner, name, owner.__dict__[name]))
        setattr(owner, name, wrapper)

    def _labelled(self, original: Any) -> Callable[..., Any]:
        enter_range, observer = self._enter_range, self._observer

        @functools.wraps(original)
        def call(pg: Any, *args: Any, **kwargs: Any) -> Any:
            if not observer.labels:  # outside the profiled steps: straight through
                observer.passes += 1
                return original(pg, *args, **kwargs)
            try:
                rng = enter_range(f"{GROUP_LABEL_PREFIX}{pg.group_name}")
            except Exception:  # noqa: BLE001 - a torch without group names: the collective runs unlabelled
                rng = None
            if rng is None:
                return original(pg, *args, **kwargs)
            try:
                return original(pg, *args, **kwargs)
            finally:
                rng.__exit__(None, None, None)

        return call

    def _watched(self, factory: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(factory)
        def create(*args: Any, **kwargs: Any) -> Any:
            before = thread_ids()
            out = factory(*args, **kwargs)
            pg = out[0] if isinstance(out, tuple) else out
            name = getattr(pg, "group_name", None) if pg is not None else None
            if isinstance(name, str) and name:
                for tid in thread_ids() - before:
                    self.threads[tid] = name
            return out

        return create
