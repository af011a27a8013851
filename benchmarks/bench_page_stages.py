"""Where a small run's report page goes, stage by stage, and the one walk of each view's bokeh models
against the two ``select`` walks it replaced.

Per round, in one process after its imports: the analysis (``analyse`` and the per-unit analysis), the
page's data (``prepare_report``), its views (``build_page``), holoviews' rendering of each view into
bokeh models, then on those same models the two walks (``select`` Plot, ``select`` Toolbar, as
``report/html.py`` did) and the one walk it does now, then ``render_page`` whole (which renders the views
again, walks them once, and runs bokeh's ``components`` and the inline resources), and on a document of the
page's views made again, bokeh's validation walk (which ``render_page`` skips) and the inline resources
bundled from a walk of each root (before) and from the document's set of models (now). Before the rounds,
``fsdpviz report`` itself in fresh interpreters and the imports alone (``python -c 'import ...'``).

    python benchmarks/bench_page_stages.py [RUN] [--rounds 3]

RUN defaults to the bundled example (``sample_traces/fsdp2-cpu-2rank``, copied without its cache).
Results are recorded in docs/performance.md ("Building the report").
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]  # this checkout's fsdpviz, and the harness

from harness import describe_machine, run_measured, spread

IMPORTS = ("import fsdpviz.cli, fsdpviz.analysis.pipeline, fsdpviz.report.build, fsdpviz.report.page, "
           "fsdpviz.report.html, fsdpviz.report.data, holoviews")


def _wall(argv: list[str]) -> float:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])  # this checkout's fsdpviz
    done = run_measured(argv, env=env)
    if done.returncode != 0:
        sys.exit(f"{' '.join(argv)} failed:\n{done.stderr[-2000:]}")
    return done.wall_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", nargs="?", default=str(ROOT / "sample_traces" / "fsdp2-cpu-2rank"))
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp) / "run"
        shutil.copytree(args.run, run, ignore=shutil.ignore_patterns(".fsdpviz-cache"))
        page_out = Path(tmp) / "page.html"
        command = [sys.executable, "-m", "fsdpviz", "report", str(run), "-q", "--no-cache", "-o", str(page_out)]
        whole = [_wall(command) for _ in range(args.rounds)]
        imports = [_wall([sys.executable, "-c", IMPORTS]) for _ in range(args.rounds)]
        print(describe_machine())
        print(f"input: {args.run}")
        print(f"fsdpviz report, fresh interpreter: {spread(whole)} s")
        print(f"imports alone, fresh interpreter: {spread(imports)} s")

        import holoviews as hv
        from bokeh.embed.bundle import bundle_for_objs_and_resources
        from bokeh.model import Model
        from bokeh.models import Plot, Toolbar
        from bokeh.resources import Resources

        from fsdpviz.analysis.pipeline import analyse
        from fsdpviz.report.data import prepare_report
        from fsdpviz.report.html import _inline_resources, page_document, render_page
        from fsdpviz.report.page import build_page
        from fsdpviz.trace.schema import own_this_process

        own_this_process()  # the tables' strings as the command line stores them
        rows: dict[str, list[float]] = {}

        def timed(name: str, start: float) -> float:
            now = time.perf_counter()
            rows.setdefault(name, []).append(now - start)
            return now

        for _ in range(args.rounds):
            t = time.perf_counter()
            result = analyse([run], cache=False, progress=False)
            result.analysis  # noqa: B018 - the per-unit analysis, computed here
            t = timed("analysis", t)
            data = prepare_report(result)
            t = timed("page data (prepare_report)", t)
            page = build_page(data)
            t = timed("views (build_page)", t)
            models = []
            for section in page.sections:
                for view in section.views.values():
                    for one in view if isinstance(view, list) else [view]:
                        models.append(one if isinstance(one, Model) else hv.render(one, backend="bokeh"))
            t = timed("holoviews' rendering into bokeh", t)
            for model in models:
                for plot in model.select({"type": Plot}):
                    plot.output_backend = "canvas"
                for toolbar in model.select({"type": Toolbar}):
                    toolbar.logo = None
            t = timed("two select walks (before)", t)
            for model in models:
                for part in model.references():
                    if isinstance(part, Plot):
                        part.output_backend = "canvas"
                    elif isinstance(part, Toolbar):
                        part.logo = None
            t = timed("one walk (now)", t)
            render_page(build_page(data))
            t = timed("render_page whole (renders the views again)", t)
            # What render_page no longer does on the document it makes: bokeh's validation walk, and
            # the bundle's walk of each root (it reads the document's set of models instead).
            doc, _, _ = page_document(build_page(data))
            t = time.perf_counter()
            doc.validate()
            t = timed("bokeh's validation of the document (skipped)", t)
            bundle_for_objs_and_resources(list(doc.roots), Resources(mode="inline", log_level="warn"))
            t = timed("bundle from each root's walk (before)", t)
            _inline_resources(doc)
            timed("bundle from the document's models (now)", t)
        for name, values in rows.items():
            print(f"{name:45s} {spread(values, '{:.3f}')} s over {len(values)} rounds")


if __name__ == "__main__":
    main()
