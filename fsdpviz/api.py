"""The Python API for notebooks and scripts: ``fsdpviz.open`` and ``fsdpviz.compare``.

Everything goes through the one pipeline (:func:`fsdpviz.analysis.pipeline.analyse`), so a
:class:`Run` shows exactly the numbers ``fsdpviz summary`` / ``report`` / ``export`` give for the same
input. Tables are pandas DataFrames with the columns of :mod:`fsdpviz.trace.schema`; plots are
holoviews objects that display inline in Jupyter (bokeh backend). Heavy packages (pandas,
holoviews) are imported when first used.

Example::

    import fsdpviz
    run = fsdpviz.open("runs/block")          # a run folder, a folder of traces, or trace files
    run.summary.step_time_ms                   # as `fsdpviz summary --json` says it
    run.units                                  # per-unit medians, one row per unit
    run.gantt(ranks=[0])                       # the median step, unit by unit
    run.whatif(prefetch=1).predicted           # what explicit prefetch would do

Errors are the command line's: :class:`fsdpviz.errors.FsdpvizError` subclasses with the same
one-line messages (``UsageError`` for bad arguments, ``RunFolderError`` / ``TraceFormatError`` for
bad input).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fsdpviz import vocabulary
from fsdpviz.analysis.pipeline import LabelledRun
from fsdpviz.errors import UsageError
from fsdpviz.formatting import MIB, NS_PER_MS

if TYPE_CHECKING:
    import holoviews as hv
    import pandas as pd

    from fsdpviz.analysis.actions import Action
    from fsdpviz.analysis.compare.model import Comparison
    from fsdpviz.analysis.pipeline import RunResult
    from fsdpviz.analysis.summary import Summary
    from fsdpviz.cache import SummaryStore
    from fsdpviz.replay.model import Model
    from fsdpviz.whatif.predict import Prediction

PathLike = str | Path

PHASE_KINDS = (vocabulary.ALL_GATHER, vocabulary.COMPUTE, vocabulary.REDUCE_SCATTER, vocabulary.ALL_REDUCE,
               vocabulary.COPY_IN, vocabulary.COPY_OUT)
_extension_loaded = False


def _holoviews() -> Any:
    """holoviews with its bokeh backend loaded once (a notebook gets bokeh's JS once, not per plot)."""
    global _extension_loaded
    import holoviews as hv

    if not _extension_loaded:
        hv.extension("bokeh", logo=False)
        _extension_loaded = True
    return hv


def _paths(source: PathLike | Sequence[PathLike]) -> list[Path]:
    if isinstance(source, str | Path):
        return [Path(source)]
    paths = [Path(p) for p in source]
    if not paths:
        raise UsageError("fsdpviz.open needs a run folder, a folder of traces or trace files")
    return paths


def open(source: PathLike | Sequence[PathLike], *, steps: Sequence[int] | None = None,
         include_last_step: bool = False, cache: bool = True, label: str | None = None) -> Run:
    """Load and analyse a run: a run folder from ``fsdpviz record``, a folder of traces, or trace files.

    Args:
        source: one path, or several trace files of one run.
        steps: ProfilerSteps to analyse (default: every step the traces hold complete).
        include_last_step: also analyse the last captured step when completeness cannot be shown.
        cache: reuse (and write) the parsed-trace cache beside the traces, and the run's summary
            (``Run.summary``) in the run folder's cache, as ``fsdpviz summary`` does.
        label: the run's name in comparisons (default: run.json's label, else the folder's name).

    Example::

        run = fsdpviz.open("sample_traces/fsdp2_cpu")
        run.summary.to_json()["step_time_ms"]
    """
    from fsdpviz.analysis.pipeline import analyse
    from fsdpviz.cache import store_for
    from fsdpviz.report.compare.build import default_label

    paths = _paths(source)
    result = analyse(paths, steps=steps, include_last_step=include_last_step, cache=cache, progress=False)
    store = store_for(paths, steps=steps, include_last_step=include_last_step, cache=cache)
    return Run(result, label or default_label(paths[0], result.traces), str(paths[0]), summary_store=store)


def compare(runs: Sequence[Run | PathLike], *, labels: Sequence[str] | None = None) -> Compared:
    """Compare two or more runs (``Run`` objects or paths) as ``fsdpviz compare`` does.

    Example::

        c = fsdpviz.compare(["runs/block", "runs/pair"])
        c.headline            # one row per headline number, one column per run
        c.page("compare.html")
    """
    from fsdpviz.analysis.compare.runs import compare_runs
    from fsdpviz.report.compare.build import default_label, default_labels

    opened = [r if isinstance(r, Run) else open(r) for r in runs]
    if len(opened) < 2:
        raise UsageError(f"compare needs at least two runs, got {len(opened)}")
    for r in opened:
        r.on_clock()  # each run's figures as its summary gives them (the bound's split)
    names = list(labels) if labels else [r.label for r in opened]
    if not labels and len(set(names)) != len(names):
        # runs of one name, as the command tells them apart: by their folders (a label given to open() stays)
        loaded = [(Path(r.source), r.result.traces) for r in opened]
        names = [told if name == default_label(*where) else name
                 for name, told, where in zip(names, default_labels(loaded), loaded)]
    if len(names) != len(opened) or len(set(names)) != len(names):
        raise UsageError("labels must be distinct, one per run")
    inputs = [LabelledRun(label=n, source=r.source, result=r.result) for n, r in zip(names, opened)]
    return Compared(inputs=inputs, comparison=compare_runs(inputs))


class Run(LabelledRun):
    """One analysed run (see the module docstring): the run ``fsdpviz compare`` compares
    (:class:`fsdpviz.analysis.pipeline.LabelledRun`: ``label``, ``source``, ``result``, ``summary``),
    with its tables and plots. Attributes are computed on first use."""

    def __init__(self, result: RunResult, label: str, source: str, *,
                 summary_store: SummaryStore | None = None) -> None:
        super().__init__(label=label, source=source, result=result)
        self._model: Model | None = None
        self._summary: Summary | None = None
        self._store = summary_store  # where `fsdpviz summary` keeps this run's summary (fsdpviz/cache.py)
        self._seeded: bool | None = None  # whether a cached summary was put into the result (None: not looked)

    def __repr__(self) -> str:
        s = self.summary
        return (f"<fsdpviz.Run {self.label!r}: {s.framework}, world size {s.world_size}, steps {s.steps}, "
                f"step {s.step_time_ms} ms>")

    # --- numbers (``summary``: the typed summary, ``.to_json()`` is ``fsdpviz summary --json``) ----
    @property
    def summary(self) -> Summary:
        """The run's summary as ``fsdpviz summary --json`` gives it: its actions' knobs predicted
        with fsdpviz whatif (computed once)."""
        if self._summary is None:
            from fsdpviz.cache import keep
            from fsdpviz.whatif.gains import completed_summary

            seeded = self._seed()  # the summary `fsdpviz summary` kept, when it did
            self._summary = completed_summary(self.result)
            if not seeded:
                keep(self.result, self._store)
        return self._summary

    def on_clock(self) -> RunResult:
        """The run's result with its bound's split the one its summary gives (the cached summary's where
        ``fsdpviz summary`` kept one, else read off the run's model: ``whatif.gains.on_replay_split``)."""
        from fsdpviz.whatif.gains import on_replay_split

        self._seed()
        return on_replay_split(self.result)

    def _seed(self) -> bool:
        """Put the summary `fsdpviz summary` kept into the result, once; whether there was one."""
        if self._seeded is None:
            from fsdpviz.cache import seed

            self._seeded = seed(self.result, self._store)
        return self._seeded

    @property
    def units(self) -> pd.DataFrame:
        """Per-unit medians over ranks and analysed steps (schema.UNIT_STATS), in forward order, as
        traced: the trace's own durations (``summary.units`` holds them on the run's clock), but for
        ``forward_clock_ns`` / ``backward_clock_ns``, the passes on the run's clock."""
        return self.on_clock().analysis.unit_stats.reset_index(drop=True)

    @property
    def spans(self) -> pd.DataFrame:
        """Every unit's all-gathers, compute and reductions per rank and step (schema.SPANS)."""
        return self.result.analysis.spans

    @property
    def steps(self) -> pd.DataFrame:
        """Per rank and analysed step: where the step's time went (schema.STEP_TIMES)."""
        return self.result.analysis.step_times

    @property
    def memory(self) -> pd.DataFrame:
        """Allocator samples of each rank's main device, thinned with the peaks kept (schema.MEMORY)."""
        return self.result.analysis.memory

    @property
    def memory_categories(self) -> pd.DataFrame:
        """What the allocated level is made of, over the analysed steps: per rank and kept sample
        (the samples of ``memory``) one column per category -- sharded parameters, optimizer state,
        gradients, unsharded parameters and gradients, communication buffers, activations, other
        (memory_categories.CATEGORY_LEVELS; they add up to ``allocated_bytes`` when all are known). A
        category that cannot be known on a rank is missing (``pd.NA``), never 0: ``memory_unknown``
        says why."""
        from fsdpviz.analysis.memory_split import with_unknown

        return with_unknown(self.result.analysis.memory_categories, self.result.analysis.memory_unknown)

    @property
    def memory_peaks(self) -> pd.DataFrame:
        """The categories at each rank's step peaks (``unit`` "") and at each unit pass's peak
        (memory_categories.CATEGORY_PEAKS; unknown ones missing, as in ``memory_categories``)."""
        from fsdpviz.analysis.memory_split import with_unknown

        return with_unknown(self.result.analysis.category_peaks, self.result.analysis.memory_unknown)

    @property
    def memory_unknown(self) -> dict[int, dict[str, str]]:
        """Per rank, the memory categories that cannot be known and why (e.g. on CPU, what the
        profiler did not see because it was allocated before the trace)."""
        return {r: dict(u) for r, u in self.result.analysis.memory_unknown.items()}

    @property
    def collectives(self) -> pd.DataFrame:
        """Every collective each rank ran: where, when it was issued, its bytes."""
        from fsdpviz.structure.collectives import find_collectives

        traces = self.result.detail()
        return find_collectives(traces.events, traces.lanes)

    @property
    def findings(self) -> pd.DataFrame:
        """Where steps lose time to communication, why, and what to try (schema.FINDINGS), on the run's
        clock as the summary's findings are (the other tables are as traced); as the summary lists them,
        a knob that cannot help on the run taken out and ``why_not`` saying why."""
        from fsdpviz.analysis.summary import run_findings

        r = self.on_clock()
        return run_findings(r.analysis.findings, r.traces, r.overlap, r.framework)

    @property
    def bound(self) -> pd.DataFrame:
        """What bounds the step, per rank (``rank`` "all": the run's, as ``summary.bound``): the model's
        compute, FSDP's per-unit work, exposed communication, host wait (None on CPU or without launches) and other idle, ms per
        step; ``basis`` says whether the profiler's share was taken out (analysis/bound.py): each rank's
        row its own (its clean step where it timed one and the run leads with the timers, else traced)."""
        import pandas as pd

        b = self.summary.bound
        if b is None:
            return pd.DataFrame(columns=["rank", "kind", "step_ms", "compute_ms", "fsdp_overhead_ms", "exposed_comm_ms",
                                         "host_wait_ms", "other_idle_ms", "basis"])
        rows = [{"rank": rank, "kind": r.kind, "step_ms": r.step_ms, "compute_ms": r.compute_ms,
                 "fsdp_overhead_ms": r.fsdp_overhead_ms, "exposed_comm_ms": r.exposed_comm_ms, "host_wait_ms": r.host_wait_ms,
                 "other_idle_ms": r.other_idle_ms, "basis": r.basis} for rank, r in b.per_rank.items()]
        rows.append({"rank": "all", "kind": b.kind, "step_ms": b.step_ms, "compute_ms": b.compute_ms,
                     "fsdp_overhead_ms": b.fsdp_overhead_ms, "exposed_comm_ms": b.exposed_comm_ms, "host_wait_ms": b.host_wait_ms,
                     "other_idle_ms": b.other_idle_ms, "basis": b.basis})
        return pd.DataFrame(rows)

    @property
    def actions(self) -> list[Action]:
        """What to do, in the order to read it: the bound's action, then alike findings as one line
        each with their predicted gains (fsdpviz whatif), ``folded`` past the first five (never the profiler's past 1.5x); the sentence
        of one is :func:`fsdpviz.analysis.actions.action_text`, the list's as the summary prints them
        :func:`fsdpviz.analysis.actions.action_texts`."""
        return self.summary.actions

    # --- plots ----------------------------------------------------------------------------------
    def _step(self, step: int | str) -> int:
        steps = self.result.analysis.steps
        if step == "median":
            times = self.steps.groupby("step")["step_ns"].median()
            if times.empty:
                raise UsageError("no analysed step to draw")
            gaps = (times - times.median()).abs()
            return int(gaps.index[int(gaps.to_numpy().argmin())])
        if not isinstance(step, int) or step not in steps:
            raise UsageError(f"step {step!r}: analysed steps are {steps}, or \"median\"")
        return step

    def gantt(self, step: int | str = "median", ranks: Sequence[int] | None = None) -> hv.Rectangles:
        """One step, unit by unit: a row per rank and kind of work, bars coloured by unit (holoviews).

        Args:
            step: an analysed step, or ``"median"`` (the step with the median step time).
            ranks: ranks to draw (default: all).
        """
        import pandas as pd

        from fsdpviz.report.style import unit_colors

        hv = _holoviews()
        number = self._step(step)
        sp = self.spans[self.spans["step"] == number]
        wanted = sorted(set(ranks) if ranks is not None else set(sp["rank"].tolist()))
        unknown = sorted(set(wanted) - set(self.result.analysis.ranks))
        if unknown:
            raise UsageError(f"ranks {unknown}: not in the run (ranks: {self.result.analysis.ranks})")
        sp = sp[sp["rank"].isin(wanted) & sp["kind"].isin(PHASE_KINDS)]
        starts = self.steps[(self.steps["step"] == number)].set_index("rank")["start_ns"]
        kinds = [k for k in PHASE_KINDS if k in set(sp["kind"].astype(str))]
        row_of = {(r, k): i for i, (r, k) in enumerate((r, k) for r in wanted for k in kinds)}
        frame = pd.DataFrame({
            "start_ms": (sp["start_ns"] - sp["rank"].map(starts)) / NS_PER_MS,
            "row": [row_of[(int(r), str(k))] for r, k in zip(sp["rank"], sp["kind"])],
            "end_ms": (sp["end_ns"] - sp["rank"].map(starts)) / NS_PER_MS,
            "unit": sp["unit"].astype(str).where(sp["unit"].astype(str) != "", "(optimizer)"),
            "phase": sp["phase"].astype(str), "kind": sp["kind"].astype(str)})
        frame["top"] = frame["row"] + 0.8
        colors = unit_colors(list(dict.fromkeys(frame["unit"])))
        ticks = [(i + 0.4, f"rank {r} · {k.replace('_', '-')}") for (r, k), i in row_of.items()]
        return hv.Rectangles(frame, kdims=["start_ms", "row", "end_ms", "top"], vdims=["unit", "phase", "kind"]).opts(
            color=hv.dim("unit").categorize(colors, default="#888888"), line_alpha=0, tools=["hover"],
            yticks=ticks, invert_yaxis=True, width=900, height=60 + 22 * max(1, len(row_of)),
            xlabel="time since step start (ms)", ylabel="", title=f"{self.label}: step {number}")

    def memory_curve(self, ranks: Sequence[int] | None = None) -> hv.Overlay:
        """Allocated memory over the analysed steps, one curve per rank (MiB, holoviews)."""
        hv = _holoviews()
        mem = self.memory
        wanted = sorted(set(ranks) if ranks is not None else set(mem["rank"].tolist()))
        t0 = int(mem["t_ns"].min()) if len(mem) else 0
        curves = [hv.Curve(((g["t_ns"] - t0) / NS_PER_MS, g["allocated_bytes"] / MIB), "time (ms)", "allocated (MiB)",
                           label=f"rank {r}").opts(interpolation="steps-post")
                  for r, g in mem[mem["rank"].isin(wanted)].groupby("rank")]
        return hv.Overlay(curves).opts(width=900, height=300, title=f"{self.label}: allocated memory",
                                       legend_position="top_right")

    def memory_by_category(self, rank: int | None = None) -> hv.Overlay:
        """One rank's allocated memory over the analysed steps, stacked by category (MiB, holoviews);
        default: the rank with the highest peak."""
        from fsdpviz.analysis.memory_categories import CATEGORIES, TITLES

        hv = _holoviews()
        levels = self.memory_categories
        if levels.empty:
            raise UsageError("no memory by category: the run has no allocator samples or no FSDP units")
        if rank is None:
            totals = levels[list(CATEGORIES)].fillna(0).sum(axis=1)
            rank = int(levels["rank"].to_numpy()[int(totals.to_numpy().argmax())])
        mine = levels[(levels["rank"] == rank).to_numpy()]
        if mine.empty:
            raise UsageError(f"rank {rank}: no memory samples (ranks: {sorted(set(levels['rank'].tolist()))})")
        t_ms = (mine["t_ns"] - int(mine["t_ns"].min())) / NS_PER_MS
        # an unknown category is drawn flat and named so in the legend
        areas = [hv.Area((t_ms, mine[c].astype("Float64").fillna(0.0).to_numpy(float) / MIB), "time (ms)",
                         "allocated (MiB)", label=TITLES[c] if mine[c].notna().all() else f"{TITLES[c]} (unknown)")
                 for c in CATEGORIES]
        return hv.Area.stack(hv.Overlay(areas)).opts(
            hv.opts.Area(width=900, height=320, tools=["hover"]),
            hv.opts.Overlay(title=f"{self.label}: memory by category, rank {rank}", legend_position="right"))

    def unit_times(self) -> hv.Bars:
        """Per unit: all-gather, forward, backward and reduce-scatter time per step (ms, holoviews)."""
        import pandas as pd

        hv = _holoviews()
        rows = [(u.name, what, value) for u in self.summary.units
                for what, value in (("all-gather", u.all_gather_ms), ("forward", u.forward_ms),
                                    ("backward", u.backward_ms), ("reduce-scatter", u.reduce_scatter_ms))
                if value is not None]
        frame = pd.DataFrame(rows, columns=["unit", "what", "ms"])
        return hv.Bars(frame, kdims=["unit", "what"], vdims=["ms"]).opts(
            width=900, height=320, tools=["hover"], xrotation=30, title=f"{self.label}: per-unit times (ms/step)")

    # --- pages and predictions -------------------------------------------------------------------
    def report(self, path: PathLike) -> Path:
        """Write the report page (as ``fsdpviz report``) to ``path``; returns the path."""
        from fsdpviz.report.build import build_report

        return build_report(self.result, path).path

    def whatif(self, *, wrap: str | None = None, prefetch: int | str | None = None,
               reshard_after_forward: bool | str | None = None, keep_last_units: int | None = None,
               world_size: int | None = None, gpus_per_node: int | None = None,
               inter_node_gbps: float | None = None) -> WhatIf:
        """Predict another setting from this recording, as ``fsdpviz whatif`` does (its options, each
        checked as the command checks it).

        Example::

            p = run.whatif(prefetch=1)
            p.predicted.step_time_ms - p.baseline.step_time_ms
        """
        from fsdpviz.errors import UsageError
        from fsdpviz.replay.settings import settings_of
        from fsdpviz.whatif.explore import split_of
        from fsdpviz.whatif.gains import clock_notes, summary_model
        from fsdpviz.whatif.predict import predict

        settings = settings_of(
            wrap=wrap, prefetch=prefetch,
            reshard_after_forward=reshard_after_forward,
            keep_last_units=keep_last_units, world_size=world_size, gpus_per_node=gpus_per_node,
            inter_node_gbps=inter_node_gbps)
        if self._model is None:
            self._model, why_not = summary_model(self.result)  # the run's one model, as the summary's
            if self._model is None:
                raise UsageError(why_not)
        prediction = predict(self._model, settings)
        prediction.notes.extend(clock_notes(self.result))  # as the command's
        prediction.bound = split_of(self._model, prediction)  # as the command's
        return WhatIf(run=self, model=self._model, prediction=prediction)


@dataclass(slots=True)
class WhatIf:
    """A prediction: ``baseline`` and ``predicted`` numbers, ``units`` as a DataFrame, its page."""

    run: Run
    model: Model
    prediction: Prediction

    def __repr__(self) -> str:
        b, p = self.baseline, self.predicted
        return (f"<fsdpviz.WhatIf {self.prediction.settings.describe()}: step {b.step_time_ms} -> "
                f"{p.step_time_ms} ms, peak {b.peak_allocated_bytes} -> {p.peak_allocated_bytes} bytes>")

    @property
    def baseline(self) -> Any:
        return self.prediction.baseline

    @property
    def predicted(self) -> Any:
        return self.prediction.predicted

    @property
    def units(self) -> pd.DataFrame:
        """The predicted units, one row each (the ``units`` of ``whatif --json``)."""
        import pandas as pd

        return pd.DataFrame([u.to_json() for u in self.predicted.units])

    def to_json(self) -> dict[str, Any]:
        """Exactly ``fsdpviz whatif --json``."""
        return self.prediction.to_json()

    def page(self, path: PathLike) -> Path:
        """Write the what-if page (``fsdpviz whatif -o``) to ``path``; returns the path."""
        from fsdpviz.report.whatif.build import build_whatif

        return build_whatif(self.model, self.prediction, path, source=self.run.source).path


@dataclass(slots=True)
class Compared:
    """A comparison of runs, as ``fsdpviz compare`` makes it."""

    inputs: list[LabelledRun]
    comparison: Comparison

    @property
    def headline(self) -> pd.DataFrame:
        """One row per headline number (step time, overlap, memory, units...), one column per run."""
        import pandas as pd

        from fsdpviz.analysis.compare.model import HEADLINE_FIELDS

        c = self.comparison
        return pd.DataFrame({f.label: c.values[f.key] for f in HEADLINE_FIELDS}, index=c.labels).T

    @property
    def units(self) -> pd.DataFrame:
        """One row per unit group, run and number: ``group``, ``run``, ``units`` (the run's units in
        the group), ``metric``, ``value``, ``spread_ms`` (the run's step-to-step spread), ``spread_unknown``
        (why that spread is null, "" where it is not) and ``best`` (the page's and the terminal's star), as
        ``compare --json``'s ``unit_groups``."""
        import pandas as pd

        from fsdpviz.analysis.compare.runs import comparison_json

        rows = []
        for group in comparison_json(self.comparison)["unit_groups"]:
            for label, values in group["values"].items():
                for metric, value in values.items():
                    rows.append({"group": group["name"], "run": label, "units": group["members"].get(label, []),
                                 "metric": metric, "value": value,
                                 "spread_ms": group["spread_ms"].get(metric, {}).get(label),
                                 "spread_unknown": group["spread_unknown"].get(metric, {}).get(label, ""),
                                 "best": label in group["best"].get(metric, [])})
        return pd.DataFrame(rows, columns=["group", "run", "units", "metric", "value", "spread_ms", "spread_unknown",
                                           "best"])

    def to_json(self) -> dict[str, Any]:
        """Exactly ``fsdpviz compare --json``."""
        from fsdpviz.analysis.compare.runs import comparison_json

        return comparison_json(self.comparison)

    def page(self, path: PathLike) -> Path:
        """Write the compare page to ``path``; returns the path."""
        from fsdpviz.report.compare.build import build_compare

        return build_compare(self.inputs, path, comparison=self.comparison).path
