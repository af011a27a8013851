"""The headline section: framework, world, steps, step time, overlap, exposed communication, peak
memory, the findings, and the notes that say what the numbers leave out.

Numbers come formatted from the run's summary, never computed here; notes are picked by their code
(:mod:`fsdpviz.structure.records`).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from fsdpviz.analysis.figures import bound_words, clock_words, level_words, not_seen_freed_text
from fsdpviz.formatting import format_bytes, format_ms, format_pct
from fsdpviz.report.html import Fact, Section
from fsdpviz.report.style import sentence
from fsdpviz.structure.parallelism import parallelism_text
from fsdpviz.structure.purposes import PURPOSE_TITLES
from fsdpviz.structure.records import NO_FSDP_LABELS, NO_UNITS_FOUND

if TYPE_CHECKING:
    from fsdpviz.analysis.summary import Summary
    from fsdpviz.report.data import ReportData

HOWTO_HEADLINE = (
    "Figures are per step and, for the run, the median over ranks (each says how it is taken). Overlap is "
    "the share of communication time that ran while the same rank was computing; exposed communication is the rest, time in which the rank "
    "waited for data. Lower exposed time is better."
)
NOTE_NO_UNITS = (
    "Per-unit views need FSDP labels in the trace: FSDP2 writes them itself; for FSDP1 and "
    "ZeRO-3, record with `fsdpviz record`. This trace has none, so the page shows whole-step "
    "communication overlap, lanes and memory only."
)



def headline_section(data: ReportData) -> Section:
    """Framework, world size, steps, step time, overlap, exposed communication, peak memory."""
    s = data.summary
    ov, mem = s.overlap, s.memory
    # The summary's communication numbers are already per step (medians over ranks), on the run's
    # clock: shares of the run's step. The trace's own figures are said as traced, of the traced step.
    exposed_ms, step_ms = _num(s.exposed_comm_ms), _num(s.step_time_ms)
    comm_per_step = _num(ov.comm_ms)
    traced = ov.as_traced
    traced_exposed = _num(traced.exposed_comm_ms) if traced is not None else math.nan
    traced_step = _num(s.traced_step_time_ms)
    facts = [
        Fact(label="framework", value=s.framework,
             hint="DistributedDataParallel, not FSDP: no FSDP units" if s.framework == "ddp" else ""),
        Fact(label="world size", value=str(s.world_size),
             hint=f"{len(s.ranks)} rank(s) in the traces" if s.ranks else ""),
        Fact(label="parallelism", value=parallelism_text(s.parallelism),
             hint="FSDP's shard group, HSDP replicas, tensor-parallel degree; - where unknown"),
        Fact(label="steps analysed", value=_steps_text(s.steps)),
        _step_fact(s),
        *([Fact(label="clock", value=s.clock.basis, hint=clock_words(s.clock))] if s.clock is not None else []),
        _bound_fact(s),
        Fact(label="overlap", value=format_pct(ov.overlap_pct), hint="communication hidden behind computation"),
        Fact(label="exposed comm / step", value=format_ms(exposed_ms),
             hint=(f"{100 * exposed_ms / step_ms:.1f} % of the step; "
                   if math.isfinite(exposed_ms) and math.isfinite(step_ms) and step_ms else "")
             + (f"as traced {format_ms(traced_exposed)}, {100 * traced_exposed / traced_step:.1f} % of the "
                f"traced step ({format_ms(traced_step)}); "
                if math.isfinite(traced_exposed) and math.isfinite(traced_step) and traced_step
                and format_ms(traced_exposed) != format_ms(exposed_ms) else "")
             + f"of {format_ms(comm_per_step)} communication"),
        *_purpose_facts(s),
        Fact(label="peak allocated", value=format_bytes(mem.peak_allocated_bytes) or "n/a",
             hint=level_words(mem.level, mem.baseline_bytes)),
        *([Fact(label="not seen freed", value=format_bytes(mem.not_seen_freed.bytes),
                hint=not_seen_freed_text(mem))] if mem.not_seen_freed is not None else []),
        Fact(label="peak reserved", value=format_bytes(mem.peak_reserved_bytes or None) or "n/a",
             hint="the CPU allocator reports no reserved memory"
             if mem.peak_allocated_bytes and not mem.peak_reserved_bytes else ""),
    ]
    # The summary's own "units is empty" notes are said better by NOTE_NO_UNITS below.
    notes = list(data.notes) + [sentence(n.text) for n in s.notes if n.code not in (NO_FSDP_LABELS, NO_UNITS_FOUND)]
    if not data.has_units and s.framework != "ddp":  # DDP has no units to label: its note says so
        notes.append(NOTE_NO_UNITS)
    return Section(key="headline", title="Headline", howto=HOWTO_HEADLINE, facts=facts, notes=notes,
                   bullets=list(data.findings), code=list(data.action_code))


def _purpose_facts(s: Summary) -> list[Fact]:
    """One fact per purpose that communicated: its exposed time per step, of its communication."""
    by_purpose = s.overlap.by_purpose or {}
    return [Fact(label=f"{PURPOSE_TITLES.get(name, name)} / step", value=format_ms(_num(row.exposed_ms)),
                 hint=f"exposed, of {format_ms(_num(row.comm_ms))} communication; each rank's mean, median over ranks")
            for name, row in by_purpose.items() if row.comm_ms]


def _step_fact(s: Summary) -> Fact:
    """The run's step time: the unprofiled steps' (timers) with what the profiler cost, else the
    traced steps'."""
    cost = s.profiler
    if cost is None or not cost.headline:
        return Fact(label="step time", value=format_ms(_num(s.step_time_ms)),
                    hint="mean over analysed steps and ranks, as traced"
                         + ("; the timers' unprofiled steps are not used (see the notes)" if cost is not None else ""))
    steps = _steps_text(cost.unprofiled_steps)
    return Fact(label="step time", value=format_ms(cost.unprofiled_step_ms),
                hint=f"unprofiled steps {steps} (timers, median); the profiled steps ran {cost.slowdown:.2f}x as "
                     f"long ({format_ms(cost.profiled_step_ms)}): the timeline below is that "
                     + ("window, which ran at another pace (see the notes)" if cost.pace_note is not None
                        else "faster window" if cost.replay_adds_time else "slower run"))


def _bound_fact(s: Summary) -> Fact:
    """What bounds the step: its kind, and the parts of the (unprofiled) step."""
    if s.bound is None:
        return Fact(label="bound", value="n/a", hint="no analysed step has a span")
    words = bound_words(s.bound)
    return Fact(label="bound", value=words.verdict, hint=(f"time: {words.time}; " if words.time else "") + words.parts)


def _num(value: object) -> float:
    """A summary number (None where it does not exist) as a float, NaN for None."""
    return float(value) if isinstance(value, (int, float)) else float("nan")


def _steps_text(steps: list[int]) -> str:
    if not steps:
        return "none"
    if len(steps) > 2 and steps == list(range(steps[0], steps[-1] + 1)):
        return f"{steps[0]}–{steps[-1]}"
    return ", ".join(str(x) for x in steps)


