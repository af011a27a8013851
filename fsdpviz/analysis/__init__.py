"""Pure functions on the tables of ``fsdpviz.trace.schema``: steps, overlap, units, memory, compare.

Never imports torch, holoviews or bokeh. Importing the package imports no pandas (a command starts
parsing before it imports the analysis). The entry point is :mod:`fsdpviz.analysis.pipeline`:
``analyse`` (paths) or ``analyse_traces`` (loaded traces) gives a ``RunResult`` whose ``summary``,
``analysis`` and ``aligned`` tables every command reads.
"""
