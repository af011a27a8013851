"""The documentation points at things that exist: every relative link of README.md and docs/ names a
file of the repository and, with ``#anchor``, a heading of that page; every ``docs/<page>.md`` the
code or its help texts mention is a page."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PAGES = sorted([REPO / "README.md", *(REPO / "docs").glob("*.md")])
LINK = re.compile(r"\]\(([^)\s]+)\)")
CODE_BLOCK = re.compile(r"```.*?```", re.DOTALL)


def _anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    text = CODE_BLOCK.sub("", page.read_text(encoding="utf-8"))
    return {_anchor(m.group(1)) for m in re.finditer(r"^#+\s+(.*)$", text, re.MULTILINE)}


def test_anchor_rule() -> None:
    assert _anchor("After a crash, a kill or Ctrl-C") == "after-a-crash-a-kill-or-ctrl-c"
    assert _anchor("The report (`fsdpviz report`)") == "the-report-fsdpviz-report"
    assert _anchor("2. The runs side by side") == "2-the-runs-side-by-side"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_relative_links_resolve(page: Path) -> None:
    broken = []
    for target in LINK.findall(CODE_BLOCK.sub("", page.read_text(encoding="utf-8"))):
        if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        if not linked.exists():
            broken.append(f"{target}: no such file")
        elif anchor and linked.suffix == ".md" and anchor not in _anchors(linked):
            broken.append(f"{target}: no heading with anchor #{anchor} in {linked.name}")
    assert not broken, "\n".join(broken)


def test_pages_named_in_code_exist() -> None:
    named = set()
    for source in [*(REPO / "fsdpviz").rglob("*.py"), *(REPO / "benchmarks").glob("*.py"), REPO / "Makefile"]:
        named |= {(source, m) for m in re.findall(r"docs/[\w\-]+\.md", source.read_text(encoding="utf-8"))}
    missing = sorted(f"{s.relative_to(REPO)}: {m}" for s, m in named if not (REPO / m).exists())
    assert named and not missing, "\n".join(missing)
