"""The figures of a run, measured from its structure (``fsdpviz.structure``): whole-step overlap and
the bound, the units' per-step overlap and statistics, memory peaks and categories and the ZeRO
memory model, findings, actions, the summary, and several runs compared.

Never imports torch, holoviews or bokeh. Importing the package imports no pandas (a command starts
parsing before it imports the analysis). The entry point is :mod:`fsdpviz.analysis.pipeline`:
``analyse`` (paths) or ``analyse_traces`` (loaded traces) gives a ``RunResult`` whose ``summary``,
``analysis`` and ``aligned`` tables every command reads.
"""
