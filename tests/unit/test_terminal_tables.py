"""The terminal's tables are never squeezed: piped at 80 columns every unit name and every number is
printed whole; in a narrow terminal names are cut in the middle and stay told apart."""

from __future__ import annotations

import io
from pathlib import Path

import msgspec
import pytest
from rich.console import Console
from rich.table import Table

from fsdpviz.analysis.pipeline import analyse
from fsdpviz.commands.summary import print_summary
from fsdpviz.commands.terminal import ELLIPSIS, fit_names, print_table

RUN = Path(__file__).parents[1] / "recorded" / "fake8-block" / "run"
# a Llama's units: eight names that differ only after a 27-character prefix, one size each
LONG = [f"model.language_model.layers.{i}.self_attn" for i in range(8)] + ["model.language_model.layers.10.mlp"]
PARAMS = 1_048_576


def test_piped_summary_keeps_every_name_and_number(capsys: pytest.CaptureFixture[str],
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    summary = analyse([RUN], cache=False, progress=False).summary
    recorded = summary.units[1:]
    units = [msgspec.structs.replace(u, name=name, param_numel=PARAMS) for u, name in zip(recorded * 3, LONG)]
    print_summary(msgspec.structs.replace(summary, units=units, actions=[]))
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if "model.language_model" in line]
    assert len(rows) == len(LONG)
    for row, name in zip(rows, LONG):
        cells = [c.strip() for c in row.strip("│ ").split("│")]
        assert cells[0] == name and cells[1] == f"{PARAMS:,}"
        assert ELLIPSIS not in row
    # the recorded forward times, whole, in the column they belong to
    forwards = [c.strip() for row in rows for c in [row.split("│")[4]]]
    assert forwards == [f"{u.forward_ms:,.2f}" for u in (recorded * 3)[:len(LONG)]]


def test_narrow_terminal_cuts_names_in_the_middle_and_keeps_them_apart() -> None:
    out = io.StringIO()
    console = Console(file=out, width=60, force_terminal=True, color_system=None)

    def table() -> Table:
        t = Table()
        for col in ("unit", "params", "forward", "backward"):
            t.add_column(col, no_wrap=True)
        return t

    print_table(console, table, [[name, f"{PARAMS:,}", "12.34", "56.78"] for name in LONG])
    lines = out.getvalue().splitlines()
    assert max(len(line) for line in lines) <= 60
    shown = [line.split("│")[1].strip() for line in lines if f"{PARAMS:,}" in line]
    assert len(shown) == len(set(shown)) == len(LONG)
    for name, cut in zip(LONG, shown):
        head, _, tail = cut.partition(ELLIPSIS)
        assert head and tail and name.startswith(head) and name.endswith(tail)
    assert all(f"{PARAMS:,}" in line and "56.78" in line for line in lines if ELLIPSIS in line)


def test_fit_names_refuses_a_cut_that_merges_names() -> None:
    # two names equal but for one middle character: no cut of 8 keeps them apart
    assert fit_names(["aaaaaaaaaaXaaaaaaaaaa", "aaaaaaaaaaYaaaaaaaaaa"], 8) is None
    assert fit_names(["short", "names"], 8) == ["short", "names"]
    cut = fit_names(LONG, 16)
    assert cut is not None and all(len(c) <= 16 for c in cut) and len(set(cut)) == len(LONG)
    assert cut[-1] == "mode…yers.10.mlp"  # a third from the start, the rest from the end
