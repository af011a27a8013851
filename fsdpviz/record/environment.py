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

from fsdpviz.record.options import ENV_BOOTSTRAP, LAUNCHER_VARIABLES

BOOTSTRAP_DIR: Final = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bootstrap")
# fsdpviz's variables as the process found them (the recording's options, its id), kept here once a
# rank has taken them out of its environment
_LAUNCH_ENV: dict[str, str] = {}
# What fsdpviz set in its own environment where the user had not (:func:`set_own_default`)
_OWN_DEFAULTS: dict[str, str] = {}


def set_own_default(name: str, value: str) -> None:
    """Set ``name`` in this process's environment unless the user did (a setting of fsdpviz's own process,
    such as Arrow's allocator for its tables): :func:`without_own_defaults` keeps it from a recorded command."""
    if name not in os.environ:
        os.environ[name] = value
        _OWN_DEFAULTS[name] = value


def without_own_defaults(env: dict[str, str]) -> dict[str, str]:
    """``env`` without what :func:`set_own_default` set, so that a recorded command gets the user's environment."""
    return {k: v for k, v in env.items() if k not in _OWN_DEFAULTS or _OWN_DEFAULTS[k] != v}


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
    # the launcher resolves its folder's links; this module's path may not be resolved, or may be another
    # copy of fsdpviz than the launcher's: the folder is recognised by its real path and by the launcher's word
    bootstrap = {os.path.realpath(BOOTSTRAP_DIR)}
    if _LAUNCH_ENV.get(ENV_BOOTSTRAP):
        bootstrap.add(os.path.realpath(_LAUNCH_ENV[ENV_BOOTSTRAP]))

    def ours(path: str) -> bool:
        return os.path.realpath(path or os.curdir) in bootstrap

    paths = os.environ.get("PYTHONPATH")
    if paths is not None:
        kept = [p for p in paths.split(os.pathsep) if not ours(p)]
        if kept:
            os.environ["PYTHONPATH"] = os.pathsep.join(kept)
        else:
            del os.environ["PYTHONPATH"]
    sys.path[:] = [p for p in sys.path if not ours(p)]
