"""A unit of several modules is one unit, whichever order run.json lists its modules in.

``fsdpviz record`` names such a unit (and its timers) in the order the script passed the modules to
``fully_shard``; FSDP2's labels name them in the model's order. accelerate passes a tied model's tail as
``(final norm, embedding, output)``, so the two differ (the real program: ``make test-clients``,
``hf-trainer-fsdp-tied``). Here the committed recording of ``fully_shard([blocks.0, blocks.1])``, whose
two names agree, is the truth, and the same recording with run.json and the timers naming the pair
``[blocks.1, blocks.0]`` must read as the same run.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from helpers.cli import json_here, stdout_here

from fsdpviz.analysis.pipeline import analyse
from fsdpviz.runfolder import RunInfo, UnitInfo
from fsdpviz.trace.unit_names import traced_names, traced_spellings

pytestmark = pytest.mark.recorded

RUN = Path(__file__).resolve().parents[1] / "recorded" / "fsdp2-pair-list" / "run"
PAIR, REORDERED = "[blocks.0, blocks.1]", "[blocks.1, blocks.0]"


def _copies(tmp_path: Path) -> tuple[Path, Path]:
    as_recorded, reordered = tmp_path / "as-recorded", tmp_path / "reordered"
    for out in (as_recorded, reordered):
        shutil.copytree(RUN, out, ignore=shutil.ignore_patterns(".fsdpviz-cache"))
    files = [reordered / "run.json", *sorted((reordered / "timers").glob("*.jsonl"))]
    assert all(PAIR in f.read_text() for f in files)  # the unit's sizes and its timers name it
    for f in files:
        f.write_text(f.read_text().replace(PAIR, REORDERED))
    return as_recorded, reordered


@pytest.mark.parametrize("keep_events", ["1", "0"], ids=["loaded whole", "rank by rank"])
def test_a_pair_listed_in_another_order_is_the_recorded_pair(keep_events: str, tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str],
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    # rank by rank: a large run's ranks are analysed where they are parsed, and only their digests come back
    monkeypatch.setenv("FSDPVIZ_KEEP_EVENTS", keep_events)
    as_recorded, reordered = _copies(tmp_path)
    truth, read = (json_here(capsys, "summary", str(p), "--json", "--no-cache") for p in (as_recorded, reordered))
    assert [u["name"] for u in truth["units"]] == ["(root)", PAIR, "blocks.2"]
    pair = next(u for u in truth["units"] if u["name"] == PAIR)
    assert pair["size_source"] == "run.json" and pair["forward_timer_ms"] is not None  # run.json's sizes, its timers
    # every figure of every unit (its sizes from run.json, its timers), the notes (no unit "without work")
    # and the bound, as the recording whose two names agree
    assert read["units"] == truth["units"]
    assert read["notes"] == truth["notes"] and read["bound"] == truth["bound"]
    # and the code whatif writes for it
    code = [stdout_here(capsys, "whatif", str(p), "--wrap", "merge:2", "--code", "-q", "--no-cache")
            for p in (as_recorded, reordered)]
    assert code[0] == code[1] and 'fully_shard([m("blocks.0"), m("blocks.1"), m("blocks.2")]' in code[0]


def test_only_units_of_several_modules_named_in_another_order_are_renamed() -> None:
    labels = ["FSDP::pre_forward (blocks.1, blocks.0)", "FSDP::all_gather (norm, output) [pg=2]",
              "FSDP::backward_prefetch for emb, norm, out", "FSDP::pre_forward (blocks.2)", "FSDP::pre_forward"]
    assert traced_spellings(labels) == {frozenset({"blocks.0", "blocks.1"}): "[blocks.1, blocks.0]",
                                        frozenset({"norm", "output"}): "[norm, output]",
                                        frozenset({"emb", "norm", "out"}): "[emb, norm, out]"}


def test_every_field_that_names_the_unit_takes_the_traced_name() -> None:
    run = RunInfo(framework="fsdp2", units=[
        UnitInfo(unit="(root)", forward_prefetch=["[b, a]"], backward_prefetch="default"),
        UnitInfo(unit="[b, a]", forward_prefetch=["c"], backward_prefetch=["c"]),
        UnitInfo(unit="c", parent="[b, a]", backward_prefetch=["[b, a]"])])
    renamed, names = traced_names(run, ["FSDP::pre_forward (a, b)", "FSDP::pre_forward (c)"])
    assert names == {"[b, a]": "[a, b]"}
    assert renamed is not None and [u.unit for u in renamed.units] == ["(root)", "[a, b]", "c"]
    assert renamed.units[0].forward_prefetch == ["[a, b]"] and renamed.units[0].backward_prefetch == "default"
    assert renamed.units[1].forward_prefetch == ["c"]
    assert renamed.units[2].parent == "[a, b]" and renamed.units[2].backward_prefetch == ["[a, b]"]
    assert [u.unit for u in run.units] == ["(root)", "[b, a]", "c"]  # the recording's own run.json as read
    # names that agree, or no unit of several modules: the run as it is
    assert traced_names(run, ["FSDP::pre_forward (b, a)"]) == (run, {})


def test_a_unit_of_several_modules_computes_once_per_pass(session_memo: Callable[..., Any]) -> None:
    """``fully_shard([blocks.0, blocks.1])`` runs FSDP2's pre-forward hook on each of its two modules: the
    second runs inside the pass the first opened and ends at the same post-forward. One forward window a
    pass; the step's parts (units' compute, FSDP's ranges, the optimizer) within the step, and the pair's
    compute read off the trace within the recorder's timer of the same pass (its own clock; the timer
    also counts the hooks' work). Read as two windows, the second module's forward counted twice in the
    step's units' compute (1.5-5.9 ms above the units' own figures, against 0.8-5.1 ms now, the rest being
    compute no unit holds), and rank 0's last step's parts came to 2.86 ms more than the step."""
    result = session_memo(("recorded", RUN), lambda: analyse([RUN], cache=False))
    windows = result.analysis.windows
    forward = windows[(windows["unit"] == PAIR) & (windows["phase"] == "forward")]
    assert not forward.duplicated(["rank", "step", "micro"]).any(), forward.to_string()
    us = result.analysis.unit_steps
    key = ["rank", "step", "unit", "phase"]
    trace_ms = us[us["unit"] == PAIR].groupby(key)["compute_ns"].sum() / 1e6
    timers = result.traces.timers
    timer_ms = timers[(timers["unit"] == PAIR) & (timers["kind"] == "compute")].groupby(key)["ms"].sum()
    both = pd.concat([trace_ms.rename("trace"), timer_ms.rename("timer")], axis=1, join="inner")
    assert len(both) == len(trace_ms) > 0
    assert (both["trace"] <= both["timer"] + 0.05).all(), both.to_string()
    times = result.analysis.step_times
    parts = times["unit_compute_ns"] + times["framework_ns"] + times["optimizer_ns"]
    assert (parts <= times["step_ns"]).all(), (parts - times["step_ns"]).to_list()
