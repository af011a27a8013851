"""The split of a predicted step against a recording of that setting (../shared/traces/gpu-h200/README.md):
model B recorded with the block wrap (B) and with one root unit (Broot) on one H200, an hour apart.

whatif predicts root from B; Broot is what root recorded. The model's kernels are the same kernels under
either wrap, so a prediction keeps them as compute; FSDP's copy kernels are what a wrap changes, and
they move toward the root recording's.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from helpers.rawfiles import kernels_launched_in

from fsdpviz.analysis.pipeline import RunResult
from fsdpviz.replay.settings import Settings, Wrap
from fsdpviz.whatif.explore import predicted_bound
from fsdpviz.whatif.gains import summary_model
from fsdpviz.whatif.predict import predict


def test_one_root_unit_from_the_block_recording_moves_fsdps_copies_not_the_models_compute(
        gpu_h200_dir: Path, gpu_h200_run: Callable[[str], RunResult]) -> None:
    block = gpu_h200_run("B")
    root = gpu_h200_run("Broot")
    recorded, truth = block.summary.bound, root.summary.bound
    assert recorded is not None and truth is not None
    assert recorded.fsdp_kernels_ms is not None and truth.fsdp_kernels_ms is not None
    # B's one model, what `fsdpviz whatif` predicts from (read with the session's result; reading it again
    # gives the same programs, costs and prediction: the replay reads a result's bound only on CPU, and
    # adopting the replay's split rebuilds no table the recording reads)
    model, why = summary_model(block)
    assert model is not None, why
    prediction = predict(model, Settings().with_(wrap=Wrap("root")))
    bound = predicted_bound(recorded, prediction, None)
    assert bound is not None and bound.fsdp_kernels_ms is not None
    # one figure: the split's step is the prediction's
    assert bound.step_ms == prediction.predicted.step_time_ms
    # the model's kernels stay compute (Broot's 40.8 ms against B's 37.9 is its kernels running slower
    # in that process: each of the largest model kernels 5-12 % longer per step)
    assert bound.compute_ms == pytest.approx(recorded.compute_ms, abs=0.001)
    assert prediction.predicted.compute_ms == pytest.approx(prediction.baseline.compute_ms, abs=0.001)
    # FSDP's copy kernels: the backward gathers' copies go (one root unit stays unsharded from forward to
    # backward), and no more: the trace's kernels launched inside FSDP2's `FSDP::pre_backward`, 1.01
    # ms/step, within 5 %; the prediction lands nearer the root recording (0.89 ms) than the block
    # recording it came from (2.50)
    trace = gpu_h200_dir / "B" / "traces" / "rank0.trace.json.gz"
    backward_copies = kernels_launched_in(trace, "FSDP::pre_backward", list(block.summary.steps))
    assert backward_copies > 0.5
    assert recorded.fsdp_kernels_ms - bound.fsdp_kernels_ms == pytest.approx(backward_copies, rel=0.05)
    assert abs(bound.fsdp_kernels_ms - truth.fsdp_kernels_ms) < abs(recorded.fsdp_kernels_ms - truth.fsdp_kernels_ms)
    assert prediction.predicted.fsdp_kernels_ms == pytest.approx(bound.fsdp_kernels_ms, abs=0.001)


def test_whatifs_header_says_the_world_size_and_the_clock_the_ranks_read(
        gpu_h200_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """B traced rank 0 of a world of 8 (run.json): the header gives the world size, not eight ranks, and
    the clock names the one rank the model read."""
    import json

    from helpers.cli import stdout_here

    world = json.loads((gpu_h200_dir / "B" / "run.json").read_text())["world_size"]
    traced = sorted(p.name for p in (gpu_h200_dir / "B" / "traces").glob("rank*.trace.json*"))
    assert world == 8 and traced == ["rank0.trace.json.gz"]
    out = stdout_here(capsys, "whatif", str(gpu_h200_dir / "B"), "--wrap", "root", "--no-cache")
    header, clock = out.splitlines()[:2]
    assert header == f"{gpu_h200_dir / 'B'}: fsdp2, world size 8 on gpu; predicting wrap root"
    assert clock.startswith("clock: ") and clock.endswith("the model read rank(s) 0 only")
    assert "rank(s) on" not in out


def test_a_recording_without_memory_is_not_said_to_fit_the_budget(
        gpu_h200_dir: Path, gpu_h200_run: Callable[[str], RunResult], capsys: pytest.CaptureFixture[str]) -> None:
    """Bl was recorded with --no-memory (its run.json): no setting's peak can be predicted, so none is
    "within the budget" of the H200's memory (read from the trace); they are ranked by time alone and
    the best is called the fastest, its peak unknown."""
    import json

    from fsdpviz.commands.whatif import exploration_count, print_exploration
    from fsdpviz.structure.records import NO_MEMORY
    from fsdpviz.whatif.explore import explore
    from fsdpviz.whatif.gains import completed_summary

    assert json.loads((gpu_h200_dir / "Bl" / "run.json").read_text())["options"]["memory"] is False
    result = gpu_h200_run("Bl")
    # the summary says why its peak is null, and its advice does not read as "no change in memory"
    summary = completed_summary(result)
    assert summary.memory.peak_allocated_bytes is None
    (note,) = [n for n in summary.notes if n.code == NO_MEMORY]
    assert "recorded with --no-memory (run.json)" in note
    assert not completed_summary(gpu_h200_run("B")).has_note(NO_MEMORY)  # B: with memory
    advised = [a for a in summary.actions if a.knob]
    assert advised and all(", peak unknown (fsdpviz whatif: " in a.predicted_gain for a in advised), [a.predicted_gain for a in advised]
    model, _ = summary_model(result)
    assert model is not None
    exploration = explore(model)
    assert exploration.budget_bytes is not None and exploration.budget_bytes > 100 * 2**30  # the device's
    listed = [*exploration.ranked, *exploration.within_spread, *exploration.unranked]
    assert listed and not exploration.over_budget
    for c in listed:
        assert c.prediction is not None and c.prediction.predicted.peak_allocated_bytes is None
        assert c.fits is None and c.to_json()["fits_budget"] is None and c.over_bytes is None
    assert exploration_count(exploration) == f"{len(listed)} setting(s) predicted (0 within the budget, 0 over it, " \
        f"{len(listed)} of unknown peak)"
    capsys.readouterr()
    print_exploration(exploration, "Bl")
    out = capsys.readouterr().out
    assert "best within the budget" not in out
    assert "\nfastest (its peak unknown, so not held to the budget): wrap root (" in out


def test_whatif_says_why_the_peak_of_a_recording_without_memory_is_null(
        gpu_h200_dir: Path, gpu_h200_run: Callable[[str], RunResult], capsys: pytest.CaptureFixture[str]) -> None:
    """Bl's run.json says --no-memory: whatif's recorded and predicted peaks are null, and its notes (a
    prediction's and --explore's) say why, in the summary's words; B recorded memory and has no such note."""
    import json

    from fsdpviz.commands.whatif import print_exploration
    from fsdpviz.whatif.explore import explore

    for name in ("B", "Bl"):
        options = json.loads((gpu_h200_dir / name / "run.json").read_text())["options"]
        model, _ = summary_model(gpu_h200_run(name))
        assert model is not None
        prediction = predict(model, Settings(wrap=Wrap("root")))
        about_memory = [n for n in prediction.notes if "no memory in the analysed steps" in n]
        if options["memory"] is not False:
            assert prediction.baseline.peak_allocated_bytes is not None and not about_memory
            continue
        assert prediction.baseline.peak_allocated_bytes is None and prediction.predicted.peak_allocated_bytes is None
        said = [n for n in model.result.summary.notes if getattr(n, "code", None) == "no_memory"]
        assert about_memory == [str(said[0])] and "recorded with --no-memory (run.json)" in about_memory[0]
        assert about_memory[0] in prediction.to_json()["notes"]
        exploration = explore(model)
        assert about_memory[0] in exploration.notes
        capsys.readouterr()
        print_exploration(exploration, name)
        assert f"note: {about_memory[0]}\n" in capsys.readouterr().out


def test_a_gpu_replay_that_runs_the_clean_steps_is_said_as_a_match_however_small_its_miss(
        gpu_h200_run: Callable[[str], RunResult]) -> None:
    """B's replay without the profiler takes the profiler's measured excess out of every host event
    (``host_cost``): the step it loses is the replay's own, so its miss of the timers' clean steps is a
    measurement, said as one even where it reads 0.0 %. Only a CPU replay, scaled onto the clean steps by
    one factor per rank (``factor``), is said to be put on them (tests/integration/test_whatif_cpu.py)."""
    import dataclasses

    model, why = summary_model(gpu_h200_run("B"))
    assert model is not None, why
    prediction = predict(model, Settings().with_(wrap=Wrap("root")))
    assert prediction.clock is not None and prediction.clock["calibration"] == "host_cost"
    miss = prediction.clock["replay_error_pct"]
    assert miss is not None and miss > 0.05  # B's own miss: 1.57 % at this release
    assert f"the run's clean steps within {miss:.1f} %" in prediction.replay_words()
    # the same replay, had it missed the clean steps by 0.03 %: a match within 0.0 %, not "on" them
    close = dataclasses.replace(prediction, clock={**prediction.clock, "replay_error_pct": 0.03})
    assert "without the profiler, the run's clean steps within 0.0 %" in close.replay_words()
    assert "on the run's clean steps" not in close.replay_words()
    # a CPU replay's clock with that figure is put on them by its factor
    scaled = dataclasses.replace(prediction, clock={**prediction.clock, "replay_error_pct": 0.03, "calibration": "factor"})
    assert "without the profiler, on the run's clean steps" in scaled.replay_words()
