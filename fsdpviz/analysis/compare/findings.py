"""Findings of a comparison: what differs between runs, in words, with the numbers behind it.

Each finding names the better run of one question (which step is shortest, which exposes the least
communication, which peaks lowest, where the difference sits among the units) and says why only
as far as the traces show it:

- a difference counts when it exceeds the noise: 5 % of the larger value (2 % for memory), twice
  the standard error of the difference of the two means (from the per-step values each run's figure and
  its spread are read from, on the run's clock: the timers' clean steps where the step time is theirs;
  a two-sample test at roughly 95 %) and, for step time and exposed communication, the larger of the
  two runs' step-to-step spreads (the rule of the best marks); below that the finding names no
  winner and says which held, the noise or the spread, with its figure;
- times are ranked only among the runs of one clock (:mod:`fsdpviz.analysis.compare.clocks`), and
  peaks only where the runs' allocated levels count the same;
- a step-time difference is split into the parts of the step the per-unit analysis measures on
  the training threads (units' compute, in FSDP's / ZeRO's ranges, optimizer, other) plus exposed comm;
- a communication difference is explained by the kinds of collectives exposed and how many
  collectives a step runs;
- memory is compared on the peak, or on the memory a step adds (peak - level at step start) when a
  run's level drifts from step to step (:mod:`fsdpviz.analysis.compare.memory`); a difference is
  attributed to unit sizes only when the ZeRO/FSDP memory model
  (``RunAnalysis.memory_model``: sharded state + the two largest units' parameters + the largest
  unit's gradients) accounts for at least half of it; otherwise the finding says the unit sizes
  do not explain it.

No advice is given here beyond what the numbers show; each run's own findings (with knobs) are on
its report page.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Final, NamedTuple

import msgspec
import numpy as np

from fsdpviz import vocabulary
from fsdpviz.analysis.bound import clock_scale, comm_clock_scale
from fsdpviz.analysis.compare.clocks import different_clocks, levels_differ
from fsdpviz.analysis.compare.model import HEADLINE_FIELDS, total_params, unit_index
from fsdpviz.analysis.compare.spread import MEMORY_NOISE, STEP_COLUMNS, headline_spread_why, step_values_ms
from fsdpviz.analysis.compare.units import all_known, group_values
from fsdpviz.analysis.memory_categories import CATEGORIES, OTHER, TITLES
from fsdpviz.analysis.run import STEP_PARTS
from fsdpviz.analysis.summary import no_memory_cause
from fsdpviz.formatting import NS_PER_MS, bytes_text, ms_text
from fsdpviz.structure.records import Finding
from fsdpviz.trace.schema import OVERLAP_CPU

if TYPE_CHECKING:
    from fsdpviz.analysis.compare.model import Comparison
    from fsdpviz.analysis.pipeline import LabelledRun

TIME_NOISE: Final = 0.05
# The headline figures that are times on a run's clock (ranked only among the runs of one clock), and the
# findings that rank them
TIME_KEYS: Final = frozenset(f.key for f in HEADLINE_FIELDS if f.unit == "ms")
CLOCK_FINDINGS: Final = ("step_time", "exposed_comm", "unit_group", "tradeoff")
MIN_TIME_MS: Final = 0.02
MIN_STEPS: Final = 3  # analysed steps per run below which a named winner gets a caveat
MODEL_SHARE: Final = 0.5  # the memory model must explain at least this share of a peak difference
# model compute this many times apart: the machine's pace (or another batch or precision). A shared
# machine's step times move by up to about 30 % between sessions (docs/performance.md), and no wrap,
# prefetch or resharding moves the model's compute (the compare table's "model compute / step",
# overlap.compute_ms); runs.py's pace note and the step-time finding's caveat read it alike
PACE_RATIO: Final = 1.3
PACE_NOTE_START: Final = "Model compute differs between runs of one command"  # runs.py's note of such runs


def _count(n: float, noun: str) -> str:
    return f"{n:g} {noun}" + ("" if n == 1 else "s")


def _finding(kind: str, message: str, evidence: str, better: str | None, values: dict[str, dict[str, Any]]
             ) -> Finding:
    return Finding(kind=kind, message=message, evidence=evidence, better=better, values=values)


def per_step_ms(run: LabelledRun, column: str) -> np.ndarray:
    """Per analysed step, the mean over ranks of a STEP_TIMES column, in ms."""
    times = run.analysis.step_times
    if times.empty:
        return np.array([])
    return (times.groupby("step")[column].mean() / NS_PER_MS).to_numpy(dtype=float)


# STEP_TIMES column -> the headline figure it is a step of
_FIGURE_OF: Final = {"step_ns": "step_time_ms", **{column: key for key, column in STEP_COLUMNS.items()}}


def noise_values_ms(run: LabelledRun, column: str) -> np.ndarray:
    """The per-step values the noise of the figure a STEP_TIMES column is the steps of is read from: those
    its step-to-step spread is read from, on the run's clock (:func:`~fsdpviz.analysis.compare.spread.step_values_ms`:
    the timers' clean steps where the step time is theirs, with the traced steps moved to the step time
    where the clean ones are too few and range narrower); the analysed steps as traced where it has none."""
    figure = _FIGURE_OF.get(column)
    steps = step_values_ms(run, figure) if figure is not None else None
    if steps is not None and len(steps.dropna()) > 1:
        return steps.dropna().to_numpy(dtype=float)
    return per_step_ms(run, column)


def stderr_ms(run: LabelledRun, column: str) -> float:
    """Standard error of the mean of :func:`noise_values_ms` (0 with one step)."""
    values = noise_values_ms(run, column)
    return float(values.std(ddof=1) / np.sqrt(len(values))) if len(values) > 1 else 0.0


def noise_ms(a: LabelledRun, b: LabelledRun, column: str) -> float:
    """Twice the standard error of the difference of two runs' means (see the module docstring)."""
    return 2.0 * float(np.hypot(stderr_ms(a, column), stderr_ms(b, column)))


def few_steps(a: LabelledRun, b: LabelledRun) -> str:
    """A caveat when the step time's noise of either run rests on fewer than MIN_STEPS steps
    (:func:`noise_values_ms`): two or so per-step values give a weak estimate, so a named winner may not
    survive a longer recording."""
    counts = {run.label: len(noise_values_ms(run, "step_ns")) for run in (a, b)}
    label, n = min(counts.items(), key=lambda kv: kv[1])
    if n >= MIN_STEPS:
        return ""
    return (f" Only {n} step(s) in {label} behind its noise estimate: the estimate is weak, so confirm with a "
            "longer recording (more steps).")


def is_clear(a: float, b: float, noise: float, rel: float = TIME_NOISE, floor: float = MIN_TIME_MS) -> bool:
    """Whether ``a`` and ``b`` differ by more than the noise (see the module docstring)."""
    return abs(a - b) > max(rel * max(abs(a), abs(b)), noise, floor)


def beyond_spread(c: Comparison, key: str, i: int, j: int) -> bool:
    """Whether runs ``i`` and ``j`` differ in headline ``key`` by more than the larger of their
    step-to-step spreads (:mod:`fsdpviz.analysis.compare.spread`, the rule of the best marks): the
    one known where the other is unknown; False where neither is known (:func:`unranked`)."""
    a, b = c.values[key][i], c.values[key][j]
    known = _spreads(c, key, i, j)
    if a is None or b is None:
        return True
    return bool(known) and abs(float(a) - float(b)) > max(known)


def not_apart(c: Comparison, key: str, i: int, j: int, noise: float) -> str | None:
    """Why runs ``i`` and ``j`` are not told apart in headline ``key`` (time, ms), in words: within the
    noise (:func:`is_clear`), or beyond it but within their step-to-step spread (:func:`beyond_spread`);
    None where they differ beyond both. The words name the test that held, with its figure."""
    a, b = c.values[key][i], c.values[key][j]
    if a is None or b is None:
        return None
    a, b = float(a), float(b)
    if not is_clear(a, b, noise):
        return (f"within noise: {ms_text(abs(a - b))} apart, no more than the largest of 2 standard errors "
                f"({ms_text(noise)}), {100 * TIME_NOISE:.0f} % of the larger value and {ms_text(MIN_TIME_MS)}")
    if not beyond_spread(c, key, i, j):
        return (f"within the runs' step-to-step spread: {ms_text(abs(a - b))} apart, no more than "
                f"{ms_text(max(_spreads(c, key, i, j)))}")
    return None


def unranked(c: Comparison, key: str, i: int, j: int, what: str) -> str:
    """Where neither run ``i`` nor ``j`` has a step-to-step spread of headline ``key``: a finding's
    message saying that their ``what`` cannot be ranked, and why each has none (whatif advises nothing
    there either); else ""."""
    if i == j or _spreads(c, key, i, j):  # i == j: every run's value alike, nothing to rank
        return ""
    why = "; ".join(f"{c.labels[k]}: {headline_spread_why(c.runs[k], key)}" for k in (i, j))
    return (f"{what} cannot be ranked: neither {c.labels[i]} nor {c.labels[j]} has a step-to-step spread to hold "
            f"their difference to ({why}); record more steps (fsdpviz record --steps 6).")


def _spreads(c: Comparison, key: str, i: int, j: int) -> list[float]:
    """The known step-to-step spreads of runs ``i`` and ``j`` in headline ``key``."""
    spreads = c.spread.get(key) or []
    known = (spreads[k] for k in (i, j) if k < len(spreads))
    return [float(s) for s in known if s is not None]


def _spread_text(c: Comparison, key: str) -> str:
    spreads = c.spread.get(key) or []
    known = [(lb, s) for lb, s in zip(c.labels, spreads) if s is not None]
    return ("; step-to-step spread (highest minus lowest step): " + ", ".join(f"{lb} {ms_text(s)}" for lb, s in known)
            if known else "")


def _known(c: Comparison, key: str) -> list[tuple[int, float]]:
    return [(i, float(v)) for i, v in enumerate(c.values[key]) if v is not None]


def _ranked(c: Comparison, key: str) -> list[tuple[int, float]]:
    """:func:`_known`, of a time figure only the runs ranked on one clock (``Comparison.ranked``)."""
    if key not in TIME_KEYS:
        return _known(c, key)
    return [(i, v) for i, v in _known(c, key) if c.is_ranked(i)]


def _not_on_the_clock(c: Comparison) -> str:
    """`` plain is not ranked: its figures are as traced (the notes say why).`` where some runs' time
    figures are not ranked against the others' (``compare/clocks.py``), "" where every run's are."""
    off = [lb for i, lb in enumerate(c.labels) if not c.is_ranked(i)]
    if not off:
        return ""
    return (f" {', '.join(off)} {'is' if len(off) == 1 else 'are'} not ranked: on another clock than the others "
            "(the notes say why).")


def _clock_unranked(c: Comparison, key: str, kind: str, what: str, evidence: str) -> list[Finding]:
    """Where a time figure is known for two runs or more but fewer than two are on one clock: a finding
    that says the runs are not ranked and why; else nothing."""
    if len(_known(c, key)) < 2 or len(_ranked(c, key)) >= 2 or not (why := different_clocks(c.runs)):
        return []
    values = {key.split(".")[-1]: {c.labels[i]: v for i, v in _known(c, key)}}
    return [_finding(kind, f"{what} not ranked: {why}.", evidence, None, values)]


def _listing(c: Comparison, key: str, fmt: Any) -> str:
    return ", ".join(f"{c.labels[i]} {fmt(v)}" for i, v in _known(c, key))


class _Extremes(NamedTuple):
    best_i: int
    best: float
    worst_i: int
    worst: float
    noise: float
    known: list[tuple[int, float]]


def _extremes(c: Comparison, key: str, column: str) -> _Extremes | None:
    """The runs with the lowest and highest value of headline ``key`` (index, value each), the
    noise between them (``noise_ms`` of the STEP_TIMES ``column``) and every run's known value
    (``_known``); None with fewer than two values."""
    known = _ranked(c, key)
    if len(known) < 2:
        return None
    best_i, best = min(known, key=lambda t: t[1])
    worst_i, worst = max(known, key=lambda t: t[1])
    return _Extremes(best_i, best, worst_i, worst, noise_ms(c.runs[best_i], c.runs[worst_i], column), known)


def _paces_apart(c: Comparison, i: int, j: int) -> float | None:
    """Run ``j``'s model compute over run ``i``'s where they lie :data:`PACE_RATIO` or more apart and the
    notes do not already say why (runs of one command: the pace note; other models, world sizes,
    frameworks or devices); None otherwise."""
    if any(n.startswith(PACE_NOTE_START) for n in c.notes):
        return None
    a, b = c.runs[i].summary, c.runs[j].summary
    if (a.world_size, a.framework, a.device) != (b.world_size, b.framework, b.device):
        return None
    pa, pb = total_params(c.runs[i]), total_params(c.runs[j])
    if pa is not None and pb is not None and pa != pb:  # other models: the notes say so
        return None
    ca, cb = a.overlap.compute_ms, b.overlap.compute_ms
    if ca is None or cb is None or not (ca > 0 and cb > 0) or max(ca, cb) < PACE_RATIO * min(ca, cb):
        return None
    return cb / ca


def pace_caveat(c: Comparison, i: int, j: int) -> str:
    """`` Their model compute differs: ...``: said where runs ``i`` and ``j`` (the finding's pair) computed
    the model :data:`PACE_RATIO` or more apart, as FSDP's settings leave it as it is, so the step's
    difference may be the machine's rather than the setting's. Not said where the notes already tell why:
    runs of one command (the pace note), or of other models, world sizes, frameworks or devices."""
    if _paces_apart(c, i, j) is None:
        return ""
    ca, cb = c.runs[i].summary.overlap.compute_ms, c.runs[j].summary.overlap.compute_ms
    assert ca is not None and cb is not None
    (hi, high), (lo, low) = sorted(((i, ca), (j, cb)), key=lambda x: -x[1])
    return (f" Their model compute differs: {c.labels[hi]} computes {ms_text(high)} a step against {ms_text(low)} in "
            f"{c.labels[lo]} ({high / low:.2f}x). No wrap, prefetch or resharding moves the model's compute, so "
            "these runs ran at different paces (the machine's load or clocks) or differ in their batch, micro-batches "
            "or precision: part of the step difference may be that, not the setting (runs of one model and batch "
            "recorded again one after the other tell).")


def step_time_finding(c: Comparison) -> list[Finding]:
    found = _extremes(c, "step_time_ms", "step_ns")
    if found is None:
        return _clock_unranked(c, "step_time_ms", "step_time", "The step times are",
                               f"step time: {_listing(c, 'step_time_ms', ms_text)}")
    best_i, best, worst_i, worst, noise, known = found
    values = {"step_time_ms": {c.labels[i]: v for i, v in known}}
    evidence = (f"step time: {_listing(c, 'step_time_ms', ms_text)}; noise between the fastest and slowest "
                f"(2 standard errors): {ms_text(noise)}" + _spread_text(c, "step_time_ms"))
    if none := unranked(c, "step_time_ms", best_i, worst_i, "The step times"):
        return [_finding("step_time", none, evidence, None, values)]
    if why := not_apart(c, "step_time_ms", best_i, worst_i, noise):
        return [_finding("step_time", f"Step times are not told apart ({ms_text(best)} to {ms_text(worst)}): {why}.",
                         evidence, None, values)]
    # Against the baseline when that difference is clear too, else against the slowest run.
    step_ms = dict(known)
    base = step_ms.get(0)
    other_i = worst_i
    if best_i != 0 and base is not None:
        base_noise = noise_ms(c.runs[best_i], c.runs[0], "step_ns")
        other_i = 0 if is_clear(best, base, base_noise) and beyond_spread(c, "step_time_ms", best_i, 0) else worst_i
    other = step_ms[other_i]
    message = (f"{c.labels[best_i]} has the shortest step: {ms_text(best)}, {100 * (other - best) / other:.0f} % "
               f"less than {c.labels[other_i]} ({ms_text(other)}).")
    on_gpu = any(c.runs[i].summary.device != OVERLAP_CPU for i in (best_i, other_i))
    # a GPU's training threads are host work the profiler slowed, and only a CPU rank's factor moves them
    # to the run's clock: a pair with a GPU run reads both as traced, said so, beside the traced steps
    parts = step_parts(c.runs[best_i], c.runs[other_i], traced=on_gpu)
    traced = [c.runs[i].summary.traced_step_time_ms for i in (other_i, best_i)]
    if parts and on_gpu:
        said = " against ".join(ms_text(t) for t in traced if t is not None)
        message += f" On the training threads, as traced ({said} a step): " + parts + "."
    elif parts:
        message += f" Where the {ms_text(other - best)} went: " + parts + "."
    message += _the_others(c, "step_time_ms", "step_ns", "takes", best_i, {best_i, other_i}, known)
    message += few_steps(c.runs[best_i], c.runs[other_i]) + pace_caveat(c, best_i, other_i)
    return [_finding("step_time", message, evidence, c.labels[best_i], values)]


def step_parts(a: LabelledRun, b: LabelledRun, *, traced: bool = False) -> str:
    """How the step's parts changed from run ``b`` to run ``a`` (means over ranks and steps, each run's
    moved to its clock as its step is: the bound's ``device_scale``, its exposed communication's
    ``comm_scale``; ``traced``: both as traced), or ""."""
    ta, tb = getattr(a.analysis, "step_times", None), getattr(b.analysis, "step_times", None)
    if ta is None or tb is None or ta.empty or tb.empty:
        return ""
    ka, kb = (1.0, 1.0) if traced else (clock_scale(a.summary.bound), clock_scale(b.summary.bound))
    ca, cb = (1.0, 1.0) if traced else (comm_clock_scale(a.summary.bound), comm_clock_scale(b.summary.bound))

    def delta(col: str) -> float:
        sa, sb = (ca, cb) if col == "exposed_comm_ns" else (ka, kb)
        return (sa * float(ta[col].mean()) - sb * float(tb[col].mean())) / NS_PER_MS

    # the parts of a step on the training threads (they add up to the step) by the names the report's
    # step chart gives them; then exposed communication, which on CPU mostly lies inside the framework's
    # ranges (the thread waits inside FSDP's labels)
    diffs = [(name, delta(col)) for col, name in STEP_PARTS]
    diffs = sorted((d for d in diffs if abs(d[1]) >= MIN_TIME_MS), key=lambda d: -abs(d[1]))
    if not diffs:
        return ""
    text = ", ".join(f"{name} {value:+.2f} ms" for name, value in diffs)
    return text + f" (exposed communication, mostly waited out inside those ranges: {delta('exposed_comm_ns'):+.2f} ms)"


def collective_counts(run: LabelledRun) -> dict[str, float]:
    """Median collectives per rank and step, by kind (ZeRO-3 bucket rows counted once)."""
    spans = run.analysis.spans
    if spans is None or spans.empty:
        return {}
    out = {}
    for kind in (vocabulary.ALL_GATHER, vocabulary.REDUCE_SCATTER):
        rows = spans[spans["kind"] == kind].drop_duplicates(["rank", "step", "lane", "start_ns"])
        if len(rows):
            out[kind] = float(rows.groupby(["rank", "step"]).size().median())
    return out


def exposed_parts(run: LabelledRun) -> dict[str, float]:
    """Exposed all-gather (forward, backward) and reduce-scatter per step: sums of the unit medians."""
    units = run.summary.units
    out: dict[str, float] = {}
    for key, col in (("forward_all_gather_ms", "forward_exposed_all_gather_ms"),
                     ("backward_all_gather_ms", "backward_exposed_all_gather_ms"),
                     ("reduce_scatter_ms", "exposed_reduce_scatter_ms")):
        values = all_known([u.metric(col) for u in units])
        if values:
            out[key] = round(sum(values), 3)
    if "forward_all_gather_ms" in out and "backward_all_gather_ms" in out:
        out["all_gather_ms"] = round(out["forward_all_gather_ms"] + out["backward_all_gather_ms"], 3)
    return out


def _the_others(c: Comparison, key: str, column: str, verb: str, best_i: int, named: set[int],
                known: list[tuple[int, float]]) -> str:
    """`` Also, pair takes 217.52 ms (60.75 ms more than root, within the runs' step-to-step spread: 60.97
    ms).``: each run a time finding does not name, against its best run by the finding's own tests (the
    noise, then the step-to-step spread), so a row the table leaves without a star is not read as ranked."""
    rest = []
    best = dict(known)[best_i]
    for i, v in known:
        if i in named:
            continue
        noise_i = noise_ms(c.runs[best_i], c.runs[i], column)
        if not is_clear(best, v, noise_i):
            verdict = f"within noise: noise {ms_text(noise_i)}"
        elif not _spreads(c, key, best_i, i):
            verdict = "no step-to-step spread known for either, so not ranked"
        elif not beyond_spread(c, key, best_i, i):  # beyond the noise, not the steps' own spread
            verdict = f"within the runs' step-to-step spread: {ms_text(max(_spreads(c, key, best_i, i)))}"
        else:
            verdict = f"a clear difference: noise {ms_text(noise_i)}"
        if (ratio := _paces_apart(c, best_i, i)) is not None:  # the step-time finding's caveat, for this run
            verdict += f"; but its model compute is {ratio:.2f}x {c.labels[best_i]}'s, which no FSDP setting moves"
        # named against the best run: the table's deltas are against the first run, another figure
        rest.append(f"{c.labels[i]} {verb} {ms_text(v)} ({ms_text(v - best)} more than {c.labels[best_i]}, {verdict})")
    return " Also, " + "; ".join(rest) + "." if rest else ""  # labels keep their case


def exposed_finding(c: Comparison) -> list[Finding]:
    found = _extremes(c, "overlap.exposed_comm_ms", "exposed_comm_ns")
    if found is None:
        return _clock_unranked(c, "overlap.exposed_comm_ms", "exposed_comm", "Exposed communication is",
                               f"exposed communication per step: {_listing(c, 'overlap.exposed_comm_ms', ms_text)}")
    best_i, best, worst_i, worst, noise, known = found
    parts = {r.label: exposed_parts(r) for r in c.runs}
    counts = {r.label: collective_counts(r) for r in c.runs}
    values: dict[str, dict[str, Any]] = {"exposed_comm_ms": {c.labels[i]: v for i, v in known}}
    for key in ("all_gather_ms", "forward_all_gather_ms", "backward_all_gather_ms", "reduce_scatter_ms"):
        # "units_": the units' medians summed, not the summary's by-purpose figures (one name, one meaning)
        values[f"units_exposed_{key}"] = {lb: p[key] for lb, p in parts.items() if key in p}
    values["all_gathers_per_step"] = {lb: n[vocabulary.ALL_GATHER] for lb, n in counts.items()
                                      if vocabulary.ALL_GATHER in n}
    evidence = (f"exposed communication per step: {_listing(c, 'overlap.exposed_comm_ms', ms_text)}"
                + _spread_text(c, "overlap.exposed_comm_ms"))
    per_kind = [f"{lb}: all-gather {ms_text(p['all_gather_ms'])} (forward {ms_text(p['forward_all_gather_ms'])}, "
                f"backward {ms_text(p['backward_all_gather_ms'])}), reduce-scatter {ms_text(p.get('reduce_scatter_ms', 0))}"
                for lb, p in parts.items() if "all_gather_ms" in p]
    if per_kind:
        evidence += "; exposed per unit, summed: " + "; ".join(per_kind)
    if none := unranked(c, "overlap.exposed_comm_ms", best_i, worst_i, "Exposed communication"):
        return [_finding("exposed_comm", none, evidence, None, values)]
    if why := not_apart(c, "overlap.exposed_comm_ms", best_i, worst_i, noise):
        return [_finding("exposed_comm", f"Exposed communication is not told apart across runs "
                         f"({ms_text(best)} to {ms_text(worst)} per step): {why}.", evidence, None, values)]
    b, w = c.labels[best_i], c.labels[worst_i]
    message = f"{b} exposes the least communication: {ms_text(best)} per step, against {ms_text(worst)} in {w}"
    pb, pw = parts.get(b, {}), parts.get(w, {})
    if "all_gather_ms" in pb and "all_gather_ms" in pw:
        # the units' medians summed: not the summary's by-purpose figures (means over every collective)
        message += (f"; the units' exposed all-gathers (their medians summed) {ms_text(pb['all_gather_ms'])} vs "
                    f"{ms_text(pw['all_gather_ms'])}, reduce-scatters {ms_text(pb.get('reduce_scatter_ms', 0))} vs "
                    f"{ms_text(pw.get('reduce_scatter_ms', 0))}")
    nb, nw = counts[b].get(vocabulary.ALL_GATHER), counts[w].get(vocabulary.ALL_GATHER)
    if nb is not None and nw is not None and nb != nw:
        message += f"; {b} runs {_count(nb, 'all-gather')} per step where {w} runs {_count(nw, 'all-gather')}"
    message += "." + _the_others(c, "overlap.exposed_comm_ms", "exposed_comm_ns", "exposes", best_i, {best_i, worst_i},
                                 known)
    return [_finding("exposed_comm", message + few_steps(c.runs[best_i], c.runs[worst_i]), evidence, b, values)]


def _and(labels: Sequence[str]) -> str:
    """``a``, ``a and b``, ``a, b and c``."""
    return labels[0] if len(labels) == 1 else f"{', '.join(labels[:-1])} and {labels[-1]}"


def _measured_none(c: Comparison, labels: Sequence[str], what: str) -> str:
    """``Bl measured none: it was recorded with --no-memory (run.json)``: the runs of ``labels``, whose
    ``what`` is null, and why: as each summary's ``no_memory`` note says it, or, of a run with a peak,
    that its level at step start is not known."""
    out = []
    for r in c.runs:
        if r.label in labels:
            out.append(f"{r.label} measured none: {no_memory_cause(r.run)}" if r.summary.memory.peak_allocated_bytes
                       is None else f"{r.label}'s {what} is not known: its level at step start is not")
    return "; ".join(out)


def _assumed_model(c: Comparison, label: str) -> str:
    """`` (...)`` naming what the ZeRO arithmetic of run ``label`` assumed rather than measured."""
    run = next(r for r in c.runs if r.label == label)
    m = run.analysis.memory_model
    if m is None:
        return ""
    assumed = [*(["the sharded bytes per element"] if not m.sharded_bytes_measured else []),
               *(["the optimizer's bytes per element"] if not m.optimizer_bytes_measured else [])]
    return f" ({' and '.join(assumed)} assumed, not measured)" if assumed else ""


def memory_finding(c: Comparison) -> list[Finding]:
    drifting = any(d is not None for d in c.drift)
    key = "step_rise_bytes" if drifting else "memory.peak_allocated_bytes"
    what = "memory a step adds" if drifting else "peak allocated memory"
    known = _known(c, key)
    # a run whose figure is null may hold less: a ranking is of those that measured one, and says so
    unknown = [c.labels[i] for i, v in enumerate(c.values[key]) if v is None]
    if len(known) < 2:
        if not known or not unknown:
            return []
        return [_finding("memory", f"{what[0].upper()}{what[1:]} is not compared, as {_measured_none(c, unknown, what)}.",
                         f"{what}: {_listing(c, key, bytes_text)}", None,
                         {key.split(".")[-1]: {c.labels[i]: int(v) for i, v in known}})]
    missing = f"; {_measured_none(c, unknown, what)}" if unknown else ""
    low_i, low = min(known, key=lambda t: t[1])
    high_i, high = max(known, key=lambda t: t[1])
    values: dict[str, dict[str, Any]] = {key.split(".")[-1]: {c.labels[i]: int(v) for i, v in known}}
    models = {r.label: r.analysis.memory_model.model_peak_bytes if r.analysis.memory_model else None for r in c.runs}
    values["model_peak_bytes"] = {lb: m for lb, m in models.items() if m}
    largest = c.values["largest_unit_bytes"]
    values["largest_unit_bytes"] = {c.labels[i]: v for i, v in enumerate(largest) if v is not None}
    evidence = f"{what}: {_listing(c, key, bytes_text)}"
    if drifting:
        evidence += (" (peak - level at step start, median over ranks and steps; peaks are not compared because "
                     "the level at step start drifts)")
    if values["largest_unit_bytes"]:
        evidence += "; largest unit (unsharded parameters): " + ", ".join(
            f"{lb} {bytes_text(v)}" for lb, v in values["largest_unit_bytes"].items())
    if not drifting and (level_why := levels_differ(c.runs)):
        return [_finding("memory", f"Peak allocated memory is not ranked: {level_why}{missing}.", evidence, None,
                         values)]
    if not is_clear(low, high, 0.0, rel=MEMORY_NOISE, floor=0.0):
        across = "the runs that measured it" if unknown else "runs"
        alike = (f"the same to the byte across {across} ({bytes_text(low)})" if low == high else
                 f"within {MEMORY_NOISE:.0%} across {across} ({bytes_text(low)} to {bytes_text(high)})")
        return [_finding("memory", f"{what[0].upper()}{what[1:]} is {alike}{missing}.", evidence, None, values)]
    lo, hi = c.labels[low_i], c.labels[high_i]
    of = " of the runs that measured it" if unknown else ""
    message = f"{lo} has the lowest {what}{of}: {bytes_text(low)}, {bytes_text(high - low)} less than {hi}"
    # runs within the rule of the lowest share it: none is ranked first, as the table stars none
    tied = [(i, v) for i, v in sorted(known, key=lambda t: t[1]) if i != low_i and v - low <= MEMORY_NOISE * v]
    if tied and all(v == low for _, v in tied):  # the table stars each of them
        names = [lo, *(c.labels[i] for i, _ in tied)]
        message = (f"{_and(names)} have the lowest {what}{of}, the same to the byte: {bytes_text(low)}, "
                   f"{bytes_text(high - low)} less than {hi}")
    elif tied:  # the table stars none
        names = [lo, *(c.labels[i] for i, _ in tied)]
        message = (f"{_and(names)} have the lowest {what}{of}, within {MEMORY_NOISE:.0%} of each other ("
                   + ", ".join(f"{c.labels[i]} {bytes_text(v)}" for i, v in [(low_i, low), *tied])
                   + f"), so none is ranked first; {hi} holds {bytes_text(high - low)} more than {lo}")
    message += missing + "."
    m_lo, m_hi = models[lo], models[hi]
    l_lo, l_hi = largest[low_i], largest[high_i]
    if m_lo and m_hi and l_lo and l_hi:
        model_delta = m_hi - m_lo
        if model_delta > 0 and model_delta >= MODEL_SHARE * (high - low):
            why = (f" In line with the unit sizes: {hi}'s largest unit holds {bytes_text(l_hi)} of parameters "
                   f"unsharded at once ({lo}: {bytes_text(l_lo)})")
            if c.labels[high_i] in c.match.whole_model:
                why = (f" In line with the unit sizes: {hi} is one unit, so every parameter ({bytes_text(l_hi)}) is "
                       "unsharded at once")
            # the ZeRO arithmetic's figure stays in the evidence: it holds the two largest units unsharded at
            # once whatever the run prefetches, an upper estimate beside the measured difference, and not
            # what `fsdpviz whatif` predicts for either setting (a second figure for one difference)
            message += why + "."
        else:
            message += (f" Unit sizes do not explain it: the ZeRO arithmetic's peaks differ by {bytes_text(abs(model_delta))} "
                        f"({hi} {bytes_text(m_hi)}, {lo} {bytes_text(m_lo)})")
            # the peaks' categories say what the peaks hold, not what a step adds (a drifting run's figure)
            message += _prefetch_memory(c, high_i, low_i, high - low) \
                or (_at_the_peaks(c, high_i, low_i, high - low) if not drifting else "") \
                or "; the rest is activations, buffers or the allocator."
        evidence += ("; the ZeRO arithmetic's peak (sharded state, the two largest units' parameters and the largest's "
                     "gradients unsharded; an estimate, not fsdpviz whatif's prediction): "
                     + ", ".join(f"{lb} {bytes_text(v)}{_assumed_model(c, lb)}" for lb, v in values["model_peak_bytes"].items()))
    return [_finding("memory", message, evidence, None if tied else lo, values)]


def _at_the_peaks(c: Comparison, high_i: int, low_i: int, delta: float) -> str:
    """What the two peaks held that differs most, where it is half the difference or more: each run's
    allocated level at its highest peak by category (``memory.categories``, the summary's "at the peak");
    units kept gathered after forward (``reshard_after_forward=False``) show as unsharded parameters."""
    hi, lo = c.runs[high_i].summary.memory, c.runs[low_i].summary.memory
    if hi.categories is None or lo.categories is None:
        return ""
    # "other" is what no category explains: the sentence this one replaces says that already
    both = {cat: (a, b) for cat in CATEGORIES if cat != OTHER
            and (a := hi.categories.get(cat)) is not None and (b := lo.categories.get(cat)) is not None}
    if not both:
        return ""
    cat, (a, b) = max(both.items(), key=lambda kv: kv[1][0] - kv[1][1])
    if a - b < 0.5 * delta:
        return ""
    return (f"; at the peaks, {c.labels[high_i]} holds {bytes_text(a - b)} more {TITLES[cat]} ("
            f"{bytes_text(a)} against {bytes_text(b)} in {c.labels[low_i]}).")


def _prefetch_memory(c: Comparison, high_i: int, low_i: int, delta: float) -> str:
    """Why a run that gathers further ahead peaks higher, when the numbers say so: its extra peak is
    a whole number of its largest unit's unsharded parameters (within 10 %)."""
    unit_bytes = c.values["largest_unit_bytes"][high_i]
    hi, lo = c.runs[high_i], c.runs[low_i]
    deeper = [p for p in ("forward", "backward")
              if (_mean_depth(hi, p) or 0.0) - (_mean_depth(lo, p) or 0.0) >= 0.5]
    if not unit_bytes or not deeper:
        return ""
    n = round(delta / unit_bytes)
    if n < 1 or abs(delta - n * unit_bytes) > 0.1 * unit_bytes:
        return ""
    return (f"; the extra {bytes_text(delta)} is {n} unit(s)' unsharded parameters ({bytes_text(n * unit_bytes)}), and "
            f"{hi.label} gathers further ahead in {' and '.join(deeper)} (prefetched units stay gathered "
            "while earlier units compute).")


def tradeoff_finding(c: Comparison, found: Sequence[Finding]) -> list[Finding]:
    """The fastest run is not the one with the lowest peak: say what the speed costs."""
    better = {f.kind: f.better for f in found}
    fast, lean = better.get("step_time"), better.get("memory")
    if not fast or not lean or fast == lean:
        return []
    memory = next(f for f in found if f.kind == "memory")
    key = "step_rise_bytes" if "step_rise_bytes" in memory.values else "memory.peak_allocated_bytes"
    i, j = c.labels.index(fast), c.labels.index(lean)
    if not (c.is_ranked(i) and c.is_ranked(j)):  # step times on two clocks: no time to weigh the memory against
        return []
    t_fast, t_lean = c.values["step_time_ms"][i], c.values["step_time_ms"][j]
    m_fast, m_lean = c.values[key][i], c.values[key][j]
    if t_fast is None or t_lean is None or m_fast is None or m_lean is None:
        return []
    # the step finding names the fastest against the slowest: the lean run may be within noise of it,
    # or within the steps' own spread, and then the speed costs nothing measurable
    noise = noise_ms(c.runs[i], c.runs[j], "step_ns")
    if not is_clear(float(t_fast), float(t_lean), noise) or not beyond_spread(c, "step_time_ms", i, j):
        return []
    dt = float(t_lean) - float(t_fast)
    dm = int(m_fast) - int(m_lean)
    cost = f"adds {bytes_text(dm)} more memory per step" if key == "step_rise_bytes" else f"peaks {bytes_text(dm)} higher"
    return [_finding("tradeoff", f"Trade-off: {fast} is {ms_text(dt)} per step faster than {lean} but {cost}.",
                     f"step time {fast} {ms_text(float(t_fast))}, {lean} {ms_text(float(t_lean))}", None,
                     {"step_time_ms": {fast: dt}, key.split(".")[-1]: {fast: dm}})]


def _mean_depth(run: LabelledRun, phase: str) -> float | None:
    depths = [d for d in (u.metric(f"{phase}_issue_depth") for u in run.summary.units) if d is not None]
    return float(np.mean(depths)) if depths else None


def prefetch_finding(c: Comparison) -> list[Finding]:
    """Runs whose gathers start further ahead of their units' compute (issue depth: the units computed in
    between) than others'."""
    out = []
    for phase in ("forward", "backward"):
        depths = {r.label: _mean_depth(r, phase) for r in c.runs}
        known = {lb: d for lb, d in depths.items() if d is not None}
        if len(known) < 2 or max(known.values()) - min(known.values()) < 0.5:
            continue
        deep = max(known, key=lambda lb: known[lb])
        shallow = min(known, key=lambda lb: known[lb])
        exposed = {r.label: exposed_parts(r).get(f"{phase}_all_gather_ms") for r in c.runs}
        e_deep, e_shallow = exposed.get(deep), exposed.get(shallow)
        message = (f"{deep} issues its {phase} all-gathers earlier: on average {known[deep]:.1f} other units compute "
                   f"between a gather's start and its own unit's compute, against {known[shallow]:.1f} in {shallow}")
        i, j = c.labels.index(deep), c.labels.index(shallow)
        better = None
        if not (c.is_ranked(i) and c.is_ranked(j)):
            message += f"; their exposed {phase} all-gather time is not compared: the runs are on different clocks"
        elif e_deep is not None and e_shallow is not None:
            # held to the tests of the runs' exposed communication (the noise, then the steps' spread), of
            # which this is a part: a part moving more than the whole is told apart only with it
            key = "overlap.exposed_comm_ms"
            why = ("neither run has a step-to-step spread to hold it to" if not _spreads(c, key, i, j)
                   else not_apart(c, key, i, j, noise_ms(c.runs[i], c.runs[j], "exposed_comm_ns")))
            said = f"{ms_text(e_deep)} vs {ms_text(e_shallow)} per step"
            total = c.values[key]
            if why:
                message += (f"; its exposed {phase} all-gather time reads {said}, but the runs' exposed "
                            f"communication is not told apart ({why}), so neither is named better")
            else:
                message += f"; its exposed {phase} all-gather time is {'less' if e_deep < e_shallow else 'not less'}: {said}"
                # named better only where the whole exposed communication, told apart, says so too
                ti, tj = total[i], total[j]
                whole_less = ti is not None and tj is not None and float(ti) < float(tj)
                better = deep if e_deep < e_shallow and whole_less else None
                if e_deep < e_shallow and not whole_less:
                    if ti is None or tj is None:
                        whose = "both runs" if ti is None and tj is None else deep if ti is None else shallow
                        message += (f", but the whole exposed communication of {whose} is unknown, so neither is "
                                    "named better")
                    else:
                        message += (f", but its whole exposed communication is not less ({ms_text(float(ti))} vs "
                                    f"{ms_text(float(tj))} per step), so it is not named better")
        out.append(_finding("prefetch", message + ".", "mean over units of the median issue depth "
                            "(the other units computed between a gather's start and its unit's compute)", better,
                            {f"{phase}_issue_depth": known,
                             f"units_exposed_{phase}_all_gather_ms": {k: v for k, v in exposed.items() if v is not None}}))
    return out


def group_finding(c: Comparison) -> list[Finding]:
    """The unit group whose exposed communication differs most between runs."""
    steps = [v for v in c.values["step_time_ms"] if v is not None]
    floor = max(0.005 * min(steps), MIN_TIME_MS) if steps else MIN_TIME_MS
    index = {r.label: unit_index(r) for r in c.runs}
    best: tuple[float, Any, dict[str, float]] | None = None
    ranked = {lb for i, lb in enumerate(c.labels) if c.is_ranked(i)}  # times only among the runs of one clock
    for group in c.match.groups:
        per_run = {lb: group_values(group, lb, index[lb])["exposed_comm_ms"] for lb in c.labels if lb in ranked}
        vals = {lb: v for lb, v in per_run.items() if v is not None}
        if len(vals) < 2:
            continue
        gap = max(vals.values()) - min(vals.values())
        if gap > floor and (best is None or gap > best[0]):
            best = (gap, group, vals)
    if best is None or len(c.match.groups) < 2:
        return []
    gap, group, vals = best
    low, high = min(vals, key=lambda lb: vals[lb]), max(vals, key=lambda lb: vals[lb])
    def members(label: str) -> str:
        units = group.members[label]
        names = " + ".join(units) if len(units) <= 3 else f"{units[0]} + … + {units[-1]}, {len(units)} units"
        return "" if names == group.name else f" ({names})"

    message = (f"The units that differ most are {group.name}: exposed communication {ms_text(vals[low])} per step in "
               f"{low}{members(low)} against {ms_text(vals[high])} in {high}{members(high)}")
    # one verdict with the table: the row's star (the spreads' rule over every run) names the better run,
    # and where the row has none, the finding names none and gives the table's reason
    stars = c.unit_best.get(group.name, {}).get("exposed_comm_ms", [])
    better: str | None = low if stars == [c.labels.index(low)] else None
    if better is None:
        why = c.unit_best_withheld.get(group.name, {}).get("exposed_comm_ms") or "the row's star is not given"
        message += f"; not ranked: {why}"
    message += "."
    return [_finding("unit_group", message, "per-unit medians summed over the group's units", better,
                     {"exposed_comm_ms": vals, "group": {"name": group.name}})]


def build_findings(c: Comparison) -> list[Finding]:
    """Every comparison finding, in reading order: time, communication, memory, trade-off, detail."""
    found = step_time_finding(c) + exposed_finding(c) + memory_finding(c)
    found += tradeoff_finding(c, found)
    found += prefetch_finding(c) + group_finding(c)
    if off := _not_on_the_clock(c):  # a time finding among the runs of one clock says who is left out
        found = [msgspec.structs.replace(f, message=f.message + off)
                 if f.kind in CLOCK_FINDINGS and "different clocks" not in f.message else f for f in found]
    return found
