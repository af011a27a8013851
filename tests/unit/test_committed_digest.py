"""A committed recording is stale when what made it changed: the digest of tests/helpers/committed.py
must cover every fsdpviz module the recorder imports that shapes what a recording holds."""

from __future__ import annotations

import ast
from pathlib import Path

from helpers.committed import RECORDER, RECORDER_FILES, REPO

# Imported by the recorder, and cannot change what a committed copy holds (each with why).
CANNOT_CHANGE_A_RECORDING = {
    "fsdpviz": "the version string run.json records (a new version stamps new recordings, the traces as they were)",
    "fsdpviz.errors": "the exception classes a refused or failed recording raises",
    "fsdpviz.commands.common": "the terminal's words",
    # after the ranks end: the summary and report the command writes, which tests analyse again anyway
    "fsdpviz.analysis.pipeline": "the analysis after the recording",
    "fsdpviz.commands.summary": "the summary printed after the recording",
    "fsdpviz.whatif.gains": "the summary's actions after the recording",
    "fsdpviz.report.build": "the report written after the recording",
}


def _module(path: Path) -> str:
    return ".".join(path.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")


def _fsdpviz_imports(path: Path) -> set[str]:
    """Every fsdpviz module ``path`` imports, anywhere in it, outside fsdpviz.record."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = ([node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module
                 else [a.name for a in node.names] if isinstance(node, ast.Import) else [])
        for name in names:
            if name.split(".")[0] != "fsdpviz" or name.startswith("fsdpviz.record"):
                continue
            if isinstance(node, ast.ImportFrom):  # `from fsdpviz import vocabulary` imports a module
                out |= {f"{name}.{a.name}" for a in node.names
                        if (REPO / Path(*f"{name}.{a.name}".split("."))).with_suffix(".py").is_file()}
            out.add(name)
    return out


def test_the_digest_covers_every_module_the_recorder_imports() -> None:
    digested = {_module(f) for f in {*RECORDER.rglob("*.py"), *RECORDER_FILES} if f.is_relative_to(REPO / "fsdpviz")}
    imported: dict[str, set[str]] = {}
    for path in {*RECORDER.rglob("*.py"), *RECORDER_FILES}:
        if path.is_relative_to(REPO / "fsdpviz"):
            for name in _fsdpviz_imports(path):
                imported.setdefault(name, set()).add(str(path.relative_to(REPO)))
    uncovered = {name: sorted(by) for name, by in imported.items()
                 if name not in digested and name not in CANNOT_CHANGE_A_RECORDING}
    assert not uncovered, f"imported by the recorder, in no committed copy's digest: {uncovered}"
    # the list says why of modules the recorder does import, not of ones it no longer does
    assert set(CANNOT_CHANGE_A_RECORDING) <= set(imported), set(CANNOT_CHANGE_A_RECORDING) - set(imported)
    # the names the timers and the process groups' labels write come from the vocabulary
    assert "fsdpviz.vocabulary" in imported and "fsdpviz.vocabulary" in digested
