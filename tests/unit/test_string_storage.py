"""pandas' string storage under fsdpviz's tables (``fsdpviz.trace.schema.STRING_STORAGE``).

In a process fsdpviz owns (the command line; the suite runs as it does), the loader sets it to Python
objects, because fsdpviz's many small tables analyse faster so (docs/performance.md, "String
storage"); a notebook's process keeps pandas' own. The storage must change the speed only: the bundled
samples' ``summary --json`` is the same text whether their tables hold Arrow strings (pandas' default
with pyarrow installed) or Python objects.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pytest

from fsdpviz.analysis.pipeline import analyse
from fsdpviz.cache import summary_json_text
from fsdpviz.trace import schema
from fsdpviz.whatif.gains import completed_summary

SAMPLE_TRACES_DIR = Path(__file__).resolve().parents[2] / "sample_traces"


@pytest.fixture
def storage_restored() -> Iterator[None]:
    before = pd.get_option("mode.string_storage")
    yield
    pd.set_option("mode.string_storage", before)


def _summary_text(name: str) -> str:
    return summary_json_text(completed_summary(analyse([SAMPLE_TRACES_DIR / name], cache=False)))


def test_the_loaded_tables_hold_python_strings(storage_restored: None) -> None:
    pd.set_option("mode.string_storage", "pyarrow")  # as a process that has not loaded a run has it
    result = analyse([SAMPLE_TRACES_DIR / "fsdp2-cpu-2rank"], cache=False)
    strings = [(name, col) for name, frame in (("lanes", result.traces.lanes), ("steps", result.traces.steps),
                                               ("units", result.analysis.units))
               for col in frame.columns if isinstance(frame[col].dtype, pd.StringDtype)]
    assert strings, "no string column to check"
    for name, col in strings:
        frame = {"lanes": result.traces.lanes, "steps": result.traces.steps, "units": result.analysis.units}[name]
        assert frame[col].dtype.storage == "python", (name, col, frame[col].dtype)


@pytest.mark.parametrize("name", ["fsdp2-cpu-2rank", "zero3-cpu-2rank"])
def test_the_storage_changes_no_figure(name: str, storage_restored: None, monkeypatch: pytest.MonkeyPatch) -> None:
    python = _summary_text(name)
    monkeypatch.setattr(schema, "STRING_STORAGE", "pyarrow")
    arrow = _summary_text(name)
    assert pd.get_option("mode.string_storage") == "pyarrow"  # the other storage was really used
    assert arrow == python


def test_a_parser_process_that_analyses_its_rank_uses_it_too(storage_restored: None) -> None:
    # rank by rank (a run too large to hold whole): each rank is analysed where it is parsed, by the
    # parser's task, run here in this process
    pd.set_option("mode.string_storage", "pyarrow")
    from fsdpviz.trace.parse_task import parse_file

    seen: list[str] = []

    def per_rank(tables: object) -> int:
        seen.append(pd.get_option("mode.string_storage"))
        return 0

    trace = min((SAMPLE_TRACES_DIR / "fsdp2-cpu-2rank" / "traces").glob("*.json*"))
    parsed = parse_file(str(trace), False, per_rank)
    assert isinstance(parsed, list) and seen == ["python"]


# what a fresh process reads of pandas' string storage after fsdpviz loaded and analysed a sample
AFTER = """
import sys
import pandas as pd
sample = sys.argv[1]
if sys.argv[2] == "notebook":
    import fsdpviz
    run = fsdpviz.open(sample)
    run.summary
else:
    from fsdpviz.cli import main
    try:
        main(["summary", "--json", "--no-cache", "-q", sample])
    except SystemExit:
        pass
print(pd.get_option("mode.string_storage"), pd.Series(["a"]).dtype.storage, file=sys.stderr)
"""


@pytest.mark.parametrize(("how", "storage"), [("notebook", "auto"), ("command", "python")])
def test_only_a_process_fsdpviz_owns_changes_it(how: str, storage: str) -> None:
    done = subprocess.run([sys.executable, "-c", AFTER, str(SAMPLE_TRACES_DIR / "fsdp2-cpu-2rank"), how],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    option, made = done.stderr.strip().splitlines()[-1].split()
    assert option == storage
    assert made == ("python" if storage == "python" else "pyarrow")  # pyarrow is installed (a dependency)
