"""A prediction -> the frames the what-if page draws: both steps' lanes, spans, exposed strips, memory.

The step shown is the recorded rank-step whose step time is closest to the median of the analysed
ones; the recorded timeline is what the analysis found in its trace, the predicted one is the
simulation of the same rank-step under the new setting. Both are drawn in lanes by kind of work
(compute, the all-gather's copy-in, the all-gather, the reduce-scatter, the all-reduce), so a
merged unit in the prediction lines up with its members in the recording.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from fsdpviz.formatting import NS_PER_MS
from fsdpviz.naming import ROOT_UNIT
from fsdpviz.replay.memory import MemoryChange
from fsdpviz.replay.model import Model
from fsdpviz.replay.simulate import SimResult
from fsdpviz.structure.intervals import subtract_intervals, union_intervals
from fsdpviz.vocabulary import (
    ALL_GATHER,
    ALL_REDUCE,
    COMPUTE,
    COPY_IN,
    COPY_OUT,
    OPTIMIZER,
    REDUCE_SCATTER,
    UNIT_COLLECTIVES,
)
from fsdpviz.whatif.predict import Prediction

# kind of work -> (lane order, lane label)
LANES = {COMPUTE: (0, "compute"), COPY_OUT: (0, "compute"), OPTIMIZER: (0, "compute"),
         COPY_IN: (1, "all-gather copy-in"), ALL_GATHER: (2, "all-gather"),
         REDUCE_SCATTER: (3, "reduce-scatter"), ALL_REDUCE: (4, "all-reduce")}
COMPUTE_KINDS = (COMPUTE, COPY_OUT, OPTIMIZER)
# what a span of no unit is named by, per the replay's phase of it (replay/simulate.py's segments)
OUTSIDE_UNITS = {OPTIMIZER: "(optimizer)", "pre": "(before the forward)", "mid": "(between forward and backward)"}


@dataclass(slots=True)
class Timeline:
    """One step drawn as a Gantt: its rows (``row``, ``label``), spans and exposed strips (ms)."""

    title: str
    rows: pd.DataFrame
    segments: pd.DataFrame
    exposed: pd.DataFrame
    memory: pd.DataFrame  # t_ms, allocated_bytes
    step_ms: float


@dataclass(slots=True)
class WhatifData:
    recorded: Timeline
    predicted: Timeline
    rank: int
    step: int
    units: list[str]  # every unit name of either timeline, recorded forward order first


def representative(prediction: Prediction) -> int:
    """Index of the rank-step whose recorded step time is closest to the median."""
    times = [s.step_ns for s in prediction.steps]
    median = float(np.median(times))
    return min(range(len(times)), key=lambda i: (abs(times[i] - median), i))


def _timeline(title: str, spans: pd.DataFrame, memory: pd.DataFrame, step_ms: float) -> Timeline:
    """``spans``: unit, phase, kind, x0_ms, x1_ms."""
    spans = spans[spans["kind"].isin(list(LANES))].copy()
    spans["row"] = [LANES[k][0] for k in spans["kind"]]
    rows_used = sorted(set(spans["row"].tolist()) | {0})
    labels = {order: label for order, label in LANES.values()}
    position = {r: i for i, r in enumerate(rows_used)}
    spans["row"] = spans["row"].map(position)
    rows = pd.DataFrame({"row": list(range(len(rows_used))), "label": [labels[r] for r in rows_used]})
    # work of no unit, by where it ran: the optimizer's step; a collective at the step's end (ZeRO-3's
    # reductions after its backward, in the replay's end segment); the loss and the like by their phase
    outside = [("(after the backward)" if kind in UNIT_COLLECTIVES and phase == OPTIMIZER
                else OUTSIDE_UNITS.get(str(phase), "(outside every unit)"))
               for kind, phase in zip(spans["kind"], spans["phase"])]
    spans["unit_name"] = spans["unit"].where(spans["unit"] != "", pd.Series(outside, index=spans.index))
    spans["start_ms"] = spans["x0_ms"].round(3)
    spans["dur_ms"] = (spans["x1_ms"] - spans["x0_ms"]).round(3)
    spans["lane"] = [labels[LANES[k][0]] for k in spans["kind"]]
    compute = spans[spans["kind"].isin(COMPUTE_KINDS)]
    busy = union_intervals((compute["x0_ms"] * 1e6).to_numpy(np.int64), (compute["x1_ms"] * 1e6).to_numpy(np.int64))
    strips = []
    for row in spans[spans["kind"].isin(UNIT_COLLECTIVES)].itertuples():
        own = union_intervals(np.array([int(row.x0_ms * 1e6)]), np.array([int(row.x1_ms * 1e6)]))
        s, e = subtract_intervals(own, busy)
        for a, b in zip(s, e):
            strips.append({"row": row.row, "x0_ms": a / NS_PER_MS, "x1_ms": b / NS_PER_MS, "dur_ms": (b - a) / NS_PER_MS,
                           "what": f"{row.unit_name} {row.kind.replace('_', '-')}"})
    exposed = pd.DataFrame(strips, columns=["row", "x0_ms", "x1_ms", "dur_ms", "what"])
    return Timeline(title=title, rows=rows, segments=spans.reset_index(drop=True), exposed=exposed, memory=memory,
                    step_ms=step_ms)


def _recorded(model: Model, rank: int, step: int, start_ns: int, step_ns: int) -> Timeline:
    a = model.result.analysis
    sp = a.spans[(a.spans["rank"] == rank) & (a.spans["step"] == step)]
    phase = sp["phase"].astype(str)
    spans = pd.DataFrame({"unit": sp["unit"].astype(str), "phase": phase,
                          "kind": np.where(phase == "optimizer", "optimizer", sp["kind"].astype(str)),
                          "x0_ms": (sp["start_ns"] - start_ns) / NS_PER_MS, "x1_ms": (sp["end_ns"] - start_ns) / NS_PER_MS})
    mem = a.memory[(a.memory["rank"] == rank) & (a.memory["t_ns"] >= start_ns)
                   & (a.memory["t_ns"] <= start_ns + step_ns)]
    memory = pd.DataFrame({"t_ms": (mem["t_ns"] - start_ns) / NS_PER_MS, "allocated_bytes": mem["allocated_bytes"]})
    return _timeline(f"recorded: rank {rank}, step {step}", spans, memory, step_ns / NS_PER_MS)


def _predicted(sim: SimResult, change: MemoryChange | None, recorded_ns: int, rank: int, step: int,
               name: str) -> Timeline:
    spans = pd.DataFrame({"unit": [s.unit for s in sim.spans], "phase": [s.phase for s in sim.spans],
                          "kind": [s.kind for s in sim.spans],
                          "x0_ms": [s.start / NS_PER_MS for s in sim.spans], "x1_ms": [s.end / NS_PER_MS for s in sim.spans]})
    memory = pd.DataFrame({"t_ms": [], "allocated_bytes": []})
    if change is not None and recorded_ns > 0:
        # the memory model's level over the recorded step, laid on the predicted step's time
        t, level = change.curve
        memory = pd.DataFrame({"t_ms": t * (sim.step_ns / recorded_ns) / NS_PER_MS, "allocated_bytes": level})
    return _timeline(f"predicted ({name}): rank {rank}, step {step}", spans, memory, sim.step_ns / NS_PER_MS)


def prepare(model: Model, prediction: Prediction) -> WhatifData:
    """The page's frames for ``prediction`` of ``model``'s recording."""
    i = representative(prediction)
    program = prediction.steps[i]
    recorded = _recorded(model, program.rank, program.step, program.start_ns, program.step_ns)
    change = prediction.memory[i] if i < len(prediction.memory) else None
    predicted = _predicted(prediction.simulated[i], change, program.step_ns, program.rank, program.step,
                           prediction.settings.describe())
    units = [u for u in model.recording.units]
    for frame in (recorded.segments, predicted.segments):
        units += [u for u in dict.fromkeys(frame["unit_name"]) if u not in units]
    if ROOT_UNIT in units:
        units.remove(ROOT_UNIT)
        units.insert(0, ROOT_UNIT)
    return WhatifData(recorded=recorded, predicted=predicted, rank=program.rank, step=program.step, units=units)
