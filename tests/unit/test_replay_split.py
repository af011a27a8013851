"""The bound, the replay's split (fsdpviz/replay/split.py): on a GPU run led by the timers, the traced step's
waits on the host and its exposed communication lose what the replay without the profiler took out of
them, the kernels' own time and other idle keep the trace's figures, and what the replay does not
account for goes by the rule (fsdpviz/structure/deprofile.py).

The arithmetic is checked on parts whose answer is worked out by hand; the split on the shared GPU
recordings, where the timers' clean step is the truth the parts must add up to, the trace file the
truth for what the replay must leave alone (the model's compute), and the model's two replays what the
waits must have lost (wiring: which replay, which rank, which sign); and the summary cache, which must
give a later view the split the summary printed.
"""

from __future__ import annotations

import shutil
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from fsdpviz.analysis.bound import BY_REPLAY, BY_RULE, rank_drops, summarize_bound
from fsdpviz.replay.split import host_paced
from fsdpviz.structure.deprofile import Parts, comm_scale, device_scale, replay_moved

# compute, exposed comm, host wait, other idle, FSDP's copies, FSDP's hooks' wait, carried: 60 ms
TRACED = Parts(40.0, 2.0, 10.0, 3.0, 1.0, 4.0, 0.0)
WAITS = Parts(0.0, 0.0, 6.0, 0.5, 0.0, 3.0, 0.0)  # the replay's drop: 6 ms of host wait, 3 of FSDP's hooks'


def test_each_wait_on_the_host_loses_what_the_replay_took_out_of_it() -> None:
    # 9 of the 60 ms; the replay's 0.5 ms less other idle is launch latency of its own, not the trace's
    # other idle, which stays
    moved, left, note, beyond = replay_moved(TRACED, WAITS, 51.0)
    assert moved == pytest.approx(Parts(40.0, 2.0, 4.0, 3.0, 1.0, 1.0, 0.0)) and note is None and beyond == {}
    assert left.total == pytest.approx(51.0) and device_scale(left, moved) == 1.0


def test_what_the_replay_leaves_goes_by_the_rule() -> None:
    # the timers saw 1 ms more leave than the replay did: out of the waits left (4 + 1), in proportion
    moved, left, _, _ = replay_moved(TRACED, WAITS, 50.0)
    assert left.total - 50.0 == pytest.approx(1.0)
    assert moved.host_wait == pytest.approx(3.2) and moved.fsdp_host == pytest.approx(0.8)
    assert moved.other_idle == pytest.approx(3.0) and moved.total == pytest.approx(50.0)
    # 1 ms less than the replay's 9: its drop is scaled to the timers' 8, each wait in proportion
    moved, _, _, _ = replay_moved(TRACED, WAITS, 52.0)
    assert moved.host_wait == pytest.approx(10 - 6 * 8 / 9) and moved.fsdp_host == pytest.approx(4 - 3 * 8 / 9)
    assert moved.other_idle == pytest.approx(3.0)
    # a clean step longer than the traced one: nothing taken, the time no trace saw is other idle
    moved, _, _, _ = replay_moved(TRACED, WAITS, 61.0)
    assert moved.host_wait == pytest.approx(10.0) and moved.other_idle == pytest.approx(4.0)


def test_work_carried_in_comes_out_first() -> None:
    carried = TRACED._replace(carried=2.0)  # 62 ms
    moved, _, _, _ = replay_moved(carried, WAITS, 51.0)
    assert moved == pytest.approx(Parts(40.0, 2.0, 4.0, 3.0, 1.0, 1.0, 0.0))
    # 7 ms to take: the 2 carried, then 5 of the replay's 9 in proportion
    moved, _, _, _ = replay_moved(carried, WAITS, 55.0)
    assert moved.carried == 0.0 and moved.host_wait == pytest.approx(10 - 6 * 5 / 9)
    assert moved.fsdp_host == pytest.approx(4 - 3 * 5 / 9)


def test_a_drop_larger_than_its_wait_stops_at_zero_and_says_by_how_much() -> None:
    # 12 ms of host wait where the trace held 10 (as on H200 Broot): the wait ends at 0, not below, and the
    # 2 ms go with the remainder (FSDP's hooks' 4 ms, then 1 of other idle)
    drop = Parts(0.0, 0.0, 12.0, 0.0, 0.0, 0.0, 0.0)
    moved, left, _, beyond = replay_moved(TRACED, drop, 45.0)
    assert left.host_wait == 0.0 and beyond == pytest.approx({"host_wait": 2.0})
    assert moved.fsdp_host == pytest.approx(0.0) and moved.other_idle == pytest.approx(2.0)
    assert moved.total == pytest.approx(45.0)


def test_exposed_communication_moves_and_the_kernels_keep_the_traces_figures() -> None:
    # a collective the slower host issued later is exposed 1.5 ms longer as traced (gloo's, on the shared
    # recording, ~30 ms a step): it comes out with the waits, 4.5 ms in all. The kernels' own time
    # (compute 0.2, FSDP's copies 0.5: how the two replays overlap them) and other idle (0.5) stay the
    # trace's, and their 1.2 ms go with the remainder, by the rule (the waits left, 7 + 4, in proportion)
    drop = Parts(0.2, 1.5, 3.0, 0.5, 0.5, 0.0, 0.0)
    moved, left, note, _ = replay_moved(TRACED, drop, 54.3)
    assert left == pytest.approx(Parts(40.0, 0.5, 7.0, 3.0, 1.0, 4.0, 0.0)) and note is None
    assert (moved.compute, moved.fsdp_kernels, moved.other_idle) == (40.0, 1.0, 3.0)
    assert moved.exposed_comm == pytest.approx(0.5) and moved.total == pytest.approx(54.3)
    assert moved.host_wait == pytest.approx(7.0 - 1.2 * 7 / 11) and moved.fsdp_host == pytest.approx(4.0 - 1.2 * 4 / 11)
    assert device_scale(left, moved) == 1.0 and comm_scale(TRACED, moved) == pytest.approx(0.25)
    # where even the device's parts must shrink to reach the clean step, the rule says so
    moved, left, note, _ = replay_moved(TRACED, drop, 40.0)
    assert device_scale(left, moved) < 1.0 and note is not None and "shrunk" in note


def test_only_a_host_backends_exposed_communication_moves() -> None:
    # gloo's collectives are the host's work (the replay's drop of them is taken); NCCL's are kernels: the
    # trace's exposed communication stays, and its 1.5 ms go with the remainder, by the rule
    drops = {0: Parts(0.0, 1.5, 3.0, 0.0, 0.0, 1.0, 0.0)}
    assert host_paced(drops, True) is drops
    nccl = host_paced(drops, False)
    assert nccl[0] == Parts(0.0, 0.0, 3.0, 0.0, 0.0, 1.0, 0.0) and drops[0].exposed_comm == 1.5
    moved, _, _, _ = replay_moved(TRACED, nccl[0], 54.5)
    assert moved.exposed_comm == 2.0 and moved.total == pytest.approx(54.5)
    # 4 ms by the replay (host wait 10 -> 7, hooks 4 -> 3), 1.5 by the rule out of those 10 in proportion
    assert moved.host_wait == pytest.approx(7.0 - 1.5 * 0.7) and moved.fsdp_host == pytest.approx(3.0 - 1.5 * 0.3)


def test_a_trace_without_launches_keeps_its_unknown_host_wait() -> None:
    unknown = TRACED._replace(host_wait=None)  # 50 ms
    moved, _, _, _ = replay_moved(unknown, WAITS, 47.0)
    assert moved.host_wait is None and moved.fsdp_host == pytest.approx(1.0) and moved.total == pytest.approx(47.0)


def test_a_rank_the_model_did_not_read_takes_the_replayed_ranks_shares() -> None:
    # rank 0 replayed: of its 10 ms excess, 6 from the host wait and 3 from FSDP's hooks'
    drops = {0: WAITS}
    out = rank_drops(drops, [0, 1, 2], {0: 10.0, 1: 20.0, 2: -1.0})
    assert out[0] is WAITS
    assert (out[1].host_wait, out[1].fsdp_host) == pytest.approx((12.0, 6.0))
    assert (out[2].host_wait, out[2].fsdp_host) == (0.0, 0.0)  # ran no slower traced: nothing to take
    # and the exposed communication's share the same way (2 ms of rank 3's 10)
    out = rank_drops({3: WAITS._replace(exposed_comm=2.0)}, [3, 4], {3: 10.0, 4: 5.0})
    assert (out[4].host_wait, out[4].fsdp_host, out[4].exposed_comm) == pytest.approx((3.0, 1.5, 1.0))
    assert out[4].other_idle == 0.0  # the replay's other idle is not moved, so not carried over either


def _own_compute(result: Any) -> float:
    traced = summarize_bound(result.overlap, None)
    assert traced is not None
    return traced.compute_ms


def _rank0_wait_drop(model: Any) -> tuple[float, float]:
    """Rank 0's host wait and FSDP's hooks' wait, the traced replay's less the net replay's (ms, mean
    over its replayed steps), read off the model's two replays."""
    def mean(steps: Any, sims: Any, field: str) -> float:
        return statistics.fmean((getattr(r, field) or 0.0) for st, r in zip(steps, sims) if st.rank == 0) / 1e6

    rec, net = model.recording, model.net
    return tuple(mean(rec.steps, model.replays, f) - mean(net.recording.steps, net.replays, f)  # type: ignore[return-value]
                 for f in ("host_wait_ns", "fsdp_host_ns"))


@pytest.mark.parametrize("name", ["B", "Bl", "Broot"])
def test_the_h200_bounds_are_the_replays_split(name: str, gpu_h200_dir: Path) -> None:
    """On the three H200 recordings (the replay within 10 % of their clean steps): the completed summary's
    bound is the replay's split; its parts add up to the timers' clean step; the model's compute is the
    trace's (the profiler slows the host, not the kernels); rank 0's waits lost what the model's replays
    say, give or take the remainder the rule took; and the run's summary reads that split afterwards."""
    from fsdpviz.analysis.bound import traced_parts
    from fsdpviz.analysis.pipeline import analyse
    from fsdpviz.whatif.gains import completed_summary, summary_model

    result = analyse([gpu_h200_dir / name], cache=False, progress=False)
    rule = result.summary.bound
    assert rule is not None and rule.deprofiled_by == BY_RULE  # until a view reads the run's model
    summary = completed_summary(result)
    bound = summary.bound
    assert bound is not None and bound.deprofiled_by == BY_REPLAY, bound and bound.note
    assert summary.clock.basis == "replayed"
    clean = summary.profiler.unprofiled_step_ms
    assert bound.step_ms == pytest.approx(clean, abs=0.002)
    parts = bound.compute_ms + bound.exposed_comm_ms + (bound.host_wait_ms or 0.0) + bound.other_idle_ms \
        + bound.fsdp_overhead_ms
    assert parts == pytest.approx(clean, abs=0.01)
    assert bound.compute_ms == pytest.approx(_own_compute(result), abs=0.01)
    # rank 0 (the one traced): its waits as traced, less the replay's drop, less at most the remainder
    model, _ = summary_model(result)
    host_drop, hooks_drop = _rank0_wait_drop(model)
    assert host_drop > 1.0 and hooks_drop > 0.0  # the profiler's cost per host event shortened both waits
    _, traced, _ = traced_parts(result.overlap[result.overlap["rank"] == 0].iloc[0])
    assert traced.host_wait is not None
    expected = max(traced.host_wait - host_drop, 0.0)
    rank0 = bound.per_rank["0"]
    left = traced.total - traced.carried - min(host_drop, traced.host_wait) - min(hooks_drop, traced.fsdp_host)
    remainder = max(left - rank0.step_ms, 0.0)
    assert expected - remainder - 0.002 <= (rank0.host_wait_ms or 0.0) <= expected + 0.002
    assert "as the replay without it takes it out" in (bound.note or "")
    assert result.summary.bound.host_wait_ms == bound.host_wait_ms != rule.host_wait_ms  # the run's summary too
    assert result.bound_split is not None and result.bound_split.host_scale == bound.host_scale


@pytest.mark.parametrize("folder, name", [("gpu_fsdp_run", "h100-fsdp1-ws1-block"), ("gpu_fsdp_run", "h100-fsdp2-fake8-block"),
                                          ("gpu_fsdp_run", "h100-fsdp2-ws1-block"), ("gpu_h200_run", "B")])
def test_the_notes_figures_add_up_to_the_profilers_share(folder: str, name: str, request: pytest.FixtureRequest) -> None:
    """The bound's note says where the profiler's share (the traced step less the timers' clean one, one
    rank here) went: the work the GPU ran from before the analysed steps (out first), the replay's drop
    of the waits, and the remainder the rule took. Those figures add up to ``profiler_share_ms``; on the
    FSDP1 recording the carried work (1.240 ms a step) was taken out unsaid, and on H200 B a remainder
    under half a millisecond (0.401 ms) went unsaid."""
    import re

    bound = request.getfixturevalue(folder)(name).summary.bound
    assert bound is not None and bound.profiler_share_ms is not None
    note = bound.note or ""
    assert "as the replay without it takes it out" in note, note

    def said(pattern: str) -> float:
        found = re.search(pattern, note)
        return float(found.group(1)) if found else 0.0

    carried = said(r"before the analysed steps came out first \(([\d.]+) ms a step")
    took = said(r"as the replay without it takes it out \(([\d.]+) ms a step")
    remainder = said(r"falls ([\d.]+) ms a step short") - said(r"the clean step is ([\d.]+) ms longer")
    assert took > 0
    assert carried + took + remainder == pytest.approx(bound.profiler_share_ms, abs=0.003), note


def test_a_replay_that_misses_the_clean_step_leaves_the_rules_split(gpu_fsdp_run: Callable[[str], Any]) -> None:
    """H100 HF Trainer: the replay without the profiler misses the timers' clean step by 23 %; the bound
    stays the rule's and says why, and the clock is the trace's."""
    from fsdpviz.whatif.gains import completed_summary

    summary = completed_summary(gpu_fsdp_run("h100-hf-trainer-ws1"))
    assert summary.bound is not None and summary.bound.deprofiled_by == BY_RULE
    assert "not by the replay: the replay without the profiler misses the timers' clean step by 23." in (
        summary.bound.note or "")
    assert summary.clock.basis == "traced"


def test_the_cached_summary_gives_a_later_view_its_split(gpu_fsdp_dir: Path, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """``summary`` keeps the replay's split with the summary; a later view of the run read from the cache
    (no model read) holds that split, where the rule's would differ (the FSDP2 model-B recording on H100:
    host wait 15.3 ms a step against the rule's 11.3), and says its memory note once."""
    from fsdpviz.analysis.pipeline import analyse
    from fsdpviz.cache import seed, store_for
    from fsdpviz.cli import main

    monkeypatch.delenv("FSDPVIZ_NO_SUMMARY_CACHE", raising=False)
    monkeypatch.setenv("FSDPVIZ_CACHE_HOME", str(tmp_path / "user-cache"))
    run = tmp_path / "run"
    shutil.copytree(gpu_fsdp_dir / "h100-fsdp2-fake8-block-modelB", run)
    with pytest.raises(SystemExit) as exc:
        main(["summary", "--json", str(run)])
    assert exc.value.code in (0, None)
    cached = analyse([run], progress=False)
    rule = cached.summary.bound
    assert rule is not None and rule.deprofiled_by == BY_RULE
    assert seed(cached, store_for([run]))
    bound = cached.summary.bound
    assert bound is not None and bound.deprofiled_by == BY_REPLAY and "whatif.summary_model" not in cached.memo
    assert bound.host_wait_ms is not None and rule.host_wait_ms is not None
    assert bound.host_wait_ms > rule.host_wait_ms + 2.0
    assert (bound.note or "").count("memory_bound is null") <= 1
