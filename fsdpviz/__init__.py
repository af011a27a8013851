"""fsdpviz: see, per FSDP unit, whether parameter all-gathers hide behind compute.

In a notebook or script::

    import fsdpviz
    run = fsdpviz.open("runs/block")      # see fsdpviz.api
    run.summary, run.units, run.gantt(), run.whatif(prefetch=1)

Layers import downward only (docs/architecture.md); ``trace``, ``analysis`` and ``whatif`` never
import torch, holoviews or bokeh, and ``import fsdpviz`` imports nothing heavy.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"
__all__ = ["Run", "WhatIf", "__version__", "compare", "open"]

if TYPE_CHECKING:
    from fsdpviz.api import Run, WhatIf, compare, open


def __getattr__(name: str) -> Any:
    # the API pulls in pandas on first use only: `fsdpviz --help` and the recorder's ranks stay light
    if name in ("open", "compare", "Run", "WhatIf"):
        from fsdpviz import api

        return getattr(api, name)
    raise AttributeError(f"module 'fsdpviz' has no attribute {name!r}")
