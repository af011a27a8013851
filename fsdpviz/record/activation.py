"""Which processes of a recorded command get the agent, and when it is armed.

``fsdpviz record`` puts ``fsdpviz/record/bootstrap/`` first on ``PYTHONPATH``; its
``sitecustomize`` calls :func:`activate` in every Python process the command starts (torchrun's
agent, the ranks, helpers, dataloader workers started with *spawn*). This module decides, without
importing torch, whether the process may record:

1. not under ``fsdpviz record`` (no ``FSDPVIZ_RUN_DIR``): do nothing;
2. a descendant of a process that records (``FSDPVIZ_OWNER_PID`` set to another pid): do nothing
   -- helpers and dataloader workers a candidate started before it began to record inherit that
   variable from it;
3. otherwise the process is a candidate. A candidate with ``RANK`` and ``WORLD_SIZE`` in its
   environment (torchrun, the deepspeed launcher and accelerate set them for their workers) is a
   rank: it keeps fsdpviz's variables for itself (``environment.launch_environment``) and takes them, and the
   bootstrap's ``PYTHONPATH`` entry, out of its environment at once (``environment.leave_environment``), so
   that the script sees the environment of a bare run and nothing it starts records. Any other
   candidate (torchrun's own agent, a plain ``python train.py``) only becomes a rank if it runs the
   forward of a sharded model; it claims ``FSDPVIZ_OWNER_PID`` and leaves the environment then.

Nothing is imported until the process imports torch itself: a watcher on ``sys.meta_path`` arms the
agent right after ``import torch`` finishes, so the user's script still controls when torch loads
(and the environment torch reads at import time). Forked children (dataloader workers) inherit an
armed agent; the agent disables itself in them (``os.register_at_fork``).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from types import ModuleType
from typing import Final

from fsdpviz.record.environment import leave_environment
from fsdpviz.record.options import ENV_OWNER_PID, ENV_RUN_DIR

ROLE_NONE: Final = "none"  # not recording, not a candidate
ROLE_RANK: Final = "rank"  # a launcher worker: records from its first sharded forward
ROLE_CANDIDATE: Final = "candidate"  # records only if it runs a sharded forward


def classify_process(env: Mapping[str, str], pid: int) -> str:
    """Return this process's role (``ROLE_*``) from its environment and pid."""
    if not env.get(ENV_RUN_DIR):
        return ROLE_NONE
    owner = env.get(ENV_OWNER_PID, "")
    if owner and owner != str(pid):
        return ROLE_NONE
    if env.get("RANK", "").isdigit() and env.get("WORLD_SIZE", "").isdigit():
        return ROLE_RANK
    return ROLE_CANDIDATE


class _TorchImportWatcher(importlib.abc.MetaPathFinder):
    """Calls ``on_import`` once, right after the top-level ``torch`` module has executed."""

    def __init__(self, on_import: Callable[[], None]) -> None:
        self._on_import = on_import

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != "torch":
            return None
        sys.meta_path.remove(self)  # find the real spec with the other finders, once
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        loader = spec.loader
        on_import = self._on_import

        class _Loader(importlib.abc.Loader):
            def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
                return loader.create_module(spec)

            def exec_module(self, module: ModuleType) -> None:
                loader.exec_module(module)
                module.__loader__ = loader  # leave no trace of the watcher on torch
                if module.__spec__ is not None:
                    module.__spec__.loader = loader
                on_import()

            def __getattr__(self, name: str) -> object:
                return getattr(loader, name)

        spec.loader = _Loader()
        return spec


def _arm(role: str) -> None:
    try:
        from fsdpviz.record import agent

        agent.arm(role)
    except Exception as exc:  # noqa: BLE001 - never break the user's training over the recorder
        print(f"fsdpviz: recording disabled in pid {os.getpid()}: {exc!r}", file=sys.stderr)


def activate() -> str:
    """Set up this process according to its role; called from the bootstrap ``sitecustomize``."""
    role = classify_process(os.environ, os.getpid())
    if role == ROLE_NONE:
        return role
    if role == ROLE_RANK:
        leave_environment()
    if "torch" in sys.modules:
        _arm(role)
    else:
        sys.meta_path.insert(0, _TorchImportWatcher(lambda: _arm(role)))
    return role
