"""Comparing runs: ``runs`` (the comparison: headline deltas, best values, settings, caveats),
``units`` (which units of different wrap policies hold the same parameters), ``memory`` (memory a
step adds, drift), ``findings`` (what differs, in words). Pure: no I/O, no plotting."""
