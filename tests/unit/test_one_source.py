"""One number, one source: the report page, the terminal, ``summary --json`` and the notebook API
show each figure of a run as the summary holds it.

For every bundled sample (``sample_traces/``) the run is analysed once, and then:

- the JSON printed by ``fsdpviz summary --json`` is the summary;
- the report's data (``prepare_report``) and its sections show the summary's headline step time,
  overlap, exposed communication and peak (with the peak's place), the step times of the steps
  section each labelled with which they are, each rank's exposed communication in the per-rank
  chart, and each unit's numbers in the unit table and the per-unit timer boxes;
- the terminal (``fsdpviz summary``) prints the same headline, per-rank and per-unit numbers;
- the notebook API (``fsdpviz.open``) hands out the same summary and per-unit bars.
"""

from __future__ import annotations

import json
import math
import re
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from helpers.cli import stdout_here

from fsdpviz import api
from fsdpviz.analysis.figures import peak_place, rank_exposed_ms, step_time_figures
from fsdpviz.analysis.pipeline import RunResult
from fsdpviz.formatting import bytes_text, format_bytes, format_ms, format_pct
from fsdpviz.report.data import actions_text, prepare_report
from fsdpviz.report.headline import headline_section
from fsdpviz.report.steps import data as steps_data
from fsdpviz.report.steps.section import steps_section
from fsdpviz.report.units.section import units_section
from fsdpviz.whatif.gains import completed_summary

SAMPLES = Path(__file__).resolve().parents[2] / "sample_traces"
NAMES = sorted(p.name for p in SAMPLES.iterdir() if p.is_dir())


@pytest.fixture(scope="module", params=NAMES)
def sample(request: pytest.FixtureRequest, sample_run: Callable[[str], RunResult]) -> dict[str, Any]:
    folder = SAMPLES / request.param
    result = sample_run(request.param)
    # the summary as the command prints it: the actions' knobs carry whatif's predicted gains
    summary = completed_summary(result)
    return {"folder": folder, "result": result, "summary": summary, "data": prepare_report(result)}


def _facts(section: Any) -> dict[str, Any]:
    return {f.label: f for f in section.facts}


def _terminal(sample: dict[str, Any], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> str:
    """What ``fsdpviz summary FOLDER`` prints at 250 columns: run once per sample, read by each test of it."""
    if "terminal" not in sample:
        monkeypatch.setenv("COLUMNS", "250")
        sample["terminal"] = stdout_here(capsys, "summary", str(sample["folder"]), "--no-cache")
    return str(sample["terminal"])


def _row(text: str, first: str) -> list[str]:
    """The cells of the terminal table row whose first cell is ``first``."""
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip("│┃ ").split("│")]
        if cells and cells[0] == first:
            return cells
    raise AssertionError(f"no row {first!r} in:\n{text}")


def _two(value: float | None) -> str:
    return "-" if value is None else f"{value:,.2f}"


def test_json_is_the_summary(sample: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> None:
    printed = json.loads(stdout_here(capsys, "summary", str(sample["folder"]), "--json", "--no-cache"))
    assert printed == json.loads(json.dumps(sample["summary"].to_json()))


def test_headline_figures(sample: dict[str, Any], capsys: pytest.CaptureFixture[str],
                          monkeypatch: pytest.MonkeyPatch) -> None:
    s, data = sample["summary"], sample["data"]
    facts = _facts(headline_section(data))
    assert facts["step time"].value == format_ms(s.step_time_ms)
    assert facts["overlap"].value == format_pct(s.overlap.overlap_pct)
    # one exposed communication: on the headline's clock (the bound's part of an unprofiled step)
    exposed = s.bound.exposed_comm_ms if s.bound is not None and s.bound.basis == "unprofiled" else s.overlap.exposed_comm_ms
    assert facts["exposed comm / step"].value == format_ms(exposed)
    assert facts["peak allocated"].value == (format_bytes(s.memory.peak_allocated_bytes) or "n/a")
    # its share is of the step on its own clock; the trace's figure, of the traced step, only where it differs
    hint = facts["exposed comm / step"].hint
    assert hint.startswith(f"{100 * exposed / s.step_time_ms:.1f} % of the step; ")
    traced_exposed = s.overlap.as_traced.exposed_comm_ms if s.overlap.as_traced is not None else None
    if traced_exposed is not None and s.traced_step_time_ms:
        said = (f"as traced {format_ms(traced_exposed)}, {100 * traced_exposed / s.traced_step_time_ms:.1f} % of the "
                f"traced step ({format_ms(s.traced_step_time_ms)})")
        assert (said in hint) == (format_ms(traced_exposed) != format_ms(exposed)), hint
    text = _terminal(sample, capsys, monkeypatch)
    lines = {line.split("  ")[0].strip(): line for line in text.splitlines() if line.strip()}
    assert f"{s.step_time_ms:,.2f} ms" in lines["step time"]
    assert f"{exposed:,.2f} ms per step" in lines["exposed comm"]
    # the trace's own figure beside it only where the two read differently
    traced = s.overlap.as_traced.exposed_comm_ms if s.overlap.as_traced is not None else s.overlap.exposed_comm_ms
    assert ("as traced" in lines["exposed comm"]) == (f"{exposed:,.2f}" != f"{traced:,.2f}")
    assert f"{s.overlap.overlap_pct:,.2f} %" in lines["overlap"]
    # the steps section: every step time it shows is one of the summary's, labelled with which
    step_facts = {label: f for label, f in _facts(steps_section(data)).items() if label.startswith("step time")}
    assert "median step time" not in _facts(steps_section(data))
    figures = dict(step_time_figures(s))
    # one figure, one name: the traced step (which the profiled step is) is not shown again under the timers'
    assert len(set(figures.values())) == len(figures), figures
    assert not any("timers" in label for label, v in figures.items() if v == s.traced_step_time_ms), figures
    assert {label: f.value for label, f in step_facts.items()} == {k: format_ms(v) for k, v in figures.items()}
    assert [label for label, f in step_facts.items() if f.hint == "the headline's step time"] == \
        [label for label, v in figures.items() if v == s.step_time_ms]
    if s.profiler is not None and s.profiler.headline:
        assert figures["step time, unprofiled steps (timers, median)"] == s.step_time_ms


def test_highest_peak_is_the_runs_peak_everywhere(sample: dict[str, Any], capsys: pytest.CaptureFixture[str],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    s, data = sample["summary"], sample["data"]
    units = units_section(data)
    place = peak_place(s.memory)
    if units is not None and units.facts:
        peak = _facts(units)["highest peak allocated"]
        assert peak.value == format_bytes(s.memory.peak_allocated_bytes)
        assert peak.hint.startswith(place)
    text = _terminal(sample, capsys, monkeypatch)
    if s.memory.categories and s.memory.categories_at is not None:
        assert s.memory.categories_at.allocated_bytes == s.memory.peak_allocated_bytes  # the same peak
        assert f"({place})" in next(line for line in text.splitlines() if line.startswith("at the peak"))


def test_per_rank_exposed_communication(sample: dict[str, Any], capsys: pytest.CaptureFixture[str],
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    s, data = sample["summary"], sample["data"]
    exposed = rank_exposed_ms(s)
    assert exposed and set(exposed) == set(s.ranks)
    section = steps_section(data)
    charts = [v for v in section.views.get("steps", []) if steps_data.EXPOSED_PER_RANK in set(
        getattr(v, "data", {}).get("what", []) if hasattr(getattr(v, "data", None), "get") else [])]
    waits = steps_data.rank_waits(data.rank_step_times, exposed)
    drawn = waits[waits["what"] == steps_data.EXPOSED_PER_RANK]
    assert dict(zip(drawn["rank"].astype(int), drawn["ms"])) == {r: v for r, v in exposed.items() if v is not None}
    if data.rank_step_times is not None and not data.rank_step_times.empty:
        assert len(charts) == 1  # the page draws exactly these bars
        bars = charts[0].data
        shown = bars[bars["what"] == steps_data.EXPOSED_PER_RANK]
        assert dict(zip(shown["rank"].astype(int), shown["ms"])) == dict(zip(drawn["rank"].astype(int), drawn["ms"]))
        # the lateness drawn is the straggler finding's, on one clock
        late = bars[bars["what"] == steps_data.LATE_PER_RANK].set_index("rank")["ms"]
        for f in s.findings:
            if f.kind == "straggler":
                said = re.search(r"start - earliest start\): median ([\d.,]+) (µs|ms)", f.evidence)
                assert said is not None, f.evidence
                value = float(said.group(1).replace(",", "")) / (1000 if said.group(2) == "µs" else 1)
                assert late[f.rank] == pytest.approx(value, rel=0.01, abs=0.01), (f.rank, f.evidence)
    text = _terminal(sample, capsys, monkeypatch)
    for rank in s.ranks:
        row = _row(text, str(rank))
        assert row[5] == _two(s.overlap.per_rank[str(rank)].exposed_comm_ms)  # the "exposed" column
        assert row[1] == _two(s.overlap.per_rank[str(rank)].comm_ms)


def test_per_unit_figures(sample: dict[str, Any], capsys: pytest.CaptureFixture[str],
                          monkeypatch: pytest.MonkeyPatch) -> None:
    s, data = sample["summary"], sample["data"]
    if not s.units:
        assert data.unit_tables is None or data.unit_tables.table.empty
        return
    table = data.unit_tables.table.set_index("unit_name")
    from fsdpviz.report.timeline.units import unit_label

    for u in s.units:
        row = table.loc[unit_label(u.name)]
        for col, value in (("all_gather_ms", u.all_gather_ms), ("forward_ms", u.forward_ms),
                           ("backward_ms", u.backward_ms), ("reduce_scatter_ms", u.reduce_scatter_ms),
                           ("exposed_comm_ms", u.exposed_comm_ms), ("forward_timer_ms", u.forward_timer_ms),
                           ("backward_timer_ms", u.backward_timer_ms)):
            assert (value is None and math.isnan(row[col])) or row[col] == value, (u.name, col)
        if u.peak_allocated_bytes is not None:
            assert row["peak_bytes"] == u.peak_allocated_bytes
    # the per-unit boxes: each unit's own work per unprofiled step, whose median of rank medians
    # is the summary's timers figure
    boxes = steps_data.unit_timer_times(data.unit_passes, list(data.unit_colors))
    for u in s.units:
        for phase, value in (("forward", u.forward_timer_ms), ("backward", u.backward_timer_ms)):
            passes = data.unit_passes[(data.unit_passes["unit"] == u.name) & (data.unit_passes["phase"] == phase)]
            if value is None:
                assert passes.empty, (u.name, phase)
                continue
            medians = passes.groupby("rank")["ms"].median()
            assert round(statistics.median(medians), 3) == value, (u.name, phase)
            drawn = boxes[(boxes["unit"] == u.name) & (boxes["phase"] == phase)]
            assert sorted(drawn["ms"]) == sorted(passes["ms"])
    text = _terminal(sample, capsys, monkeypatch)
    for u in s.units:  # the units' figures on the run's clock, as units[] has them (not the timers')
        row = _row(text, u.name)
        assert row[2:7] == [_two(u.all_gather_ms), _two(u.forward_ms), _two(u.backward_ms), _two(u.reduce_scatter_ms),
                            _two(u.exposed_comm_ms)], u.name


def test_notebook_api_shows_the_summary(sample: dict[str, Any]) -> None:
    s = sample["summary"]
    run = api.open(sample["folder"])
    assert run.summary.to_json() == s.to_json()
    if s.units:
        bars = run.unit_times().data
        got = {(r.unit, r.what): r.ms for r in bars.itertuples()}
        for u in s.units:
            assert got.get((u.name, "forward")) == u.forward_ms
            assert got.get((u.name, "all-gather")) == u.all_gather_ms


def test_the_page_lists_the_summarys_actions(sample: dict[str, Any]) -> None:
    """The page's "what to try" lines are the summary's actions, in its order and with the same
    predicted gains (every sample has units: its summary lists the findings the page words)."""
    assert sample["result"].has_units and sample["summary"].actions
    assert sample["data"].findings == actions_text(sample["summary"].actions)


def test_a_fact_is_not_shown_as_zero_where_it_has_nothing_to_say(gpu_h200_dir: Path) -> None:
    """H200 B holds one rank's trace of eight (no spread over ranks) and no exposed communication (a fake
    group): the page names no slowest rank and no unit with the most exposed communication, instead of
    "0 ms, rank 0" and "0 ms, unit (root)"."""
    from fsdpviz.analysis.pipeline import analyse

    result = analyse([gpu_h200_dir / "B"], cache=False)
    assert len(result.summary.ranks) == 1 and result.summary.overlap.exposed_comm_ms == 0
    data = prepare_report(result)
    assert "largest rank spread" not in _facts(steps_section(data))
    units = units_section(data)
    assert units is not None and "most exposed comm" not in _facts(units)


def test_the_peak_names_what_the_recorder_measured_as_part_of_it(sample: dict[str, Any],
                                                                   capsys: pytest.CaptureFixture[str],
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A CPU level starts with the trace; the recorder measured what was alive then (run.json, read as
    plain JSON: sharded parameters, optimizer state, master copy, gradients kept). The peak counts it,
    and the terminal says the peak includes it, not that it is to be added."""
    path = sample["folder"] / "run.json"
    run = json.loads(path.read_text()) if path.exists() else {"ranks": []}  # plain traces: nothing measured
    alive = [sum(m["trace_start"].get(k) or 0 for k in ("sharded_param_bytes", "optimizer_state_bytes",
                                                          "master_param_bytes", "gradient_bytes_kept"))
             for r in run["ranks"] if (m := r.get("memory")) and m.get("trace_start")]
    s = sample["summary"]
    if not alive or max(alive) == 0:
        assert s.memory.baseline_bytes is None
        return
    assert s.memory.baseline_bytes == max(alive)
    assert s.memory.peak_allocated_bytes >= max(alive)
    text = " ".join(_terminal(sample, capsys, monkeypatch).split())
    assert (f"(including up to {bytes_text(max(alive))} that fsdpviz record measured alive on a rank when the trace "
            "began)") in text
    assert "plus" not in text.split("peak memory")[1].split("reserved")[0]
