"""The layering of docs/architecture.md, checked on the source: which fsdpviz package may import which,
and where torch, holoviews and bokeh may appear.

Every ``import`` and ``from ... import`` of every module is read with :mod:`ast` (imports inside
functions and under ``TYPE_CHECKING`` count too: a lazy import is still a dependency), so a new
module that imports upward fails here before anyone has to notice it in review. A second test runs
the parser and the analysis in a fresh interpreter and looks at ``sys.modules``.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.kineto import TraceBuilder

PACKAGE = Path(__file__).resolve().parents[2] / "fsdpviz"

# What each part of fsdpviz may import from fsdpviz ("fsdpviz" is the top-level __init__: the version).
BASE = {"fsdpviz", "errors", "vocabulary", "formatting"}
ALLOWED: dict[str, set[str]] = {
    "fsdpviz": {"api"},  # the lazy notebook entry points (fsdpviz.open, fsdpviz.compare)
    "__main__": {"cli"},
    "errors": set(),
    "vocabulary": set(),  # the shared words (collective kinds, phases, frameworks)
    "formatting": set(),  # times and bytes as numbers and text
    "naming": set(),
    "runfolder": {"errors"},
    # the data's flow: trace -> structure -> analysis (figures) -> replay (the one clock) -> whatif -> views
    "trace": BASE | {"runfolder", "naming"},
    "structure": BASE | {"runfolder", "naming", "trace"},
    "analysis": BASE | {"runfolder", "naming", "trace", "structure"},
    "replay": BASE | {"runfolder", "naming", "trace", "structure", "analysis"},
    "whatif": BASE | {"runfolder", "naming", "trace", "structure", "analysis", "replay"},
    # the completed summary kept in the run folder's cache (read by commands and the notebook API)
    "cache": BASE | {"runfolder", "naming", "trace", "structure", "analysis", "replay", "whatif"},
    "report": BASE | {"runfolder", "naming", "trace", "structure", "analysis", "replay", "whatif"},
    "record": BASE | {"runfolder", "naming"},
    "commands": BASE | {"runfolder", "naming", "trace", "structure", "analysis", "replay", "whatif", "report", "record",
                        "cache"},
    "api": BASE | {"runfolder", "naming", "trace", "structure", "analysis", "replay", "whatif", "report", "cache"},
    # record: the process's own environment settings, which a recorded command must not inherit
    # (fsdpviz.record.environment, which imports nothing heavy)
    "cli": BASE | {"commands", "record"},
}
# Third-party packages a part must never import (the parser and analysis run where no torch is
# installed, and fast; plotting belongs to report/).
FORBIDDEN: dict[str, set[str]] = {
    "runfolder": {"torch", "pandas", "holoviews", "bokeh"},
    "naming": {"torch", "pandas", "holoviews", "bokeh"},
    "vocabulary": {"torch", "pandas", "numpy", "holoviews", "bokeh"},
    "formatting": {"torch", "pandas", "numpy", "holoviews", "bokeh"},
    "trace": {"torch", "holoviews", "bokeh", "panel", "jinja2"},
    "structure": {"torch", "holoviews", "bokeh", "panel", "jinja2"},
    "analysis": {"torch", "holoviews", "bokeh", "panel", "jinja2"},
    "replay": {"torch", "holoviews", "bokeh", "panel", "jinja2"},
    "whatif": {"torch", "holoviews", "bokeh", "panel", "jinja2"},
    "cache": {"torch", "holoviews", "bokeh", "panel", "jinja2"},
    "report": {"torch"},
    "commands": {"torch"},
    "api": {"torch"},
    "cli": {"torch", "pandas", "holoviews", "bokeh"},
}


def _part(module: str) -> str:
    """``fsdpviz.analysis.compare.runs`` -> ``analysis``; ``fsdpviz`` -> ``fsdpviz``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "fsdpviz"


def _module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(rel.parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import in ``path``."""
    module = _module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                found.append((node.lineno, ".".join([*base, node.module] if node.module else base)))
            else:
                found.append((node.lineno, node.module or ""))
    return found


def _sources() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def test_every_part_of_the_package_is_in_the_layer_table() -> None:
    parts = {_part(_module_name(p)) for p in _sources()}
    assert parts <= set(ALLOWED), f"add these to ALLOWED and docs/architecture.md: {sorted(parts - set(ALLOWED))}"


@pytest.mark.parametrize("path", _sources(), ids=lambda p: str(p.relative_to(PACKAGE.parent)))
def test_imports_go_down_the_layers(path: Path) -> None:
    me = _part(_module_name(path))
    wrong = []
    for line, name in _imports(path):
        top = name.split(".")[0]
        if top == "fsdpviz":
            other = _part(name)
            if other != me and other not in ALLOWED[me]:
                wrong.append(f"line {line}: {me} imports {name}")
        elif top in FORBIDDEN.get(me, set()):
            wrong.append(f"line {line}: {me} imports {top}")
    assert not wrong, "\n".join(wrong)


def _module_graph() -> dict[str, set[str]]:
    """Module -> the fsdpviz modules it imports (``from pkg import mod`` counts as importing ``mod``).
    The top-level ``fsdpviz`` package is left out as a target: it only re-exports the API lazily."""
    modules = {_module_name(p): p for p in _sources()}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*parts, node.module] if node.module else parts)
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            else:
                continue
            found.update(t for t in targets if t in modules and t not in (name, "fsdpviz"))
        graph[name] = found
    return graph


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_module_imports_one_that_imports_it_back() -> None:
    """No import circles, lazy or under TYPE_CHECKING included: data flows one way (a circle means
    two modules each need the other's internals, and neither can be read or tested alone)."""
    circles = _circles(_module_graph())
    assert not circles, "import circles:\n" + "\n".join(" <-> ".join(c) for c in circles)


def test_the_circle_finder_finds_a_circle_through_three_modules() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"d"}}
    assert _circles(graph) == [["a", "b", "c"]]
    assert _circles({"a": {"b"}, "b": set()}) == []


def test_the_checker_sees_relative_lazy_and_type_checking_imports(tmp_path: Path) -> None:
    """The import reader itself: an upward import hidden in each of the ways a module can hide one."""
    fake = PACKAGE / "analysis" / "_layer_probe.py"
    source = ("from typing import TYPE_CHECKING\n"
              "from ..report import build\n"
              "if TYPE_CHECKING:\n    from fsdpviz.record import agent\n"
              "def f():\n    import torch\n    import fsdpviz.commands.report\n")
    fake.write_text(source, encoding="utf-8")
    try:
        names = [name for _, name in _imports(fake)]
    finally:
        fake.unlink()
    assert names == ["typing", "fsdpviz.report", "fsdpviz.record", "torch", "fsdpviz.commands.report"]


def test_trace_and_analysis_load_no_heavy_packages(tmp_path: Path) -> None:
    """At run time too: loading and analysing a trace leaves torch and the plotting stack unimported."""
    trace = TraceBuilder().step(1, 0, 100).step(2, 100, 100).kernel("k", 1, 1, launch_us=0).write(tmp_path / "r.json")
    heavy = ("torch", "holoviews", "bokeh", "panel")
    code = f"""
import json, sys
from fsdpviz.analysis.pipeline import analyse
result = analyse([{str(trace)!r}], cache=False)
result.summary.to_json()
print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in {heavy!r})))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []


def test_a_command_starts_parsing_before_it_imports_pandas_or_plotting() -> None:
    """What ``summary`` and ``report`` import before they call ``analyse`` holds no pandas, holoviews or
    bokeh: those imports (~0.6 s together) run while the traces are parsed (``analyse(meanwhile=)``)."""
    code = """
import json, sys
import fsdpviz.cli, fsdpviz.commands.summary, fsdpviz.commands.report
from fsdpviz.analysis.pipeline import analyse
from fsdpviz.report.build import build_report, import_report_modules
from fsdpviz.trace.loader import load_run
print(json.dumps(sorted({m.split('.')[0] for m in sys.modules} & {'pandas', 'holoviews', 'bokeh', 'pyarrow'})))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []


def test_the_cli_and_every_commands_help_import_no_analysis_or_plotting() -> None:
    """``import fsdpviz.cli`` and each command's ``--help`` (all in one interpreter) stay off pandas,
    numpy, pyarrow, holoviews, bokeh and torch: a command imports what it needs when it runs."""
    code = """
import contextlib, io, json, sys
import fsdpviz.cli
for name in ("summary", "report", "compare", "export", "whatif", "record"):
    with contextlib.redirect_stdout(io.StringIO()) as out, contextlib.suppress(SystemExit):
        fsdpviz.cli.main([name, "--help"])
    assert "Usage" in out.getvalue(), name
print(json.dumps(sorted({m.split('.')[0] for m in sys.modules}
                        & {'pandas', 'numpy', 'pyarrow', 'holoviews', 'bokeh', 'torch', 'panel'})))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []


def test_a_summary_read_from_its_cache_imports_no_analysis(tmp_path: Path) -> None:
    """The second ``summary --json`` of a run reads the text the first printed (fsdpviz/cache.py): it
    imports neither the analysis nor pandas, numpy or pyarrow."""
    import shutil

    run = tmp_path / "run"
    shutil.copytree(PACKAGE.parent / "sample_traces" / "fsdp2-cpu-2rank", run,
                    ignore=shutil.ignore_patterns(".fsdpviz-cache", "report.html"))
    code = f"""
import contextlib, io, json, sys
from fsdpviz.cli import main
with contextlib.redirect_stdout(io.StringIO()) as out, contextlib.suppress(SystemExit):
    main(["summary", "--json", {str(run)!r}])
print(json.dumps([json.loads(out.getvalue())["run_dir"], sorted(m for m in sys.modules if m.startswith(
    ("fsdpviz.analysis", "fsdpviz.replay", "fsdpviz.whatif", "pandas", "numpy", "pyarrow")))]))
"""
    env = {k: v for k, v in os.environ.items() if k != "FSDPVIZ_NO_SUMMARY_CACHE"}  # the suite's: on here
    first = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert json.loads(first.stdout.strip().splitlines()[-1])[1]  # computed: the analysis was imported
    second = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert json.loads(second.stdout.strip().splitlines()[-1]) == [str(run), []]
