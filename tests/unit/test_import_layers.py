"""``fsdpviz.trace`` and ``fsdpviz.analysis`` never pull in torch, holoviews or bokeh."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from helpers.kineto import TraceBuilder

FORBIDDEN = ("torch", "holoviews", "bokeh", "panel")


def test_trace_and_analysis_import_no_heavy_packages(tmp_path: Path) -> None:
    trace = TraceBuilder().step(1, 0, 100).step(2, 100, 100).kernel("k", 1, 1, launch_us=0).write(tmp_path / "r.json")
    code = f"""
import json, sys
import fsdpviz.trace, fsdpviz.analysis
from fsdpviz.analysis.overlap import compute_overlap
from fsdpviz.analysis.summary import summarize
traces = fsdpviz.trace.load_traces([{str(trace)!r}], cache=False)
summarize(traces)
print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in {FORBIDDEN!r})))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []
