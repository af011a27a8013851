"""Kineto trace JSON -> tidy tables (see ``schema``). Never imports torch or plotting.

Entry point: :func:`load_traces` returns a :class:`TraceSet` of typed DataFrames.
"""

from fsdpviz.trace.loader import load_traces
from fsdpviz.trace.tables import TraceSet

__all__ = ["TraceSet", "load_traces"]
