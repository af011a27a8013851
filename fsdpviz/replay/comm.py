"""What a collective costs: fitted on the recorded ones, scaled to other sizes and world sizes.

Per kind (all-gather, reduce-scatter) a line ``time = latency + bytes / bandwidth`` is fitted
through the lower quartile of the recorded times at each size, and the typical time above the line
is kept beside it. On GPU that is a time per collective (*wait*, the median of the recorded times
above the line): the time a collective waited for the last rank to join, once per collective
whatever its size, so that fewer, larger collectives wait fewer times. On CPU it is a share of the
line's time (*wait_share*, the median share): on a shared host both ranks' threads are scheduled
around the collective for as long as it runs, and a wait per collective priced a merged unit's
collective as if it waited no longer than a block's (docs/whatif.md, "What moved the predictions": the
recorded parts do not tell the two readings apart, the bare runs do); and what the rarer, longer waits
take beyond that share, their mean per collective (*wait*), so that a merged unit's collective keeps
one such wait, not every member's (docs/whatif.md, "Long waits, one per collective"). Each step's first all-gather also holds the ranks meeting after the
optimizer step (``meeting``): it is left out of the line, and the program adds that meeting to the
first all-gather of a setting that regroups it (:func:`fsdpviz.replay.program.build`).

Where the recorded sizes cannot tell the two terms apart -- one size only, or a line whose slope or
latency comes out negative (a run of equal blocks and one root unit, whose gather at the step's start
also holds the ranks meeting there, fits no line through zero) -- the time at the most recorded size
is split as the stack's bare link splits its own time at that size where one is known
(:data:`NOMINAL_LINK`; CPU: gloo between the processes of one host), else it is all bandwidth. FSDP's host work
around its collectives (the gather's copy-in and call, its copy-out; on CPU the reduction's labels) is
fitted the same way; where such a line would be steeper than proportional it costs per call: on a small
unit it is the Python and the op dispatch, not the bytes.

Ring collectives move ``(N - 1) / N`` of the unsharded bytes through every rank's link and take
``N - 1`` latency steps, so a world size ``N`` scales the two terms from the recorded ``Nr``.
Past one host the bandwidth term runs at the inter-host bandwidth (when that is lower). On one rank a
collective costs nothing: there is no other rank to move bytes to or to wait for.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Final

import numpy as np

from fsdpviz.vocabulary import UNIT_COLLECTIVES

QUANTILE: Final = 0.25
# Defaults for a link between hosts, per rank (stated in every prediction that uses them).
DEFAULT_INTER_HOST_GBPS: Final = {"gpu": 25.0, "cpu": 1.25}  # GB/s: 200 Gb/s per GPU; 10 GbE per CPU host


@dataclass(frozen=True, slots=True)
class Link:
    """A bare link between the ranks of one host: one ring step's latency (ns) and the time per byte of a
    2-rank all-gather's unsharded bytes (ns per byte)."""

    latency_ns: float
    per_byte_ns: float

    def line(self, world_size: int) -> Line:
        """The line of a ring collective on ``world_size`` ranks over this link."""
        return Line(latency_ns=self.latency_ns * _ring_steps(world_size),
                    per_byte_ns=self.per_byte_ns * _ring_share(world_size) / _ring_share(2))


# Where the recording cannot tell a collective's latency from its bandwidth (fit), its time is split as
# this link splits its own at that size: gloo on one host, an all-gather of 2 ranks bare on 2 cores,
# 140 us up to 51 KB and 3.0 ms at 8 MB (benchmarks/bench_gloo_link.py, docs/whatif.md): as much time per
# call as per byte at about 390 KB. Its shape, not its speed: a training step's work on the same cores
# slows both terms, and the recorded time says by how much. A block's small gather is mostly the
# software's round trip, which a merged unit pays once; a large one is mostly bytes, which it pays in
# full. GPU stacks differ (NCCL's protocols, the link), so none is assumed there.
NOMINAL_LINK: Final = {"cpu": Link(latency_ns=140_000.0, per_byte_ns=(3.0e6 - 140_000.0) / 8e6)}


@dataclass(slots=True)
class Line:
    """``seconds = latency + bytes * per_byte`` at the recorded world size (ns, ns per byte)."""

    latency_ns: float
    per_byte_ns: float
    wait_ns: float = 0.0  # a time each collective adds above the line, beside its share
    n: int = 0  # collectives it was fitted on
    wait_share: float = 0.0  # the typical time above the line as a share of it, where it grows with the time
    # fitted on each step's first collective alone (fit's ``meeting``): ``wait_ns`` is then the meeting's
    met_only: bool = False

    def at(self, nbytes: float) -> float:
        return self.latency_ns + nbytes * self.per_byte_ns

    def typical(self, nbytes: float) -> float:
        """The typical time at ``nbytes``: the line and the typical time above it."""
        return self.above(self.at(nbytes))

    def above(self, line_ns: float) -> float:
        """A time on the line, with the typical time above it added."""
        return line_ns * (1.0 + self.wait_share) + self.wait_ns


@dataclass(frozen=True, slots=True)
class Target:
    """Where the collectives run in a prediction: ranks in the group, ranks per host, and the
    bandwidth between hosts (GB/s per rank; ``None``: the recorded bandwidth everywhere)."""

    world_size: int
    ranks_per_host: int
    inter_host_gbps: float | None = None


@dataclass(slots=True)
class CommModel:
    """Collective costs of one recording, and how they change with bytes and world size."""

    world_size: int
    ranks_per_host: int
    lines: dict[str, Line] = field(default_factory=dict)
    meeting_ns: float = 0.0
    """What a step's first all-gather takes beyond its line's typical time: the first collective after
    the optimizer step (:func:`fsdpviz.replay.program.meeting_ns`), added to the first all-gather of
    a setting whose first unit is not one recorded."""
    notes: list[str] = field(default_factory=list)
    """Where a line is not the least-squares fit of its sizes (one size, a slope or latency that would be
    negative: how its time was split, or host work taken as a cost per call), in words a prediction
    that resizes collectives repeats."""

    def time_ns(self, kind: str, nbytes: float, target: Target | None = None, *, in_step: bool = False) -> float:
        """A collective of ``kind`` moving ``nbytes`` (unsharded), its typical wait included;
        at the recorded world size unless ``target`` says otherwise. ``in_step``: one issued in mid-step,
        which does not wait for the ranks to meet: from a line fitted on each step's first collective
        alone (:attr:`Line.met_only`), without the wait per collective those held."""
        # a collective the recording has none of costs as an all-gather of its bytes; host work around
        # the collectives that the recording never timed (FSDP1 has no copy-out of its own) costs nothing
        line = self.lines.get(kind) or (self.lines.get("all_gather") if kind in UNIT_COLLECTIVES else None)
        if line is None:
            return 0.0
        n = target.world_size if target else self.world_size
        if n <= 1:  # one rank: nothing to move and nobody to wait for (FSDP2 does not even issue it)
            return 0.0
        nr = self.world_size
        lat = line.latency_ns * _ring_steps(n) / _ring_steps(nr)
        bw = nbytes * line.per_byte_ns * _ring_share(n) / _ring_share(nr)
        if target is not None and n > target.ranks_per_host and target.inter_host_gbps:
            across = nbytes * _ring_share(n) / target.inter_host_gbps  # GB/s = bytes per ns
            bw = max(bw, across)
        if in_step and line.met_only:
            return (lat + bw) * (1.0 + line.wait_share)
        return line.above(lat + bw)

    def scale(self, kind: str, nbytes: float, target: Target) -> float:
        """How much longer a recorded ``kind`` collective of ``nbytes`` takes under ``target``."""
        here = self.time_ns(kind, nbytes)
        there = self.time_ns(kind, nbytes, target)
        return there / here if here > 0 else 1.0


def _ring_steps(n: int) -> float:
    return max(1, n - 1)


def _ring_share(n: int) -> float:
    return (n - 1) / n if n > 1 else 1.0


def fit(samples: Iterable[tuple[str, int, float]], world_size: int, ranks_per_host: int,
        per_call: frozenset[str] = frozenset(), link: Link | None = None,
        meeting: Iterable[tuple[str, int, float]] = (), wait_in_proportion: bool = False) -> CommModel:
    """Fit per kind from ``(kind, bytes, ns)`` of the recorded collectives. ``per_call``: kinds of host
    work whose sizes, where they do not tell a slope, cost per call rather than per byte. ``link``:
    the stack's bare link (:data:`NOMINAL_LINK`), whose own split of its time at a size splits a
    collective's time where the sizes do not tell latency from bandwidth (None: all of it is bandwidth there). ``meeting``: collectives
    that also held the ranks meeting after the step's boundary (each step's first all-gather, which waits
    out the optimizer and data loading of the slowest rank): they are left out of the line and of the
    typical time above it (:attr:`CommModel.meeting_ns` carries what they take beyond it), unless their
    kind has no other sample. ``wait_in_proportion``: the typical time above the line is a share of the
    line's time (it grows with the collective's size, and so does the host work around it), the median
    share; what the rarer, longer waits take beyond it is a time per collective, their mean (else a wait
    per collective alone, the median)."""
    by_kind: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    for kind, nbytes, ns in samples:
        if nbytes > 0 and ns > 0:
            by_kind[kind][nbytes].append(ns)
    others = set(by_kind)
    for kind, nbytes, ns in meeting:
        if nbytes > 0 and ns > 0 and kind not in others:
            by_kind[kind][nbytes].append(ns)
    model = CommModel(world_size=world_size, ranks_per_host=ranks_per_host)
    for kind, sizes in by_kind.items():
        xs = np.array(sorted(sizes), dtype=np.float64)
        ys = np.array([np.quantile(sizes[int(x)], QUANTILE) for x in xs])
        fitted: tuple[float, float] | None = None
        if len(xs) >= 2 and xs[-1] > xs[0]:
            a, b = np.polyfit(xs, ys, 1)
            fitted = (float(a), float(b))
        if fitted is not None and fitted[0] > 0 and fitted[1] >= 0:
            slope, icept = fitted
        elif kind in per_call:  # host work of one size, no larger, or steeper than its bytes: per call
            if fitted is not None:
                told = (f"fitted slope {fitted[0]:.3g} ns/byte" if fitted[0] <= 0 else
                        f"the fitted line's latency is negative, {fitted[1] / 1e3:.1f} µs")
                model.notes.append(f"{kind}: its time does not grow in proportion to its bytes in the recording "
                                   f"({told}), so it is taken as a cost per call")
            slope, icept = 0.0, float(ys.mean())
        else:
            # the link is a 2-rank ring's; the line is at the recorded world size
            slope, icept = _unresolved(kind, sizes, fitted, None if link is None else link.line(world_size),
                                       model.notes)
        # a kind recorded only as each step's first collective (one root unit; ZeRO-3 under its default
        # bucket, the whole model at the root's fetch): what its times hold beyond their share is the ranks
        # meeting, which a collective in mid-step (another bucket's) does not wait for (time_ns's in_step)
        line = Line(latency_ns=icept, per_byte_ns=slope, n=sum(len(v) for v in sizes.values()),
                    met_only=kind not in others)
        if wait_in_proportion:  # a fitted or split line is positive at every recorded size
            shares = [ns / line.at(b) - 1.0 for b, values in sizes.items() for ns in values]
            line.wait_share = max(0.0, float(np.median(shares))) if shares else 0.0
            # A recorded unit's collectives replay as recorded, long waits and all; a merged unit's
            # are priced here. Without these waits' mean, merging would drop every member's long
            # waits, not one per collective it saves, and how much it saved would follow how the
            # profiler spread the waits: a spiky light load against a broad shared-core one.
            beyond = [ns - line.above(line.at(b)) for b, values in sizes.items() for ns in values]
            line.wait_ns = max(0.0, float(np.mean(beyond))) if beyond else 0.0
        else:
            above = [ns - line.at(b) for b, values in sizes.items() for ns in values]
            line.wait_ns = max(0.0, float(np.median(above))) if above else 0.0
        model.lines[kind] = line
    return model


def _unresolved(kind: str, sizes: dict[int, list[float]], fitted: tuple[float, float] | None,
                link: Line | None, notes: list[str]) -> tuple[float, float]:
    """(per byte, latency) of a collective whose recorded sizes do not tell latency from bandwidth: its
    time at the most recorded size (the larger of two as common), split as the bare ``link`` (latency,
    per byte, at the recorded world size) splits its own time at that size; all bandwidth without a
    link. Said in ``notes``."""
    nbytes = max(sizes, key=lambda b: (len(sizes[b]), b))
    ns = float(np.quantile(sizes[nbytes], QUANTILE))
    why = ("one size only" if fitted is None else
           f"the fitted slope is {fitted[0]:.3g} ns/byte" if fitted[0] <= 0 else
           f"the fitted latency is {fitted[1] / 1e3:.1f} µs")
    if link is not None:
        bare_ns = link.at(nbytes)
        notes.append(f"{kind}: its recorded sizes do not tell latency from bandwidth ({why}), so its "
                     f"{ns / 1e3:.1f} µs at {nbytes} bytes is split as the bare link splits its own "
                     f"{bare_ns / 1e3:.1f} µs there: {link.latency_ns / bare_ns:.0%} latency, the rest bandwidth")
        return ns / bare_ns * link.per_byte_ns, ns / bare_ns * link.latency_ns
    notes.append(f"{kind}: its recorded sizes do not tell latency from bandwidth ({why}), so all of its time "
                 "is taken as bandwidth, in proportion to its bytes")
    return ns / nbytes, 0.0
