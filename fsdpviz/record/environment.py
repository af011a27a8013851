"""fsdpviz's variables in a recording process's environment, and taking them out again.

``fsdpviz record`` reaches the ranks only through their environment (``options.py``) and a bootstrap
folder on ``PYTHONPATH``. A rank keeps what they say here and takes them out of ``os.environ`` and
``sys.path``, so that the script sees the environment of a bare run (``activation.py`` says when).
Imports nothing heavy: it runs as Python starts.
"""

from __future__ import annotations

import os
import sys
from typing import Final

from fsdpviz.record.options import LAUNCHER_VARIABLES

BOOTSTRAP_DIR: Final = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bootstrap")
# fsdpviz's variables as the process found them (the recording's options, its id), kept here once a
# rank has taken them out of its environment
_LAUNCH_ENV: dict[str, str] = {}


def launch_environment() -> dict[str, str]:
    """fsdpviz's variables as ``fsdpviz record`` gave them to this process, also after
    :func:`leave_environment` took them out of ``os.environ``."""
    return {**{k: os.environ[k] for k in LAUNCHER_VARIABLES if k in os.environ}, **_LAUNCH_ENV}


def leave_environment() -> None:
    """Take fsdpviz's variables out of this process's environment, as a bare run has it: the
    ``FSDPVIZ_*`` ones ``fsdpviz record`` set (kept for :func:`launch_environment`) and the bootstrap's
    entry on ``PYTHONPATH`` and ``sys.path`` (its ``sitecustomize`` already ran). Processes started
    from now on inherit neither, so they do not record."""
    for key in LAUNCHER_VARIABLES:
        value = os.environ.pop(key, None)
        if value is not None:
            _LAUNCH_ENV.setdefault(key, value)
    paths = os.environ.get("PYTHONPATH")
    if paths is not None:
        kept = [p for p in paths.split(os.pathsep) if os.path.abspath(p or os.curdir) != BOOTSTRAP_DIR]
        if kept:
            os.environ["PYTHONPATH"] = os.pathsep.join(kept)
        else:
            del os.environ["PYTHONPATH"]
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != BOOTSTRAP_DIR]
