"""Where the replay reduces gradients: where the step's trace shows each unit reduced.

Steps written as the recorder reads them, with two micro-batches: the reductions each micro-batch
holds are known by construction, so the replayed program must run exactly those. Gradient
accumulation without sync (FSDP2's ``set_requires_gradient_sync(False)``, FSDP1's ``no_sync()``)
reduces in the last micro-batch only; a step whose trace holds no reduction at all (a profiler stepped
once per micro-batch) reduces nothing; micro-batches are named by their number in the step, not by
their place in the list. (A unit left out of a micro-batch's sync on its own, FSDP2's
``set_requires_gradient_sync(False, recurse=False)`` on some modules, is not told apart: in a
micro-batch that synced, every unit the recording reduces reduces.)
"""

from __future__ import annotations

from fsdpviz.replay import program as prog
from fsdpviz.replay.model import costs_of
from fsdpviz.replay.recorded import Gather, MicroBatch, Pass, Recording, Reduce, Segment, StepProgram
from fsdpviz.replay.settings import Settings, Wrap
from fsdpviz.vocabulary import BACKWARD, FORWARD, FSDP2

UNITS = ["blocks.0", "blocks.1", "blocks.2"]
BYTES = 1_000_000


def _micro(micro: int) -> MicroBatch:
    forward = [Pass(unit=u, phase=FORWARD, micro=micro, part="", gap_ns=10_000.0, pre_ns=20_000.0,
                    compute_ns=500_000.0, post_ns=20_000.0) for u in UNITS]
    backward = [Pass(unit=u, phase=BACKWARD, micro=micro, part="", gap_ns=10_000.0, pre_ns=20_000.0,
                     compute_ns=1_000_000.0, post_ns=30_000.0) for u in reversed(UNITS)]
    return MicroBatch(pre=Segment(busy_ns=100_000.0), forward=forward, mid=Segment(busy_ns=50_000.0),
                      backward=backward, micro=micro)


def _step(index: int, micros: list[int], reduced: dict[int, list[str]]) -> StepProgram:
    """A step of ``micros`` whose micro-batch m reduced the units ``reduced[m]``."""
    gathers = [Gather(unit=u, phase=phase, micro=m, bytes=BYTES, host_ns=30_000.0, copy_in_ns=0.0,
                      comm_ns=200_000.0, copy_out_host_ns=20_000.0, copy_out_ns=0.0)
               for m in micros for phase in (FORWARD, BACKWARD) for u in UNITS]
    reduces = [Reduce(unit=u, micro=m, bytes=BYTES, comm_ns=300_000.0) for m, us in reduced.items() for u in us]
    return StepProgram(rank=0, step=index, step_ns=0, micro=[_micro(m) for m in micros],
                       post=Segment(busy_ns=1_000_000.0), gathers=gathers, reduces=reduces)


def _recording(steps: list[StepProgram]) -> Recording:
    return Recording(framework=FSDP2, device="cpu", world_size=2, units=list(UNITS),
                     unit_bytes=dict.fromkeys(UNITS, BYTES), modules={u: [u] for u in UNITS},
                     reshard_after_forward=dict.fromkeys(UNITS, True), prefetch="none", ranks_per_host=2,
                     cpu_count=2, steps=steps)


def _reduced(rec: Recording, step: StepProgram, settings: Settings | None = None) -> list[tuple[int, str]]:
    """(micro-batch, unit) of each reduction the replayed program runs, in order."""
    comm, gathers = costs_of(rec)
    program = prog.build(rec, step, settings or Settings(), comm, gathers)
    out, micro, at = [], -1, 0
    for op in program.ops:
        if isinstance(op, prog.SegmentOp) and op.name == "pre":
            micro, at = step.micro[at].micro, at + 1
        elif isinstance(op, prog.ReduceOp):
            out.append((micro, program.reduces[op.rid].unit))
    return out


def test_micro_batches_without_sync_reduce_nothing() -> None:
    last_only = _step(2, [0, 1], {1: list(reversed(UNITS))})
    every = _step(3, [0, 1], {0: list(reversed(UNITS)), 1: list(reversed(UNITS))})
    rec = _recording([last_only, every])
    assert _reduced(rec, last_only) == [(1, u) for u in reversed(UNITS)]
    assert _reduced(rec, every) == [(m, u) for m in (0, 1) for u in reversed(UNITS)]
    # merged, a unit reduces once where its members did
    assert _reduced(rec, last_only, Settings().with_(wrap=Wrap("root"))) == [(1, "(root)")]


def test_a_step_that_reduced_nothing_reduces_nothing() -> None:
    quiet = _step(2, [0, 1], {})
    rec = _recording([quiet, _step(3, [0, 1], {1: list(reversed(UNITS))})])
    assert _reduced(rec, quiet) == []


def test_micro_batches_are_named_by_their_number() -> None:
    """A step whose windows hold micro-batches 1 and 2 (the first one's cut off): the reductions the
    trace put in micro-batch 2 are replayed there."""
    late = _step(2, [1, 2], {2: list(reversed(UNITS))})
    assert _reduced(_recording([late]), late) == [(2, u) for u in reversed(UNITS)]


def test_a_reduction_the_attribution_missed_is_kept() -> None:
    """Micro-batch 1 synced, and the trace gave two of the three units a reduction there: the third,
    which the recording reduces in its other steps, reduces there too (missed, not skipped: FSDP syncs
    every unit of a micro-batch or none)."""
    step = _step(2, [0, 1], {1: ["blocks.2", "blocks.0"]})
    rec = _recording([step, _step(3, [0, 1], {1: list(reversed(UNITS))})])
    assert _reduced(rec, step) == [(1, u) for u in reversed(UNITS)]
