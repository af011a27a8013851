"""The quickstart's summary of the bundled sample is what ``fsdpviz summary`` prints for it.

The sample and the analysis are fixed, so its output is too (the clock's replay and its out-of-sample
miss included); a change that moves a figure the quickstart shows must change the page with it.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from fsdpviz.cli import main

REPO = Path(__file__).resolve().parents[2]
COMMAND = "fsdpviz summary sample_traces/fsdp2-cpu-2rank"


def _shown_output() -> list[str]:
    """The lines of the output block that follows the command's block, up to its ``...``."""
    text = (REPO / "docs" / "quickstart.md").read_text(encoding="utf-8")
    at = text.index(f"```bash\n{COMMAND}\n```")
    block = re.search(r"```\n(.*?)```", text[at + len(COMMAND) + 12:], flags=re.DOTALL)
    assert block is not None
    lines = block.group(1).splitlines()
    return lines[:lines.index("...")]


def test_the_quickstart_shows_what_summary_prints(capsys: pytest.CaptureFixture[str],
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)
    monkeypatch.setenv("COLUMNS", "80")
    shown = _shown_output()
    capsys.readouterr()
    with pytest.raises(SystemExit) as done:
        main(["summary", "sample_traces/fsdp2-cpu-2rank", "--no-cache", "-q"])
    out, err = capsys.readouterr()
    assert done.value.code in (0, None), err
    printed = [line.rstrip() for line in out.splitlines()]
    assert len(shown) > 20 and printed[:len(shown)] == shown
