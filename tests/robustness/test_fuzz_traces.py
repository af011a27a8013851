"""Property-based tests: random traces through the loader and the analysis.

Whatever a trace holds, loading it either works or raises a :class:`FsdpvizError` (a clear
message for the user), never anything else; and whatever the analysis returns obeys what its
numbers mean: exposed communication is part of communication, percentages are percentages, a
unit's spans lie in their step, and the units of one lane cannot be busy longer than the step.

Every run draws a fixed set of examples (``derandomize``), so a failure here is reproducible and never
a newly drawn surprise in someone else's change. ``make test`` draws a small fixed budget per property
(the first argument of ``_fuzz``); ``make test-fuzz``, which CI runs, draws the full one
(``FSDPVIZ_FUZZ_BUDGET=full``, the tests of the ``fuzz`` marker). To search wider, without shrinking::

    FSDPVIZ_FUZZ_EXPLORE=2000 pytest tests/robustness/test_fuzz_traces.py

and turn what it finds into a regression test below.
"""

from __future__ import annotations

import gzip
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from tracefuzz import fsdp_timelines, fsdp_traces, hostile_events, odd_headers

from fsdpviz import vocabulary
from fsdpviz.analysis.overlap import compute_overlap
from fsdpviz.analysis.pipeline import RunResult, analyse_traces
from fsdpviz.analysis.run import RunAnalysis, analyse_run
from fsdpviz.errors import FsdpvizError
from fsdpviz.trace import TraceSet, load_traces, schema

EXPLORE = int(os.environ.get("FSDPVIZ_FUZZ_EXPLORE", "0") or 0)
FULL_BUDGET = os.environ.get("FSDPVIZ_FUZZ_BUDGET", "") == "full"

pytestmark = pytest.mark.fuzz


def _fuzz(quick: int, full: int) -> settings:
    """Hypothesis' settings: ``quick`` examples in ``make test``, ``full`` under ``make test-fuzz``."""
    examples = full if FULL_BUDGET else quick
    if EXPLORE:
        return settings(max_examples=EXPLORE, deadline=None, phases=[Phase.generate], report_multiple_bugs=True,
                        suppress_health_check=list(HealthCheck))
    return settings(max_examples=examples, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
MS_ROUNDING = 1.5e-3  # summary values are rounded to the µs independently of each other


def _write(docs: list[Any], folder: Path, compress: list[bool] | None = None) -> list[Path]:
    paths = []
    for i, doc in enumerate(docs):
        data = json.dumps(doc).encode()  # NaN / Infinity become the non-standard literals, as some writers do
        gz = compress[i] if compress else False
        path = folder / f"rank{i}.trace.json{'.gz' if gz else ''}"
        path.write_bytes(gzip.compress(data) if gz else data)
        paths.append(path)
    return paths


def _load(paths: list[Path], jobs: int = 1) -> TraceSet | None:
    try:
        return load_traces(paths, cache=False, progress=False, jobs=jobs)
    except FsdpvizError:
        return None


def _check_tables(traces: TraceSet) -> None:
    for name, table_schema in (("events", schema.EVENTS), ("lanes", schema.LANES), ("steps", schema.STEPS),
                               ("memory", schema.MEMORY), ("ranks", schema.RANKS)):
        frame = getattr(traces, name)
        assert list(frame.columns) == list(table_schema), name
        assert {c: str(frame[c].dtype) for c in frame} == table_schema, name
    ev = traces.events
    assert (ev["dur_ns"] >= 0).all()
    assert (traces.ranks["n_skipped"] >= 0).all()
    assert (traces.steps["end_ns"] >= traces.steps["start_ns"]).all()


def _check_summary(result: dict[str, Any]) -> None:
    json.dumps(result, allow_nan=False)  # the --json contract: plain JSON, null where no number exists
    ov = result["overlap"]
    for part in [ov, *ov["per_rank"].values()]:
        pct = part["overlap_pct"]
        assert pct is None or 0.0 <= pct <= 100.0
        if part["comm_ms"] is not None and part["exposed_comm_ms"] is not None:
            assert 0.0 <= part["exposed_comm_ms"] <= part["comm_ms"] + MS_ROUNDING
    for unit in result["units"]:
        for key, value in unit.items():
            if key.endswith("_ms") and value is not None:
                assert value >= 0.0 or "prefetch_lead" in key, (key, value)  # lead < 0: gathered late


def _check_overlap(traces: TraceSet) -> None:
    ov = compute_overlap(traces)
    assert (ov["exposed_comm_ns"] >= 0).all() and (ov["exposed_comm_ns"] <= ov["comm_ns"]).all()
    assert (ov["overlap_ns"] <= ov["compute_ns"]).all() and (ov["busy_ns"] <= ov["window_ns"].clip(lower=0)
                                                              + ov["busy_ns"] * (ov["n_steps"] == 0)).all()
    pct = ov["overlap_pct"].dropna()
    assert ((pct >= 0) & (pct <= 100)).all()


COLLECTIVE_SPANS = (vocabulary.ALL_GATHER, vocabulary.REDUCE_SCATTER, vocabulary.ALL_REDUCE)


def _lane_busy(spans: pd.DataFrame) -> pd.DataFrame:
    """Per (rank, step, lane): summed span time (a collective shared by n units counted once) and extent."""
    d = (spans["end_ns"] - spans["start_ns"]) / spans["n_units"]
    keys = [spans["rank"], spans["step"], spans["lane"]]
    # n: spans summed, the ns a split collective may round up by
    return pd.DataFrame({"busy": d.groupby(keys).sum(), "lo": spans["start_ns"].groupby(keys).min(),
                         "hi": spans["end_ns"].groupby(keys).max(), "n": d.groupby(keys).size()})


def _check_analysis(a: RunAnalysis, *, level: str, gpu: bool) -> None:
    """Invariants by how well-formed the trace is: "timeline" (as FSDP writes it), "stack" (nested
    ranges, random names) or "tangled" (anything)."""
    us, sp = a.unit_steps, a.spans
    key = ["rank", "step", "unit", "phase"]
    for kind, part, total in ((vocabulary.ALL_GATHER, "ag_exposed_ns", "ag_ns"),
                              (vocabulary.REDUCE_SCATTER, "rs_exposed_ns", "rs_ns"),
                              (vocabulary.ALL_REDUCE, "ar_exposed_ns", "ar_ns")):
        assert (us[part] >= 0).all(), part
        # A collective that carried several units (a ZeRO-3 bucket) gives each unit a share of its
        # time but all of its exposed time to the unit that waited for it (docs/concepts.md): only
        # per pass, summed over units, is exposure bounded by communication there.
        shared = sp[(sp["kind"] == kind) & (sp["n_units"] > 1)][key].drop_duplicates()
        alone = us.merge(shared.assign(shared=True), on=key, how="left")["shared"].isna().to_numpy()
        assert (us[part][alone] <= us[total][alone]).all(), part
        sums = us.groupby(["rank", "step", "phase"])[[part, total]].sum()
        count = us.groupby(["rank", "step", "phase"]).size()
        assert (sums[part] <= sums[total] + count).all(), part  # + ns rounding of the shares
    st_ = a.step_times
    assert (st_["exposed_comm_ns"] >= 0).all() and (st_["exposed_comm_ns"] <= st_["comm_ns"]).all()
    assert (st_["step_ns"] >= 0).all()
    assert (sp["end_ns"] >= sp["start_ns"]).all()
    assert set(sp["kind"]) <= set(vocabulary.SPAN_KINDS) and set(sp["phase"]) <= set(vocabulary.PHASES)
    for col in ("all_gather_ns", "forward_ns", "backward_ns", "reduce_scatter_ns", "exposed_comm_ns"):
        assert (a.unit_stats[col].dropna() >= 0).all(), col
    if level == "tangled" or sp.empty:
        return
    units = sp[sp["unit"] != ""]
    # A lane runs one thing at a time: a unit's compute pieces never overlap another's, and each
    # collective is counted once however many units it carried.
    for kinds in ((vocabulary.COMPUTE,), COLLECTIVE_SPANS):
        lanes = _lane_busy(units[units["kind"].isin(kinds)])
        over = lanes["busy"] > lanes["hi"] - lanes["lo"] + lanes["n"]
        assert not over.any(), (kinds, lanes[over])
    if level != "timeline":
        return
    # Spans inside their step: CPU work between the step's start and end; GPU work launched in the
    # step starts after the step did (it may end after the CPU side of the step).
    steps = st_[["rank", "step", "start_ns", "end_ns", "step_ns"]]
    joined = sp.merge(steps, on=["rank", "step"], suffixes=("", "_step"), how="left")
    assert joined["start_ns_step"].notna().all(), "a span in a step that has no step time"
    assert (joined["start_ns"] >= joined["start_ns_step"]).all()
    on_cpu = ~joined["lane"].str.startswith("stream") if gpu else pd.Series(True, index=joined.index)
    assert (joined.loc[on_cpu, "end_ns"] <= joined.loc[on_cpu, "end_ns_step"]).all()
    # The units of one lane are busy for at most the step (CPU) or the lane's span of the step (GPU).
    lanes = _lane_busy(units).join(steps.set_index(["rank", "step"])["step_ns"], on=["rank", "step"])
    is_stream = lanes.index.get_level_values("lane").str.startswith("stream")
    limit = np.where(is_stream, lanes["hi"] - lanes["lo"], lanes["step_ns"]) + lanes["n"]
    assert not (lanes["busy"] > limit).any(), lanes[lanes["busy"] > limit]


def _analyse(traces: TraceSet, *, level: str, gpu: bool) -> RunAnalysis:
    analysis = analyse_run(traces)  # per-unit analysis raises nothing: it reports what it found
    _check_analysis(analysis, level=level, gpu=gpu)
    try:
        run = analyse_traces(traces)
        result = RunResult(run.traces, run.selection, run.overlap, run.framework, analysis).summary.to_json()
    except FsdpvizError:  # e.g. no events in the analysis window: a clear message is the right answer
        return analysis
    _check_summary(result)
    _check_overlap(traces)
    return analysis


@_fuzz(10, 50)
@given(data=st.data(), gpu=st.booleans(), two_ranks=st.booleans())
def test_fsdp_timelines_give_consistent_numbers(data: st.DataObject, gpu: bool, two_ranks: bool) -> None:
    docs = [data.draw(fsdp_timelines(rank=r, world_size=2, gpu=gpu), label=f"rank{r}")
            for r in range(2 if two_ranks else 1)]
    with tempfile.TemporaryDirectory() as tmp:
        traces = load_traces(_write(docs, Path(tmp)), cache=False, progress=False, jobs=1)
        _check_tables(traces)
        assert len(traces.steps) == sum(len([e for e in d["traceEvents"] if e["name"].startswith("ProfilerStep#")])
                                        for d in docs)
        _analyse(traces, level="timeline", gpu=gpu)


@_fuzz(8, 40)
@given(data=st.data(), gpu=st.booleans(), two_ranks=st.booleans())
def test_random_call_stacks_give_consistent_numbers(data: st.DataObject, gpu: bool, two_ranks: bool) -> None:
    docs = [data.draw(fsdp_traces(rank=r, world_size=2, gpu=gpu), label=f"rank{r}")
            for r in range(2 if two_ranks else 1)]
    with tempfile.TemporaryDirectory() as tmp:
        traces = _load(_write(docs, Path(tmp)))
        if traces is None:
            return
        _check_tables(traces)
        _analyse(traces, level="stack", gpu=gpu)


@_fuzz(8, 40)
@given(data=st.data(), gpu=st.booleans())
def test_tangled_and_hostile_traces_never_crash(data: st.DataObject, gpu: bool) -> None:
    doc = data.draw(fsdp_traces(gpu=gpu, tangled=True, hostile=True))
    with tempfile.TemporaryDirectory() as tmp:
        traces = _load(_write([doc], Path(tmp), [data.draw(st.booleans())]))
        if traces is None:
            return
        _check_tables(traces)
        _analyse(traces, level="tangled", gpu=gpu)


@_fuzz(40, 200)
@given(events=st.lists(hostile_events(), max_size=12), header=odd_headers(),
       events_key=st.sampled_from(["traceEvents", "traceEvents", "traceevents"]))
def test_any_json_loads_or_fails_with_a_clear_error(events: list[Any], header: dict[str, Any], events_key: str) -> None:
    doc = {**header, events_key: events}
    with tempfile.TemporaryDirectory() as tmp:
        traces = _load(_write([doc], Path(tmp)))
        if traces is None:
            return
        _check_tables(traces)
        assert int(traces.ranks["n_skipped"].sum()) + len(traces.events) <= len(events)
        _analyse(traces, level="tangled", gpu=False)


@_fuzz(6, 30)
@given(data=st.data())
def test_parallel_loading_reports_the_same_errors(data: st.DataObject) -> None:
    """Workers carry a bad file's error back as the same one line as the serial path."""
    good = data.draw(fsdp_traces(rank=0))
    bad = data.draw(st.one_of(st.lists(hostile_events(), max_size=3), st.binary(max_size=64).map(
        lambda b: b.decode("latin-1"))))
    with tempfile.TemporaryDirectory() as tmp:
        paths = _write([good, {"traceEvents": bad} if isinstance(bad, list) else bad], Path(tmp))
        outcomes = []
        for jobs in (1, 2):
            try:
                traces = load_traces(paths, cache=False, progress=False, jobs=jobs)
                outcomes.append(("ok", len(traces.events), int(traces.ranks["n_skipped"].sum())))
            except FsdpvizError as exc:
                outcomes.append(("error", type(exc).__name__, str(exc)))
        assert outcomes[0] == outcomes[1]


@pytest.mark.parametrize("sample", ["fsdp2-cpu-2rank", "fsdp1-cpu-2rank", "zero3-cpu-2rank", "fsdp2-cpu-2rank-plain"])
def test_real_recordings_obey_the_same_invariants(sample: str, repo_root: Path) -> None:
    """The invariants above, on the bundled real recordings. There a span starts inside its step but
    the optimizer's may end a little after it: fsdpviz record ends a ProfilerStep from the optimizer's
    step hook, inside the ``Optimizer.step#`` range."""
    traces = load_traces([repo_root / "sample_traces" / sample], cache=False)
    _check_tables(traces)
    a = _analyse(traces, level="stack", gpu=False)
    joined = a.spans.merge(a.step_times[["rank", "step", "start_ns", "end_ns"]], on=["rank", "step"],
                           suffixes=("", "_step"))
    assert len(joined) == len(a.spans) > 0
    assert ((joined["start_ns"] >= joined["start_ns_step"]) & (joined["start_ns"] <= joined["end_ns_step"])).all()
    late = joined[joined["end_ns"] > joined["end_ns_step"]]
    assert set(late["phase"]) <= {vocabulary.OPTIMIZER}
