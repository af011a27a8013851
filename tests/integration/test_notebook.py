"""``examples/explore_run.ipynb`` executed headless (nbclient + ipykernel), its numbers checked.

The notebook opens the bundled sample run through ``fsdpviz.open``; the references are the command
line's own answers for the same folder: ``fsdpviz summary --json`` and ``fsdpviz whatif --json``.
"""

from __future__ import annotations

import json

import pytest
from helpers.cli import json_here
from helpers.jobs import REPO

NOTEBOOK = REPO / "examples" / "explore_run.ipynb"
SAMPLE = REPO / "sample_traces" / "fsdp2-cpu-2rank"


@pytest.fixture(scope="module")
def executed() -> list:
    nbformat = pytest.importorskip("nbformat", reason="the notebook test needs nbformat (a test dependency)")
    nbclient = pytest.importorskip("nbclient", reason="the notebook test needs nbclient (a test dependency)")
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                            resources={"metadata": {"path": str(NOTEBOOK.parent)}}).execute()
    return [c for c in nb.cells if c.cell_type == "code"]


def _printed_json(cell) -> dict:
    text = "".join(o.text for o in cell.outputs if o.output_type == "stream" and o.name == "stdout")
    return json.loads(text)


@pytest.mark.slow
def test_notebook_numbers_are_the_command_lines(executed: list, capsys: pytest.CaptureFixture[str]) -> None:
    errors = [o for c in executed for o in c.outputs if o.output_type == "error"]
    assert not errors, [f"{o.ename}: {o.evalue}" for o in errors]
    summary = json_here(capsys, "summary", "--json", str(SAMPLE), "--no-cache")
    said = _printed_json(next(c for c in executed if "step_time_ms" in c.source and "print" in c.source))
    assert said == {"framework": summary["framework"], "world_size": summary["world_size"], "steps": summary["steps"],
                    "step_time_ms": summary["step_time_ms"],
                    "exposed_comm_ms": summary["overlap"]["exposed_comm_ms"],
                    "units": [u["name"] for u in summary["units"]]}
    none = json_here(capsys, "whatif", str(SAMPLE), "--prefetch", "none", "--json", "-q", "--no-cache")
    root = json_here(capsys, "whatif", str(SAMPLE), "--wrap", "root", "--json", "-q", "--no-cache")
    predicted = _printed_json(next(c for c in executed if "prefetch_none_ms" in c.source))
    assert predicted == {"baseline_ms": none["baseline"]["step_time_ms"],
                         "prefetch_none_ms": none["predicted"]["step_time_ms"],
                         "root_ms": root["predicted"]["step_time_ms"], "root_units": ["(root)"]}


@pytest.mark.slow
def test_plots_display_inline(executed: list) -> None:
    plots = [c for c in executed if c.source.startswith(("run.gantt", "run.memory_curve", "run.unit_times"))]
    assert len(plots) == 3
    for cell in plots:
        results = [o for o in cell.outputs if o.output_type == "execute_result"]
        assert results and "application/vnd.holoviews_exec.v0+json" in results[0]["data"], cell.source
