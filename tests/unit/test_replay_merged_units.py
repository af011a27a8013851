"""Merged units on a CPU recording whose costs are known by construction.

A world of six blocks on two gloo ranks, every cost known: each collective and each piece of FSDP's
host work around it takes a per-call time plus a time per byte; each unit runs FSDP's hooks and the
hook dispatch at its boundary (the gap before its window) once per pass, and each block its own code
before its first op in every pass, whatever the wrap; a step's first all-gather also
waits ``MEETING`` for the ranks to meet after the optimizer step. The per-block run is written as the
recorder would read it, and the root and pair runs of the same world are summed by hand: on CPU the
training thread waits out every collective, so a step is the sum of its parts. Merged, a unit pays
its hooks, its boundary gap, its reduction's host work and the meeting once, and its collectives at its
summed bytes; a model that kept its members' reductions or gaps, dropped their own code with FSDP's
hooks, or lost the meeting, misses the truth by that cost.
"""

from __future__ import annotations

import dataclasses

import pytest

from fsdpviz.replay import program as prog
from fsdpviz.replay.model import costs_of
from fsdpviz.replay.recorded import Gather, MicroBatch, Pass, Recording, Reduce, Segment, StepProgram
from fsdpviz.replay.settings import Settings, Wrap
from fsdpviz.replay.simulate import run
from fsdpviz.vocabulary import BACKWARD, FORWARD, FSDP2

SIZES = [1_000_000, 2_000_000] * 3  # bytes of blocks.0 .. blocks.5: two sizes, so that every line is told
UNITS = [f"blocks.{i}" for i in range(len(SIZES))]
BYTES = dict(zip(UNITS, SIZES))
MEETING = 2_000_000.0  # ns the step's first all-gather waits for the other rank

# (per call, per byte) in ns: the collectives and FSDP's host work around them
ALL_GATHER, REDUCE_SCATTER = (150_000.0, 0.5), (200_000.0, 0.8)
GATHER_HOST, COPY_OUT_HOST, REDUCE_HOST = (30_000.0, 0.01), (20_000.0, 0.02), (80_000.0, 0.05)
# per unit and pass: FSDP's hook dispatch before its window, its pre- and post- hooks
GAP, PRE_FORWARD, POST_FORWARD, PRE_BACKWARD, POST_BACKWARD = 15_000.0, 40_000.0, 25_000.0, 35_000.0, 30_000.0
# per block and pass: its own code between FSDP's pre-hook and its first op (runs merged or not)
OWN_FORWARD, OWN_BACKWARD = 7_000.0, 11_000.0
DATA, LOSS, OPTIMIZER = 500_000.0, 300_000.0, 3_000_000.0


def cost(kind: tuple[float, float], nbytes: int) -> float:
    return kind[0] + kind[1] * nbytes


def forward_ns(nbytes: int) -> float:
    return 1_000_000.0 + 0.3 * nbytes  # the model's own compute: whatever the wrap, the same ops


def backward_ns(nbytes: int) -> float:
    return 2 * forward_ns(nbytes)


def gather(unit: str, phase: str, first: bool = False) -> Gather:
    n = BYTES[unit]
    return Gather(unit=unit, phase=phase, micro=0, bytes=n, host_ns=cost(GATHER_HOST, n), copy_in_ns=0.0,
                  comm_ns=cost(ALL_GATHER, n) + (MEETING if first else 0.0),
                  copy_out_host_ns=cost(COPY_OUT_HOST, n), copy_out_ns=0.0)


def per_block_recording(steps: int = 3, frozen: frozenset[str] = frozenset(), device: str = "cpu",
                        meetings: dict[int, list[float]] | None = None) -> Recording:
    """The per-block run as the recorder reads it: every unit gathered in its own passes; ``frozen``
    units have no gradients to reduce; ``meetings``: per rank, each step's meeting (else ``MEETING``
    on rank 0's steps)."""
    def reduced(u: str) -> float:
        return 0.0 if u in frozen else cost(REDUCE_HOST, BYTES[u])

    def step(i: int, rank: int = 0, meeting: float = MEETING) -> StepProgram:
        forward = [Pass(unit=u, phase=FORWARD, micro=0, part="", gap_ns=GAP, pre_ns=PRE_FORWARD + OWN_FORWARD,
                        pre_framework_ns=PRE_FORWARD, compute_ns=forward_ns(BYTES[u]), post_ns=POST_FORWARD, post_framework_ns=POST_FORWARD)
                   for u in UNITS]
        backward = [Pass(unit=u, phase=BACKWARD, micro=0, part="", gap_ns=GAP, pre_ns=PRE_BACKWARD + OWN_BACKWARD,
                         pre_framework_ns=PRE_BACKWARD, compute_ns=backward_ns(BYTES[u]), post_ns=POST_BACKWARD + reduced(u),
                         post_framework_ns=POST_BACKWARD, reduce_host_ns=reduced(u))
                    for u in reversed(UNITS)]
        gathers = [gather(u, FORWARD, first=j == 0) for j, u in enumerate(UNITS)]
        gathers[0].comm_ns += meeting - MEETING
        gathers += [gather(u, BACKWARD) for u in reversed(UNITS)]
        reduces = [Reduce(unit=u, micro=0, bytes=BYTES[u], comm_ns=cost(REDUCE_SCATTER, BYTES[u]),
                          host_ns=reduced(u)) for u in reversed(UNITS) if u not in frozen]
        return StepProgram(rank=rank, step=i, step_ns=0, micro=[MicroBatch(
            pre=Segment(busy_ns=DATA), forward=forward, mid=Segment(busy_ns=LOSS), backward=backward)],
            post=Segment(busy_ns=OPTIMIZER), gathers=gathers, reduces=reduces)
    per_rank = meetings or {0: [MEETING] * steps}
    return Recording(framework=FSDP2, device=device, world_size=2, units=list(UNITS), unit_bytes=dict(BYTES),
                     modules={u: [u] for u in UNITS}, reshard_after_forward=dict.fromkeys(UNITS, True),
                     prefetch="none", ranks_per_host=2, cpu_count=2,
                     steps=[step(2 + i, rank, m) for rank, ms in per_rank.items() for i, m in enumerate(ms)])


def step_of(groups: list[list[str]], reshard_last: bool = True, frozen: frozenset[str] = frozenset(),
            copy_out: bool = True) -> float:
    """The world's step with ``groups`` as its units (each gathered whole, in its own passes), summed:
    every unit pays its gap and hooks once per pass (every block its own code), its collectives and
    their host work at its bytes; a unit of ``frozen`` members only reduces nothing; without
    ``copy_out`` no gather copies out."""
    def gathered(n: int) -> float:
        return cost(GATHER_HOST, n) + cost(ALL_GATHER, n) + (cost(COPY_OUT_HOST, n) if copy_out else 0.0)
    total = DATA + LOSS + OPTIMIZER + MEETING
    for i, group in enumerate(groups):
        n = sum(BYTES[u] for u in group)
        again = reshard_last or i < len(groups) - 1  # gathered again for backward
        total += GAP + PRE_FORWARD + gathered(n) + sum(forward_ns(BYTES[u]) for u in group) + POST_FORWARD
        total += GAP + PRE_BACKWARD + (gathered(n) if again else 0.0) + sum(backward_ns(BYTES[u]) for u in group)
        total += len(group) * (OWN_FORWARD + OWN_BACKWARD)
        total += POST_BACKWARD
        if not set(group) <= frozen:
            total += cost(REDUCE_HOST, n) + cost(REDUCE_SCATTER, n)
    return total


def simulated(rec: Recording, settings: Settings) -> float:
    comm, gathers = costs_of(rec)
    [step_ns] = {run(prog.build(rec, s, settings, comm, gathers), False).step_ns for s in rec.steps}
    return step_ns


def busy(rec: Recording, settings: Settings, what: str) -> float:
    """The host's busy time of one kind (``gap``, ``post``) in the program of the recording's first step."""
    comm, gathers = costs_of(rec)
    program = prog.build(rec, rec.steps[0], settings, comm, gathers)
    return sum(op.ns for op in program.ops if isinstance(op, prog.BusyOp) and op.what == what)


def test_the_world_replays_as_summed() -> None:
    """The recording holds what the world does: its replay is the per-block sum."""
    rec = per_block_recording()
    assert simulated(rec, Settings(prefetch="recorded")) == pytest.approx(step_of([[u] for u in UNITS]), rel=1e-9)


def test_the_fit_reads_the_world_and_leaves_the_meeting_out_of_the_line() -> None:
    """Two sizes tell every line; the first gather's meeting would have bent the all-gather's (its size
    is the small one), and nothing lies above a line in this world."""
    comm, _ = costs_of(per_block_recording())
    for kind, truth in (("all_gather", ALL_GATHER), ("reduce_scatter", REDUCE_SCATTER),
                        (prog.GATHER_HOST, GATHER_HOST), (prog.COPY_OUT_HOST, COPY_OUT_HOST),
                        (prog.REDUCE_HOST, REDUCE_HOST)):
        line = comm.lines[kind]
        assert (line.latency_ns, line.per_byte_ns) == pytest.approx(truth, rel=1e-6), kind
        assert line.wait_ns == pytest.approx(0.0, abs=1e-6) and line.wait_share == pytest.approx(0.0, abs=1e-9), kind


@pytest.mark.parametrize(("wrap", "groups"), [
    (Wrap("root"), [UNITS]),
    (Wrap("merge", k=2), [UNITS[i:i + 2] for i in range(0, len(UNITS), 2)]),
    (Wrap("merge", k=3), [UNITS[i:i + 3] for i in range(0, len(UNITS), 3)]),
], ids=["root", "merge:2", "merge:3"])
def test_a_merged_unit_pays_its_hooks_gaps_reduction_and_meeting_once(wrap: Wrap, groups: list[list[str]]) -> None:
    rec = per_block_recording()
    truth = step_of(groups, reshard_last=wrap.kind != "root")  # FSDP2 keeps a root unit's parameters
    assert simulated(rec, Settings(wrap=wrap)) == pytest.approx(truth, rel=1e-9)


@pytest.mark.parametrize("wrap", [Wrap("merge", k=2), Wrap("root")], ids=["merge:2", "root"])
def test_host_work_the_recording_never_timed_costs_nothing_merged(wrap: Wrap) -> None:
    """FSDP1's all-gather writes into the unit's flat parameter: its trace holds no copy-out of its own
    (0 ns for every gather). Merged, a unit copies out nothing either. Priced by the all-gather's line
    instead, a 4-rank FSDP1 recording's pairs gained 7 ms of copy-out per gather and were predicted
    8 % slower than the blocks they merge."""
    rec = per_block_recording()
    for s in rec.steps:
        for g in s.gathers:
            g.copy_out_host_ns = 0.0
    groups = [UNITS] if wrap.kind == "root" else [UNITS[i:i + 2] for i in range(0, len(UNITS), 2)]
    truth = step_of(groups, reshard_last=wrap.kind != "root", copy_out=False)
    assert simulated(rec, Settings(wrap=wrap)) == pytest.approx(truth, rel=1e-9)


def test_members_without_gradients_reduce_nothing() -> None:
    """Frozen blocks record no reduction: merged in pairs, the frozen pair pays no reduction's host work
    (nor a reduce-scatter), the others theirs once."""
    frozen = frozenset(UNITS[4:])
    rec = per_block_recording(frozen=frozen)
    groups = [UNITS[i:i + 2] for i in range(0, len(UNITS), 2)]
    assert simulated(rec, Settings(wrap=Wrap("merge", k=2))) == pytest.approx(step_of(groups, frozen=frozen), rel=1e-9)


def test_the_meeting_is_the_least_of_the_ranks_medians() -> None:
    """Rank 0 meets 1, 1 and 3 ms after the optimizer step, rank 1 0.5, 4 and 0.5 ms: rank 1's lead
    in a slow step is the other's load, not the first gather's own time, and the least median is kept."""
    rec = per_block_recording(meetings={0: [1e6, 1e6, 3e6], 1: [0.5e6, 4e6, 0.5e6]})
    comm, _ = costs_of(rec)
    assert comm.meeting_ns == pytest.approx(0.5e6, rel=1e-6)


def test_on_gpu_members_keep_their_gaps_and_reductions_host_work() -> None:
    """On GPU the host runs ahead of the device, and dropping either moved the shared H200 recordings'
    root and pairs away from their bare runs: a merged unit keeps its members' boundary gaps and
    reductions' host work, where on CPU it drops them."""
    root = Settings(wrap=Wrap("root"))
    members = sum(cost(REDUCE_HOST, n) for n in SIZES)
    gpu, cpu = per_block_recording(device="gpu"), per_block_recording()
    assert busy(gpu, root, "gap") == pytest.approx(2 * len(UNITS) * GAP)
    assert busy(cpu, root, "gap") == pytest.approx(2 * GAP)
    assert busy(gpu, root, "post") == pytest.approx(POST_FORWARD + POST_BACKWARD + members)
    assert busy(cpu, root, "post") == pytest.approx(POST_FORWARD + POST_BACKWARD + cost(REDUCE_HOST, sum(SIZES)))


def test_a_unit_run_twice_in_a_row_keeps_both_gaps() -> None:
    """A block called twice in a row (weights shared by two layers) is one unit with two passes; the
    second's gap is a module call of its own, not a boundary inside a merged unit."""
    rec = per_block_recording()
    for s in rec.steps:
        forward = s.micro[0].forward
        forward.insert(1, dataclasses.replace(forward[0]))
    assert busy(rec, Settings(prefetch="recorded"), "gap") == pytest.approx((2 * len(UNITS) + 1) * GAP)
