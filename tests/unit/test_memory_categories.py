"""Memory by category (fsdpviz.analysis.memory_categories) against answers known independently.

- Synthetic FSDP2 runs (tests/synth), whose generator says of every allocation what it is: at each
  step's peak every category must hold exactly what the generator put there.
- Real recordings on an H100 (../shared/traces/gpu-fsdp, README there): the shards' arithmetic
  of the model (its parameter count over 8 ranks, fp32 shards, AdamW's two states), and what
  FSDP2 holds at the peak by its own rules (one block computing, one prefetched; with
  ``reshard_after_forward=False`` every block).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from synth import Scenario, generate_run, make_root, make_units

from fsdpviz.analysis import memory_categories as mcat
from fsdpviz.analysis.pipeline import RunResult, analyse

BLOCK_NUMEL = 50_358_272  # one block of the recordings' model A (FSDP1's flat parameter, the gathers' size)
ROOT_NUMEL = 2_101_248
PSI = 8 * BLOCK_NUMEL + ROOT_NUMEL


@pytest.mark.parametrize("scenario", [
    Scenario(units=make_units(4, numel=2_000_000), root=make_root(numel=1_000_000), world_size=4, steps=(3, 4),
             shared_timeline=True),
    Scenario(units=make_units(3, numel=3_000_000), root=None, world_size=2, steps=(3, 4), forward_prefetch=1,
             backward_prefetch=2),
], ids=["implicit", "explicit-prefetch"])
def test_categories_at_step_peaks_are_what_the_generator_allocated(tmp_path: Path, scenario: Scenario) -> None:
    run = generate_run(scenario, tmp_path, run_folder=True)
    analysis = analyse([run.folder], cache=False).analysis
    peaks = analysis.category_peaks[(analysis.category_peaks["unit"] == "").to_numpy()]
    expected = run.expected.step_peaks
    assert len(peaks) == len(expected) > 0
    for row in expected.to_dict(orient="records"):
        got = peaks[(peaks["rank"] == row["rank"]) & (peaks["step"] == row["step"])].iloc[0]
        assert int(got["allocated_bytes"]) == row["peak_allocated_bytes"]
        truth = {c: row["categories"].get(c, 0) for c in mcat.CATEGORIES}
        assert {c: int(got[c]) for c in mcat.CATEGORIES} == truth, (row["rank"], row["step"])


def test_levels_add_up_to_the_allocator_at_every_sample(tmp_path: Path) -> None:
    run = generate_run(Scenario(units=make_units(3), world_size=2, steps=(3, 4)), tmp_path, run_folder=True)
    analysis = analyse([run.folder], cache=False).analysis
    levels = analysis.memory_categories.merge(analysis.memory[["rank", "t_ns", "allocated_bytes"]],
                                             on=["rank", "t_ns"])
    assert len(levels) == len(analysis.memory_categories) > 0  # each kept level is at a drawn sample
    np.testing.assert_array_equal(levels[list(mcat.CATEGORIES)].sum(axis=1).to_numpy(),
                                  levels["allocated_bytes"].to_numpy())


@pytest.fixture(scope="module")
def fake8(gpu_fsdp_dir: Path) -> RunResult:
    return analyse([gpu_fsdp_dir / "h100-fsdp2-fake8-block"])


def test_h100_sharded_state_is_the_models_shards(fake8: RunResult) -> None:
    """FSDP2 keeps fp32 shards (4 bytes per element, measured from the gradients' size) of PSI
    parameters over 8 ranks, and AdamW two states of the same size; the step's gradients are freed
    by zero_grad before the peak."""
    cats = fake8.summary.memory.categories
    assert cats is not None
    assert cats["sharded_params"] == 4 * PSI // 8
    assert cats["optimizer_state"] == 2 * 4 * PSI // 8
    assert cats["gradients"] == 0
    assert sum(cats.values()) == fake8.summary.memory.peak_allocated_bytes == 5_527_571_968
    model = fake8.analysis.memory_model
    assert model is not None and (model.sharded_bytes_per_param, model.optimizer_class) == (4, "AdamW")
    assert model.sharded_state_bytes == (4 + 4 + 8) * PSI // 8


def test_h100_peak_holds_one_block_computing_and_one_prefetched(fake8: RunResult) -> None:
    """At the peak (the first backward block) FSDP2 holds that block's bf16 parameters and the root's
    (never resharded), and the next block's all-gather output (its backward prefetch)."""
    at = fake8.summary.memory.categories_at
    assert at is not None and (at.unit, at.phase) == ("blocks.7", "backward")
    assert at.categories["unsharded_params"] == 2 * (BLOCK_NUMEL + ROOT_NUMEL)
    assert at.categories["comm_buffers"] == 2 * BLOCK_NUMEL


def test_h100_reshard_false_keeps_every_block(gpu_fsdp_dir: Path) -> None:
    summary = analyse([gpu_fsdp_dir / "h100-fsdp2-fake8-reshard-false"]).summary
    cats = summary.memory.categories
    assert cats is not None and cats["unsharded_params"] == 2 * PSI and cats["comm_buffers"] == 0


def test_h100_per_unit_peaks_add_up(fake8: RunResult) -> None:
    units = {u.name: u for u in fake8.summary.units}
    for unit in units.values():
        assert unit.peak_categories is not None
        assert sum(unit.peak_categories.categories.values()) == unit.peak_categories.allocated_bytes
    # a block's backward peak holds its own gradients' reduce-scatter input (fp32) or the next gather
    assert units["blocks.3"].peak_categories.categories["sharded_params"] == 4 * PSI // 8


@pytest.mark.parametrize("sample", ["fsdp2-cpu-2rank", "fsdp1-cpu-2rank", "zero3-cpu-2rank"])
def test_cpu_samples_peak_is_split_whole(repo_root: Path, sample: str) -> None:
    """Real CPU recordings (microsecond stamps: several samples share one): the categories are read at
    the peak sample itself and add up to it; FSDP's own blocks are seen (the CPU allocator's level
    starts with the profiler, so nothing from before the trace)."""
    summary = analyse([repo_root / "sample_traces" / sample], cache=False).summary
    mem = summary.memory
    assert mem.categories is not None and mem.categories_at is not None
    assert sum(mem.categories.values()) == mem.categories_at.allocated_bytes == mem.peak_allocated_bytes
    assert mem.categories["activations"] > 0
    if sample != "zero3-cpu-2rank":  # ZeRO-3's peak comes at the step's end, its fetched parameters released
        assert mem.categories["unsharded_params"] + mem.categories["gradients"] > 0
