"""``warning:`` lines about what a loaded run lacks (ranks without a trace, skipped events).

Shared by every command that reads traces, so that they all say it the same way; the texts come
from :mod:`fsdpviz.analysis.gaps`, which also puts them in the summary's notes.
"""

from __future__ import annotations

import sys
from typing import Any


def warn_gaps(traces: Any) -> None:
    """Print one ``warning: ...`` line on stderr per gap in ``traces`` (a ``TraceSet``)."""
    from fsdpviz.analysis.gaps import gap_warnings

    for message in gap_warnings(traces):
        print(f"warning: {' '.join(message.split())}", file=sys.stderr, flush=True)
