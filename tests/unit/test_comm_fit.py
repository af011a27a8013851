"""The collective model's line (``fsdpviz.replay.comm.fit``) on samples whose answer is known by construction.

Every sample is drawn from a known link -- ``latency + bytes / bandwidth`` -- plus, where the case
needs it, the wait of a unit that gathers at the step's start (the ranks meet there). The fit must
recover the link where the sizes tell it, and say, in a note, how it split the time where they do not.
"""

from __future__ import annotations

import pytest

from fsdpviz.replay.comm import NOMINAL_LATENCY_NS, fit

BLOCK, ROOT, WIDE = 50_816, 69_888, 400_000  # bytes: eight equal blocks and one root unit, as the example's
LATENCY_NS, GBPS = NOMINAL_LATENCY_NS["cpu"], 3.0  # the link every sample is drawn from: gloo's latency


def link_ns(nbytes: int, latency_ns: float = LATENCY_NS, gbps: float = GBPS) -> float:
    return latency_ns + nbytes / gbps


def samples(kind: str, sizes: dict[int, float], per_step: int = 6) -> list[tuple[str, int, float]]:
    """Each size's samples at its time (equal: the fit reads their lower quartile), ``per_step`` steps of
    them: eight blocks' worth of the block size, one unit's of every other."""
    return [(kind, nbytes, ns) for nbytes, ns in sizes.items() for _ in range(per_step * (8 if nbytes == BLOCK else 1))]


def test_three_sizes_recover_the_link() -> None:
    model = fit(samples("all_gather", {n: link_ns(n) for n in (BLOCK, ROOT, WIDE)}), 2, 2,
                latency_ns=NOMINAL_LATENCY_NS["cpu"])
    line = model.lines["all_gather"]
    assert line.latency_ns == pytest.approx(LATENCY_NS, rel=1e-6)
    assert line.per_byte_ns == pytest.approx(1 / GBPS, rel=1e-6)
    assert line.wait_ns == pytest.approx(0.0, abs=1e-3) and not model.notes


def test_a_root_that_waits_at_the_step_start_does_not_make_the_link_slow() -> None:
    """Blocks at the link's time and a root unit 300 us later (it meets the other ranks): the line
    through the two sizes would read 20x the link's cost per byte and a negative latency. With the
    nominal CPU latency, the blocks' time is split at it: the link is recovered."""
    recorded = {BLOCK: link_ns(BLOCK), ROOT: link_ns(ROOT) + 300_000.0}
    model = fit(samples("all_gather", recorded), 2, 2, latency_ns=NOMINAL_LATENCY_NS["cpu"])
    line = model.lines["all_gather"]
    through_both = (recorded[ROOT] - recorded[BLOCK]) / (ROOT - BLOCK)
    assert through_both > 20 / GBPS  # what the line through the two points would have said
    assert line.latency_ns == pytest.approx(LATENCY_NS) and line.per_byte_ns == pytest.approx(1 / GBPS)
    # one root unit of everything costs about one latency and its bytes, not nine gathers' latencies
    assert line.at(8 * BLOCK + ROOT) < 2 * recorded[BLOCK]
    [note] = model.notes
    assert note.startswith("all_gather: its recorded sizes do not tell latency from bandwidth (the fitted latency is -")
    assert "the nominal 140 µs" in note


def test_a_time_below_the_nominal_latency_is_all_latency() -> None:
    """Blocks faster than the nominal latency: no negative bandwidth, the whole time is latency."""
    recorded = {BLOCK: 100_000.0, ROOT: 100_000.0 + 300_000.0}
    model = fit(samples("all_gather", recorded), 2, 2, latency_ns=NOMINAL_LATENCY_NS["cpu"])
    line = model.lines["all_gather"]
    assert line.latency_ns == pytest.approx(100_000.0) and line.per_byte_ns == 0.0


def test_without_a_nominal_link_two_sizes_keep_their_line() -> None:
    """GPU links differ tenfold, so none is assumed: two sizes that fit a line with a positive latency
    keep it (the shared H100 and H200 recordings are predicted on such lines)."""
    recorded = {BLOCK: link_ns(BLOCK, gbps=100.0), WIDE: link_ns(WIDE, gbps=100.0)}
    model = fit(samples("all_gather", recorded), 8, 8, latency_ns=None)
    line = model.lines["all_gather"]
    assert line.per_byte_ns == pytest.approx(1 / 100.0, rel=1e-6)
    assert line.latency_ns == pytest.approx(LATENCY_NS, rel=1e-6) and not model.notes


def test_one_size_without_a_nominal_link_is_all_bandwidth() -> None:
    model = fit(samples("reduce_scatter", {BLOCK: link_ns(BLOCK)}), 8, 8, latency_ns=None)
    line = model.lines["reduce_scatter"]
    assert line.latency_ns == 0.0 and line.per_byte_ns == pytest.approx(link_ns(BLOCK) / BLOCK)


def test_a_negative_latency_without_a_nominal_link_is_the_blocks_time_as_bandwidth() -> None:
    """No latency held at 0 under a slope that no link runs: the blocks' own time, as bandwidth."""
    recorded = {BLOCK: link_ns(BLOCK), ROOT: link_ns(ROOT) + 300_000.0}
    model = fit(samples("all_gather", recorded), 8, 8, latency_ns=None)
    line = model.lines["all_gather"]
    assert line.latency_ns == 0.0 and line.at(BLOCK) == pytest.approx(recorded[BLOCK])
    [note] = model.notes
    assert "the fitted latency is -" in note and "all of its time is taken as bandwidth" in note


@pytest.mark.parametrize("root_extra_ns", [-20_000.0, 80_000.0])
def test_host_work_that_bytes_do_not_explain_costs_per_call(root_extra_ns: float) -> None:
    """The copy-in's host work: 190 us per block, the root's less (a slope below zero) or far more than
    its extra bytes could take (a negative latency). Either way it is a cost per call: the mean of the
    two sizes' times, whatever the bytes."""
    recorded = {BLOCK: 190_000.0, ROOT: 190_000.0 + root_extra_ns}
    model = fit(samples("gather_host", recorded), 2, 2, per_call=frozenset({"gather_host"}),
                latency_ns=NOMINAL_LATENCY_NS["cpu"])
    line = model.lines["gather_host"]
    assert line.per_byte_ns == 0.0
    assert line.latency_ns == pytest.approx((recorded[BLOCK] + recorded[ROOT]) / 2)
    assert line.at(9 * BLOCK) == line.at(BLOCK)
    [note] = model.notes
    assert "taken as a cost per call" in note
