"""Pure functions on the tables of ``fsdpviz.trace.schema``: steps, overlap, units, memory, compare.

Never imports torch, holoviews or bokeh.
"""

from fsdpviz.analysis.summary import summarize

__all__ = ["summarize"]
