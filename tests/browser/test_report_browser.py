"""The report opens offline in headless Chromium, draws every section, and keeps names as text.

Each test builds a real report (a real 2-rank CPU recording, a real GPU trace, a recording whose
names carry markup; the CPU recording's page once per session, ``sample_report``, and the marked-up
copy once for the module), opens it from a file:// URL over the DevTools protocol, and checks what
the browser did: no uncaught exception or console error, no dialog (an ``alert`` from injected
markup), no request outside the file itself, bokeh documents idle with their canvases drawn, and
screenshots of every plot that are not blank.
"""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import pytest

from fsdpviz.analysis.pipeline import analyse_traces
from fsdpviz.report.build import build_report
from fsdpviz.trace import TraceSet, load_traces

from .conftest import PAGE_STATE_JS, hover_bar, image_stats

pytestmark = pytest.mark.browser

SAMPLE = Path(__file__).resolve().parents[2] / "sample_traces" / "fsdp2-cpu-2rank"
XSS = "<img src=x onerror=alert(1)>"


def _check_opened(page, expected_sections: set[str], min_roots: int = 2) -> None:
    log, state = page.log, page.state
    assert log.exceptions == []
    assert log.console_errors == []
    assert log.dialogs == []
    assert [u for u in log.requests if not u.startswith("file://")] == []
    assert state["scripts_with_src"] == 0
    assert state["bokeh_documents"] == 1 and state["bokeh_idle"]
    assert expected_sections <= set(state["sections"])
    assert state["bokeh_roots"] >= min_roots
    assert state["canvases"] >= min_roots
    stddev, colours = image_stats(page.screenshot)
    assert stddev > 10 and colours > 20, "page screenshot looks blank"
    assert page.plot_shots, "no plot area found on the page"
    for shot in page.plot_shots:
        stddev, colours = image_stats(shot)
        assert stddev > 5 and colours > 8, f"{shot.name} looks blank"


def test_cpu_recording_report_draws_offline(open_report, sample_report: Path) -> None:
    page = open_report(sample_report)
    _check_opened(page, {"headline", "timeline", "steps"})
    text = page.state["text"]
    assert "rank 1 · gloo 0" in text or "rank 1" in text
    assert "overlap" in text


@pytest.mark.parametrize(("trace", "why_no_units"), [
    # DDP on A100, one rank of two: said to be DDP
    ("nccl_parser_config/nccl_data.json.gz", "wrapped in DistributedDataParallel, not FSDP"),
    ("trace_filter", "wrapped in DistributedDataParallel, not FSDP"),  # two ranks of a 128-rank DDP job
    # no ProfilerStep at all: the whole trace is drawn
    ("tracelens_b200_eager/eager_trace.json.gz", "Per-unit views need FSDP labels"),
])
def test_gpu_trace_report_draws_offline(open_report, tmp_path: Path, gpu_real_dir: Path, trace: str,
                                        why_no_units: str) -> None:
    traces = load_traces([gpu_real_dir / trace], cache=False)
    result = build_report(analyse_traces(traces), tmp_path / "gpu.html")
    page = open_report(result.path)
    # without ProfilerSteps there are no step times to plot: the time line is the one plot
    _check_opened(page, {"headline", "timeline", "steps"}, min_roots=1 if traces.steps.empty else 2)
    assert why_no_units in page.state["text"]


ZERO3 = SAMPLE.parent / "zero3-cpu-2rank"
VICTIM = "tok_emb"  # a unit of the ZeRO-3 sample, named in fsdpviz's own labels


def _poison(src: Path, dst: Path) -> None:
    """Copy a real trace: unit VICTIM, the thread names and one operator renamed to an HTML payload."""
    with gzip.open(src, "rt", encoding="utf-8") as fh:
        trace = json.load(fh)
    for event in trace["traceEvents"]:
        if event.get("ph") == "M" and event.get("name") == "thread_name":
            event["args"]["name"] = f"{XSS} {event['args'].get('name', '')}"
        name = event.get("name", "")
        if VICTIM in name:
            event["name"] = name.replace(VICTIM, XSS)
        elif name == "aten::mm":
            event["name"] = XSS
    with gzip.open(dst, "wt", encoding="utf-8") as fh:
        json.dump(trace, fh)


def _poisoned_run(tmp_path: Path) -> Path:
    run = tmp_path / "run"
    shutil.copytree(ZERO3, run, ignore=shutil.ignore_patterns(".fsdpviz-cache", "report.html"))
    for trace in sorted((run / "traces").glob("rank*.trace.json.gz")):
        _poison(trace, trace)
    meta = json.loads((run / "run.json").read_text())
    meta["label"] = XSS
    for unit in meta["units"]:
        unit["unit"] = XSS if unit["unit"] == VICTIM else unit["unit"]
    (run / "run.json").write_text(json.dumps(meta))
    return run


@pytest.fixture(scope="module")
def poisoned(tmp_path_factory: pytest.TempPathFactory) -> TraceSet:
    """The ZeRO-3 sample's renamed copy (:func:`_poisoned_run`), loaded once; the tests only read it."""
    if not ZERO3.is_dir():
        pytest.skip(f"sample recording {ZERO3} missing")
    return load_traces([_poisoned_run(tmp_path_factory.mktemp("poisoned"))], cache=False)


def test_names_with_markup_stay_text(open_report, tmp_path: Path, poisoned: TraceSet) -> None:
    traces = poisoned
    result = build_report(analyse_traces(traces), tmp_path / "xss.html")
    page = open_report(result.path)
    _check_opened(page, {"headline", "timeline", "units"})
    assert page.log.dialogs == []
    assert all(src is None or not src.startswith("x") for src in page.state["imgs"])
    # the payload is shown as text: in the title, the unit legend, the findings and the unit table
    assert XSS in page.state["title"]
    assert page.state["text"].count(XSS) >= 3
    html = result.path.read_text(encoding="utf-8")
    assert XSS not in html  # every occurrence is escaped, in markup and in bokeh's JSON
    # and in a tooltip: hover a bar of the unit, the tooltip shows the name, nothing runs
    tooltip = hover_bar(page, "unit_name", XSS)
    assert f"unit: {XSS}" in tooltip
    assert page.log.dialogs == [] and page.log.console_errors == []
    state = page.browser.evaluate(PAGE_STATE_JS)
    assert all(src is None or not src.startswith("x") for src in state["imgs"])


def test_report_html_has_no_external_urls(sample_report: Path) -> None:
    import re

    html = sample_report.read_text(encoding="utf-8")
    tags = re.findall(r"<(?:script|link|img|iframe|source)\b[^>]*>", html, flags=re.IGNORECASE)
    assert tags, "expected inline script tags"
    for tag in tags:
        assert not re.search(r"""(?:src|href)\s*=\s*["']?(?:https?:)?//""", tag, flags=re.IGNORECASE), tag
    assert "Content-Security-Policy" in html and "default-src 'none'" in html


def test_poisoned_copy_is_still_a_run(poisoned: TraceSet) -> None:
    # guards the XSS test: poisoning must keep the run loadable and the payload a unit of it
    from fsdpviz.analysis.run import analyse_run

    traces = poisoned
    assert any(XSS in lane for lane in traces.lanes["thread_name"].astype(str))
    analysis = analyse_run(traces)
    assert XSS in set(analysis.spans["unit"]) and XSS in set(analysis.unit_stats["unit"])
