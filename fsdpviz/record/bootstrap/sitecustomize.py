"""fsdpviz record bootstrap: put first on PYTHONPATH by ``fsdpviz record`` (see docs/recording.md).

Starts fsdpviz's rank-side agent in the processes that should record, then runs the
``sitecustomize`` that this one shadows, if there is one. Must never break the user's program.
"""

import importlib.machinery
import importlib.util
import os
import sys


def _fsdpviz_activate():
    try:
        from fsdpviz.record.activation import activate
    except Exception as exc:  # noqa: BLE001 - a Python without fsdpviz (another venv): run unrecorded
        print(f"fsdpviz: not recording pid {os.getpid()} ({sys.executable}): {exc!r}", file=sys.stderr)
        return
    activate()


def _chain_shadowed_sitecustomize():
    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)


_fsdpviz_activate()
_chain_shadowed_sitecustomize()
