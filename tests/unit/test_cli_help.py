"""Every command's help reads at 80 columns as written: descriptions wrapped to the width, value names
instead of type labels, brackets kept, an example, and no pointer to a docs/ page that an installed
package does not have."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from fsdpviz.cli import main

COMMANDS = ["summary", "record", "report", "export", "compare", "whatif"]


def _help(argv: list[str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
          columns: int = 80) -> str:
    monkeypatch.setenv("COLUMNS", str(columns))
    with pytest.raises(SystemExit) as exc:
        main([*argv, "--help"])
    assert exc.value.code == 0
    out, err = capsys.readouterr()
    assert err == ""
    return out


@pytest.mark.parametrize("command", COMMANDS)
def test_help_reads_at_80_columns(command: str, capsys: pytest.CaptureFixture[str],
                                  monkeypatch: pytest.MonkeyPatch) -> None:
    text = _help([command], capsys, monkeypatch)
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= 80, text
    assert not re.search(r"[╭│╰]", text)  # no boxes: a box's columns squeeze the descriptions
    # the descriptions of the options get most of the width: the longest line of the options part
    # is a description line that reaches past column 70 (rich's panels stopped at ~50)
    options = text[text.index("Options:"):]
    assert max(len(line) for line in options.splitlines()) > 70, text
    assert not re.search(r"<(bool|str|int|float|path|list\[\w+\])[^>]*>", text), text  # no type labels
    assert "{" + command not in text and "{run" not in text and "{paths" not in text
    assert "docs/" not in text  # a pip install has no docs folder
    example = text[text.index("Example:"):].splitlines()[2:]
    assert example and all(line.strip().startswith(f"fsdpviz {command} ") for line in example if line.strip())


def test_value_names_and_brackets(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    whatif = " ".join(_help(["whatif"], capsys, monkeypatch).split())
    for shown in ("Usage: fsdpviz whatif [OPTIONS] RUN", "--reshard-after-forward true|false",
                  "--prefetch implicit|none|N", "--wrap root|merge:K|match:REGEX", "--memory-budget SIZE"):
        assert shown in whatif
    compare = " ".join(_help(["compare"], capsys, monkeypatch).split())
    assert 'Print {"runs": [summary of each run], "deltas": {...}, ...} on stdout.' in compare
    assert "Usage: fsdpviz compare [OPTIONS] RUN..." in compare
    record = " ".join(_help(["record"], capsys, monkeypatch).split())
    assert "--mode profile|timers|both" in record and "--steps N" in record
    export = " ".join(_help(["export"], capsys, monkeypatch).split())
    assert "--format parquet|csv|perfetto" in export


def test_command_list_is_not_cut(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    text = _help([], capsys, monkeypatch)
    listed = text[text.index("Commands:"):].split("\n\n")[0].splitlines()[1:]
    assert [line.split()[0] for line in listed] == COMMANDS
    assert not any(line.rstrip().endswith("...") for line in listed), text
    assert max(len(line) for line in text.splitlines()) <= 80
    assert "    fsdpviz record -o runs/base -- torchrun" in text  # where to start


@pytest.mark.parametrize("command", ["summary", "report", "compare", "whatif"])
def test_every_loading_command_takes_quiet(command: str, capsys: pytest.CaptureFixture[str],
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    text = _help([command], capsys, monkeypatch)
    assert re.search(r"-q, --quiet\s+No progress lines on stderr\.", text), text


def test_summary_quiet_prints_nothing_on_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    from pathlib import Path

    sample = Path(__file__).parents[2] / "sample_traces" / "fsdp2-cpu-2rank"
    with pytest.raises(SystemExit) as done:
        main(["summary", str(sample), "-q", "--json", "--no-cache"])
    assert not done.value.code
    out, err = capsys.readouterr()
    assert err == "" and '"framework": "fsdp2"' in out


@pytest.mark.parametrize("command", ["record", "report", "export", "compare", "whatif"])
def test_every_writing_command_takes_out_and_output(command: str, capsys: pytest.CaptureFixture[str],
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """``record -o`` was ``--out`` and ``report -o`` ``--output``: a user who learned one typed it to the other
    and got an error. Each command that writes takes both spellings of its ``-o``."""
    text = _help([command], capsys, monkeypatch)
    assert re.search(r"-o, --(out, --output|output, --out) ", text), text


def test_report_writes_where_out_says(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sample = Path(__file__).parents[2] / "sample_traces" / "fsdp2-cpu-2rank"
    page = tmp_path / "page.html"
    with pytest.raises(SystemExit) as done:
        main(["report", str(sample), "--out", str(page), "--no-cache", "-q"])
    assert done.value.code in (0, None)
    assert capsys.readouterr().out.strip() == str(page)
    assert page.read_text(encoding="utf-8").startswith("<!DOCTYPE html>")
