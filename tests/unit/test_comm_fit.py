"""The collective model's line (``fsdpviz.replay.comm.fit``) on samples whose answer is known by construction.

Every sample is drawn from a known link -- ``latency + bytes / bandwidth`` -- plus, where the case
needs it, the extra time of a root unit that gathers at the step's start (the ranks meet there). The
link is not the nominal one the fit falls back on: where the sizes tell the link, the fit must recover
it; where they do not, the fit's prediction for merged units must stay near the link's, and a note
must say how the time was split.
"""

from __future__ import annotations

import pytest

from fsdpviz.replay.comm import NOMINAL_LINK, Target, fit

BLOCK, ROOT, WIDE = 50_816, 69_888, 400_000  # bytes: eight equal blocks and one root unit, as the example's
LATENCY_NS, GBPS = 160_000.0, 2.7  # the link every sample is drawn from: gloo's bare median, 2 ranks on 2 cores
NOMINAL = NOMINAL_LINK["cpu"]


def link_ns(nbytes: int, latency_ns: float = LATENCY_NS, gbps: float = GBPS) -> float:
    return latency_ns + nbytes / gbps


def samples(kind: str, sizes: dict[int, float], per_step: int = 6) -> list[tuple[str, int, float]]:
    """Each size's samples at its time (equal: the fit reads their lower quartile), ``per_step`` steps of
    them: eight blocks' worth of the block size, one unit's of every other."""
    return [(kind, nbytes, ns) for nbytes, ns in sizes.items() for _ in range(per_step * (8 if nbytes == BLOCK else 1))]


def test_three_sizes_recover_the_link_whatever_the_nominal_one() -> None:
    model = fit(samples("all_gather", {n: link_ns(n) for n in (BLOCK, ROOT, WIDE)}), 2, 2, link=NOMINAL)
    line = model.lines["all_gather"]
    assert line.latency_ns == pytest.approx(LATENCY_NS, rel=1e-6)
    assert line.per_byte_ns == pytest.approx(1 / GBPS, rel=1e-6)
    assert line.wait_ns == pytest.approx(0.0, abs=1e-3) and not model.notes


def test_a_root_that_waits_at_the_step_start_does_not_make_the_link_slow() -> None:
    """Blocks at the link's time and a root unit 300 us later (it meets the other ranks): the line
    through the two sizes reads 40x the link's cost per byte and a negative latency, and would price
    one unit of the whole model at 9x what the link takes. Split as the nominal link splits its own
    time at a block's size (140 us and 2.8 GB/s; the link's 160 us and 2.7), the blocks' time prices
    it within 1.1x of the link."""
    recorded = {BLOCK: link_ns(BLOCK), ROOT: link_ns(ROOT) + 300_000.0}
    model = fit(samples("all_gather", recorded), 2, 2, link=NOMINAL)
    line = model.lines["all_gather"]
    through_both = (recorded[ROOT] - recorded[BLOCK]) / (ROOT - BLOCK)
    whole = 8 * BLOCK + ROOT
    assert through_both > 40 / GBPS and through_both * whole > 9 * link_ns(whole)
    assert line.at(BLOCK) == pytest.approx(recorded[BLOCK])  # the blocks keep their own time
    assert link_ns(whole) < line.at(whole) < 1.1 * link_ns(whole)
    [note] = model.notes
    assert note.startswith("all_gather: its recorded sizes do not tell latency from bandwidth (the fitted latency is -")
    bare = NOMINAL.latency_ns + BLOCK * NOMINAL.per_byte_ns
    assert f"split as the bare link splits its own {bare / 1e3:.1f} µs there: 89% latency" in note


@pytest.mark.parametrize("slower", [1.0, 2.5, 6.0])
@pytest.mark.parametrize(("nbytes", "members"), [(BLOCK, 8), (3_200_000, 4)])
def test_one_size_prices_a_merged_unit_as_the_link_slowed_by_the_step(slower: float, nbytes: int,
                                                                      members: int) -> None:
    """One size, drawn from the link with both its terms slowed alike (a step's work on the same cores:
    the software's round trip waits for a core as the copies do). A small block's time is mostly the
    round trip, a 3.2 MB one's mostly bytes; a unit of ``members`` blocks, one collective, is priced
    within 10 % of what the slowed link takes for its bytes. Taking the nominal latency as all the round
    trip there is and the rest as bytes would price eight small blocks' unit at 3.3x it, slowed 2.5x."""
    recorded = {nbytes: slower * link_ns(nbytes)}
    line = fit(samples("all_gather", recorded), 2, 2, link=NOMINAL).lines["all_gather"]
    merged = members * nbytes
    assert line.at(nbytes) == pytest.approx(recorded[nbytes])
    assert line.at(merged) == pytest.approx(slower * link_ns(merged), rel=0.10)


def test_the_nominal_link_is_split_as_a_ring_of_the_recorded_ranks() -> None:
    """Four ranks take three ring steps and move 3/4 of the bytes through each link (two ranks: one step,
    half): the recorded time is split as the nominal link on four ranks splits its own, so that the same
    block predicted on two ranks costs what the nominal link's two-rank split of it says."""
    recorded = {BLOCK: link_ns(BLOCK, latency_ns=3 * LATENCY_NS)}
    model = fit(samples("all_gather", recorded), 4, 4, link=NOMINAL)
    line = model.lines["all_gather"]
    lat4, byte4 = 3 * NOMINAL.latency_ns, NOMINAL.per_byte_ns * 1.5
    assert line.latency_ns / line.per_byte_ns == pytest.approx(lat4 / byte4)
    k = recorded[BLOCK] / (lat4 + BLOCK * byte4)
    on_two = model.time_ns("all_gather", BLOCK, Target(world_size=2, ranks_per_host=2))
    assert on_two == pytest.approx(k * (NOMINAL.latency_ns + BLOCK * NOMINAL.per_byte_ns))


def test_a_time_below_the_nominal_link_is_split_the_same_way_and_says_so() -> None:
    """Blocks faster than the nominal link (a faster host): no negative bandwidth, both terms shorter."""
    recorded = {BLOCK: 100_000.0}
    model = fit(samples("all_gather", recorded), 2, 2, link=NOMINAL)
    line = model.lines["all_gather"]
    assert line.at(BLOCK) == pytest.approx(100_000.0)
    assert 0 < line.latency_ns < NOMINAL.latency_ns and 0 < line.per_byte_ns < NOMINAL.per_byte_ns
    [note] = model.notes
    assert "one size only" in note and "89% latency, the rest bandwidth" in note


def test_without_a_nominal_latency_two_sizes_keep_their_line() -> None:
    """GPU stacks differ, so no latency is assumed: two sizes that fit a line with a positive latency
    keep it (the shared H100 and H200 recordings are predicted on such lines)."""
    recorded = {BLOCK: link_ns(BLOCK, gbps=100.0), WIDE: link_ns(WIDE, gbps=100.0)}
    model = fit(samples("all_gather", recorded), 8, 8, link=None)
    line = model.lines["all_gather"]
    assert line.per_byte_ns == pytest.approx(1 / 100.0, rel=1e-6)
    assert line.latency_ns == pytest.approx(LATENCY_NS, rel=1e-6) and not model.notes


@pytest.mark.parametrize("sizes", [{BLOCK: link_ns(BLOCK)},  # one size
                                   {BLOCK: link_ns(BLOCK), ROOT: link_ns(ROOT) + 300_000.0},  # negative latency
                                   {BLOCK: link_ns(BLOCK), ROOT: link_ns(BLOCK) - 50_000.0}])  # negative slope
def test_without_a_nominal_latency_an_unresolved_line_is_the_blocks_time_as_bandwidth(sizes: dict[int, float]) -> None:
    """No latency held at 0 under a slope that no link runs: the blocks' own time, as bandwidth, said."""
    model = fit(samples("reduce_scatter", sizes), 8, 8, link=None)
    line = model.lines["reduce_scatter"]
    assert line.latency_ns == 0.0 and line.at(BLOCK) == pytest.approx(sizes[BLOCK])
    [note] = model.notes
    assert "all of its time is taken as bandwidth" in note


@pytest.mark.parametrize("root_ns", [None, 170_000.0, 270_000.0])
def test_host_work_that_bytes_do_not_explain_costs_per_call(root_ns: float | None) -> None:
    """The copy-in's host work: 190 us per block, and the root's the same (one size), less (a slope below
    zero) or far more than its extra bytes could take (a negative latency). Each is a cost per call:
    a merged unit of all of them pays one call's time, within the two sizes' times, not nine."""
    recorded = {BLOCK: 190_000.0} if root_ns is None else {BLOCK: 190_000.0, ROOT: root_ns}
    model = fit(samples("gather_host", recorded), 2, 2, per_call=frozenset({"gather_host"}), link=NOMINAL)
    line = model.lines["gather_host"]
    assert line.per_byte_ns == 0.0
    assert min(recorded.values()) <= line.at(8 * BLOCK + ROOT) <= max(recorded.values())
    assert len(model.notes) == (0 if root_ns is None else 1)
    assert all("taken as a cost per call" in n for n in model.notes)


def test_on_cpu_the_time_above_the_line_grows_with_the_collective() -> None:
    """Every size's samples spread in proportion to their time (a shared 2-core host stretches a
    collective by a share of its length: 7 % at 559 KB, 40 % at 3.2 MB on the example trainer's blocks).
    In proportion, a unit of four blocks' bytes is priced at the median of what that size takes; a
    wait per collective would price it as if the larger one waited no longer than a block."""
    spread = (1.0, 1.1, 1.3, 1.4)  # median and mean 1.2x the link's time: no long wait beyond it
    recorded = [("all_gather", n, link_ns(n) * f) for n in (BLOCK, WIDE) for f in spread for _ in range(6)]
    four = 4 * WIDE
    in_proportion = fit(recorded, 2, 2, link=NOMINAL, wait_in_proportion=True)
    assert in_proportion.time_ns("all_gather", four) == pytest.approx(1.2 * link_ns(four), rel=1e-6)
    assert in_proportion.time_ns("all_gather", BLOCK) == pytest.approx(1.2 * link_ns(BLOCK), rel=1e-6)
    per_collective = fit(recorded, 2, 2, link=NOMINAL)
    assert per_collective.time_ns("all_gather", four) < 0.95 * 1.2 * link_ns(four)


def test_on_cpu_a_merged_collective_keeps_one_long_wait_not_its_members() -> None:
    """A spread in proportion (symmetric about 1.2x the link), and, in 2 of every 30 collectives of each
    size, a long wait of 2 ms on top, whatever the size (a rank that has no core for a while). What a
    collective of a size takes on average is 1.2x the link's time plus 2 ms x 2/30; a unit of four wide
    blocks' bytes, one collective, the same: four blocks' long waits are not its, and neither are none."""
    long_wait, share = 2_000_000.0, 2 / 30
    broad = [1.0] * 5 + [1.1] * 6 + [1.2] * 6 + [1.3] * 6 + [1.4] * 5  # mean and median 1.2 with the two below
    recorded = []
    for n in (BLOCK, WIDE):
        recorded += [("all_gather", n, link_ns(n) * f) for f in broad]
        recorded += [("all_gather", n, link_ns(n) * f + long_wait) for f in (1.0, 1.4)]
    model = fit(recorded, 2, 2, link=NOMINAL, wait_in_proportion=True)
    for n in (BLOCK, WIDE):  # here, with the same long waits at every size: what each took on average
        took = [ns for _, b, ns in recorded if b == n]
        assert model.time_ns("all_gather", n) == pytest.approx(sum(took) / len(took), rel=1e-6)
    four = 4 * WIDE
    assert model.time_ns("all_gather", four) == pytest.approx(1.2 * link_ns(four) + share * long_wait, rel=1e-6)


def test_the_steps_first_gather_counts_in_the_wait_not_the_line() -> None:
    """Each step's first all-gather also waits for the ranks to meet: passed as such, its extra time
    leaves the line the blocks and a wider unit tell; passed as a sample, it bends the line past what
    a link can run (a negative slope)."""
    recorded = samples("all_gather", {BLOCK: link_ns(BLOCK), WIDE: link_ns(WIDE)})
    first = [("all_gather", ROOT, link_ns(ROOT) + 2_000_000.0)] * 6
    apart = fit(recorded, 2, 2, link=NOMINAL, meeting=first).lines["all_gather"]
    assert (apart.latency_ns, apart.per_byte_ns) == pytest.approx((LATENCY_NS, 1 / GBPS), rel=1e-6)
    bent = fit(recorded + first, 2, 2, link=NOMINAL)
    # through the three sizes the slope comes out negative: the line is no longer the sizes' own
    assert [n for n in bent.notes if "the fitted slope is -" in n]


def test_a_kind_with_only_first_gathers_is_fitted_on_all_of_them() -> None:
    """One gather a step (a recorded root unit): every step's first gather is all there is, and the
    line is fitted on all of them, not on whichever came first."""
    firsts = [("all_gather", ROOT, link_ns(ROOT) * f) for f in (1.0, 1.1, 1.3, 1.6)]
    for order in (firsts, firsts[::-1]):
        line = fit([], 2, 2, link=NOMINAL, meeting=order, wait_in_proportion=True).lines["all_gather"]
        assert line.n == 4
        took = [ns for _, _, ns in firsts]  # one size: what it takes is what it took, on average
        assert line.typical(ROOT) == pytest.approx(sum(took) / len(took), rel=1e-6)


def test_a_gather_in_mid_step_does_not_wait_the_meeting_of_a_line_fitted_on_first_gathers() -> None:
    """ZeRO-3 under DeepSpeed's default bucket gathers a small model whole at the root's fetch, each step's
    first collective and its only one; another bucket gathers it in several, all but the first in
    mid-step, after the ranks have met. Those first gathers took 1.0-1.6x the link (the median 1.2x, the
    mean 1.25x): the step's first is priced at their mean, as recorded; one in mid-step at their median
    share, without the mean long wait beyond it, which is the meeting's."""
    firsts = [("all_gather", ROOT, link_ns(ROOT) * f) for f in (1.0, 1.1, 1.3, 1.6)]
    model = fit([], 2, 2, link=NOMINAL, meeting=firsts, wait_in_proportion=True)
    assert model.time_ns("all_gather", ROOT) == pytest.approx(1.25 * link_ns(ROOT), rel=1e-6)
    assert model.time_ns("all_gather", ROOT, in_step=True) == pytest.approx(1.2 * link_ns(ROOT), rel=1e-6)
    # a kind with gathers in mid-step keeps its wait per collective wherever one is issued
    mid = fit(samples("all_gather", {BLOCK: link_ns(BLOCK)}) + [("all_gather", BLOCK, link_ns(BLOCK) + 1e6)],
              2, 2, link=NOMINAL, wait_in_proportion=True)
    assert mid.time_ns("all_gather", BLOCK, in_step=True) == mid.time_ns("all_gather", BLOCK) > link_ns(BLOCK)
