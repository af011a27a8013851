"""The report page with its bokeh roots added to one document in one freeze, against without.

``bokeh.embed.components`` puts the page's roots (one per figure, table and widget) into one bokeh
document; each ``add_root`` walks the whole model graph again, once per root. ``render_page`` adds the
roots to a document itself, inside one ``doc.models.freeze()``, so the graph is walked once. This
benchmark times the page of one analysed run (``build_report`` handed the analysed ``RunResult``) both
ways, alternating in one process round by round (the second path: the document ``render_page`` makes
swapped for one that keeps nothing, so ``components`` adds the roots as it did before), and prints
each way's CPU seconds per round, their medians and minima.

    python benchmarks/bench_report_roots.py [RUN] [--rounds 8]

RUN defaults to the bundled example (``sample_traces/fsdp2-cpu-2rank``). Results are recorded in
docs/performance.md.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


class _NoModels:
    @contextlib.contextmanager
    def freeze(self) -> Iterator[None]:
        yield


class _NoDocument:
    """A document that keeps nothing: ``components`` then adds the roots one by one, as before."""

    def __init__(self) -> None:
        self.models = _NoModels()

    def add_root(self, model: Any) -> None:
        pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("run", nargs="?", type=Path, default=ROOT / "sample_traces" / "fsdp2-cpu-2rank")
    parser.add_argument("--rounds", type=int, default=8)
    args = parser.parse_args()

    import bokeh.document

    from fsdpviz.analysis.pipeline import analyse
    from fsdpviz.report.build import build_report

    run = analyse([args.run], cache=False)
    run.summary  # noqa: B018 - the per-unit analysis, before any page is timed
    frozen = bokeh.document.Document
    out = Path(tempfile.mkdtemp())
    times: dict[str, list[float]] = {"one freeze": [], "one walk per root": []}
    try:
        for r in range(args.rounds):
            order = list(times) if r % 2 == 0 else list(reversed(times))
            for way in order:
                bokeh.document.Document = frozen if way == "one freeze" else _NoDocument  # type: ignore[misc]
                started = time.process_time()
                build_report(run, out / "page.html")
                times[way].append(time.process_time() - started)
    finally:
        bokeh.document.Document = frozen  # type: ignore[misc]
    for way, ts in times.items():
        print(json.dumps({"way": way, "median_cpu_s": round(statistics.median(ts), 2),
                          "min_cpu_s": round(min(ts), 2), "rounds_cpu_s": [round(t, 2) for t in ts]}))


if __name__ == "__main__":
    main()
