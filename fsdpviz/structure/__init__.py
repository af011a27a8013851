"""What the trace says happened, before any figure: the analysed steps, the framework, the FSDP units'
labels (and every mask over them) and the windows they open, every collective with its purpose, the
units' spans, the device mesh's parallelism, the ranks' clocks, the profiler's cost from the timers,
and the interval arithmetic, notes and packed tables they are built with.

The second layer (docs/architecture.md): it reads ``fsdpviz.trace``'s tables and nothing above;
``fsdpviz.analysis`` turns it into figures. Never imports torch, holoviews or bokeh, and importing the
package imports no pandas.
"""
