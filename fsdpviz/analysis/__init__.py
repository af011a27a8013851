"""Pure functions on the tables of ``fsdpviz.trace.schema``: steps, overlap, units, memory, compare.

Never imports torch, holoviews or bokeh. Importing the package imports no pandas (a command starts
parsing before it imports the analysis); ``summarize`` is loaded on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fsdpviz.analysis.summary import summarize

__all__ = ["summarize"]


def __getattr__(name: str) -> Any:
    if name == "summarize":
        from fsdpviz.analysis.summary import summarize

        return summarize
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
