"""Tables in the terminal that are never squeezed: every number keeps all its digits, and every row's
name stays told apart from the others.

rich shrinks a table that is wider than the console by cutting cells (``layers…``, ``1,048,…``), and a
console that is not a terminal (a pipe, a file, CI's log) is 80 columns wide unless ``COLUMNS`` says
otherwise. So a table gets the width it needs when the output is not a terminal (nothing reads it on
a screen of 80 columns, and ``grep`` wants whole names). In a terminal narrower than the table, the
names are cut in the middle (``model.lay…ers.3.mlp``), keeping their start and their distinguishing
tail; where no cut keeps them apart, or the numbers alone are wider than the terminal, the table is
printed whole and the terminal wraps its lines.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

ELLIPSIS = "…"
UNBOUNDED = 10_000
MIN_NAME_WIDTH = 8  # a name cut shorter than this tells little: print the table whole instead


def cut_middle(name: str, width: int, head: int) -> str:
    """``name`` in ``width`` characters: its first ``head`` characters, ``…``, and its end."""
    if len(name) <= width:
        return name
    tail = width - 1 - head
    return name[:head] + ELLIPSIS + (name[len(name) - tail:] if tail > 0 else "")


def fit_names(names: Sequence[str], width: int) -> list[str] | None:
    """The names cut in the middle to at most ``width`` characters, still all distinct where they were;
    None when no cut keeps them apart (or ``width`` is below :data:`MIN_NAME_WIDTH`).

    The cut keeps about a third of the width from the start and the rest from the end, where names
    that share a long prefix (``model.layers.11.mlp``) differ; where that is not enough, other
    splits are tried, nearest that one first."""
    if all(len(n) <= width for n in names):
        return list(names)
    if width < MIN_NAME_WIDTH:
        return None
    wanted = len(set(names))
    preferred = width // 3
    for head in sorted(range(width - 1), key=lambda h: (abs(h - preferred), h)):
        cut = [cut_middle(n, width, head) for n in names]
        if len(set(cut)) == wanted:
            return cut
    return None


def print_table(console: Console, make_table: Callable[[], Table], rows: Sequence[Sequence[str]], *,
                row_styles: Sequence[str | None] | None = None, name_column: int | None = 0) -> None:
    """Add ``rows`` (plain text, escaped here) to a table from ``make_table`` (its title and columns)
    and print it unsqueezed (see the module docstring); ``name_column``: the column of names that may
    be cut in a terminal."""
    from rich.markup import escape

    def fill(cells: Sequence[Sequence[str]]) -> Table:
        out = make_table()
        for i, row in enumerate(cells):
            out.add_row(*(escape(c) for c in row), style=row_styles[i] if row_styles else None)
        return out

    whole = fill(rows)
    from rich.measure import Measurement

    # measured as if the console were unbounded: a measure within it is clamped to its width
    needed = Measurement.get(console, console.options.update_width(UNBOUNDED), whole).maximum
    if needed <= console.width:
        console.print(whole)
        return
    if console.is_terminal and name_column is not None and rows:
        names = [row[name_column] for row in rows]
        fitted = fit_names(names, max(len(n) for n in names) - (needed - console.width))
        if fitted is not None:
            console.print(fill([[*row[:name_column], name, *row[name_column + 1:]]
                                for row, name in zip(rows, fitted)]))
            return
    width = console.width
    console.width = needed
    try:
        console.print(whole)
    finally:
        console.width = width
