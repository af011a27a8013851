"""The Python the docs show must exist as shown: every ``from fsdpviz... import name`` in a code block
imports, every dotted ``fsdpviz.…`` name in backticks resolves, and every call of an imported fsdpviz
function in a code block binds to its signature (no keyword it does not take, no missing argument).
A doc that names a function the code no longer has, or a signature that changed, fails here."""

from __future__ import annotations

import ast
import importlib
import inspect
import re
from pathlib import Path
from typing import Any

import pytest

DOCS = Path(__file__).resolve().parents[2] / "docs"
PAGES = sorted(DOCS.glob("*.md"))
_BLOCK = re.compile(r"```python\n(.*?)```", re.DOTALL)
_DOTTED = re.compile(r"`(fsdpviz(?:\.[A-Za-z_]\w*)+)")


def _resolve(dotted: str) -> Any:
    """The object a dotted name names: the longest importable module prefix, then attributes."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj: Any = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for attr in parts[i:]:
            obj = getattr(obj, attr)
        return obj
    raise ImportError(dotted)


def _blocks(page: Path) -> list[ast.Module]:
    out = []
    for text in _BLOCK.findall(page.read_text()):
        try:
            out.append(ast.parse(text))
        except SyntaxError:  # a fragment, not a program
            continue
    return out


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_python_in_docs_exists_as_shown(page: Path) -> None:
    problems = []
    for dotted in sorted(set(_DOTTED.findall(page.read_text()))):
        try:
            _resolve(dotted)
        except (ImportError, AttributeError):
            problems.append(f"`{dotted}` does not exist")
    for tree in _blocks(page):
        imported: dict[str, Any] = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("fsdpviz"):
                for alias in node.names:
                    try:
                        imported[alias.asname or alias.name] = _resolve(f"{node.module}.{alias.name}")
                    except (ImportError, AttributeError):
                        problems.append(f"from {node.module} import {alias.name}: no such name")
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in imported):
                continue
            func = imported[node.func.id]
            if not callable(func) or any(isinstance(a, ast.Starred) for a in node.args) or any(
                    k.arg is None for k in node.keywords):
                continue
            try:
                inspect.signature(func).bind(*node.args, **{k.arg: k.value for k in node.keywords if k.arg})
            except TypeError as e:
                problems.append(f"{node.func.id}(...) at line {node.lineno} of a code block: {e}")
    assert not problems, f"{page.name}: " + "; ".join(problems)
