"""Kineto trace JSON -> tidy tables (see ``schema``). Never imports torch or plotting.

Entry point: :func:`load_traces` returns a :class:`TraceSet` of typed DataFrames.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fsdpviz.trace.loader import load_traces
    from fsdpviz.trace.tables import TraceSet

__all__ = ["TraceSet", "load_traces"]


def __getattr__(name: str) -> Any:
    # Imported on first use: a module of this package that needs neither (trace.sources, which the
    # summary cache's key reads) is imported without the loader, numpy and the parser behind it.
    if name == "load_traces":
        from fsdpviz.trace.loader import load_traces

        return load_traces
    if name == "TraceSet":
        from fsdpviz.trace.tables import TraceSet

        return TraceSet
    raise AttributeError(f"module 'fsdpviz.trace' has no attribute {name!r}")
