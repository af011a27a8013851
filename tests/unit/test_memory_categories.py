"""Memory by category (fsdpviz.analysis.memory_categories) against answers known independently.

- Synthetic FSDP2 runs (tests/synth), whose generator says of every allocation what it is: at each
  step's peak every category must hold exactly what the generator put there.
- Real recordings on an H100 (../shared/traces/gpu-fsdp, README there): the fp32 shards against the
  allocator's peaks of the same run at other world sizes (what moves with 1/N), what FSDP2 holds at the peak by its own rules (one block computing,
  one prefetched; with ``reshard_after_forward=False`` every block), and what they cannot know
  (the optimizer's state made before the trace, which they did not measure).
- What the training script measures on its own tensors: tests/integration/test_memory_truth.py.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from helpers.gpu_fsdp_truth import WORLD_SIZE_PEAKS, allocator_split
from synth import Scenario, generate_run, make_root, make_units

from fsdpviz.analysis import memory_categories as mcat
from fsdpviz.analysis.pipeline import RunResult, analyse

BLOCK_NUMEL = 50_358_272  # one block of the recordings' model A (FSDP1's flat parameter, the gathers' size)
ROOT_NUMEL = 2_101_248
PSI = 8 * BLOCK_NUMEL + ROOT_NUMEL


def _allocator_shards(recording: str, world_size: int) -> float:
    """A rank's fp32 shards by the allocator alone: of what its peaks at several world sizes hold in
    proportion to 1/N (gpu_fsdp_truth.allocator_split), AdamW keeps two fp32 moments the shape of each
    shard, so the shards are a third."""
    _, per_one_over_n = allocator_split(WORLD_SIZE_PEAKS[recording])
    return per_one_over_n / world_size / 3


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


@pytest.fixture(scope="module")
def fake8(gpu_fsdp_dir: Path) -> RunResult:
    return analyse([gpu_fsdp_dir / "h100-fsdp2-fake8-block"], cache=False)


def test_h100_sharded_state_is_the_models_shards_and_the_unmeasured_optimizer_unknown(fake8: RunResult) -> None:
    """FSDP2 keeps fp32 shards of the model's parameters over 8 ranks, as large as the uninstrumented
    runs' peaks at 2, 8 and 16 ranks say; the step's gradients are freed by zero_grad before the peak. The recording has no measurement of the optimizer's state,
    which AdamW made before the trace: it is unknown (None, with why), not read off a table of classes,
    and so is ``other``, which holds it."""
    mem = fake8.summary.memory
    cats, at = mem.categories, mem.categories_at
    assert cats is not None and at is not None
    assert cats["sharded_params"] == pytest.approx(_allocator_shards("h100-fsdp2-fake8-block", 8), rel=0.01)
    assert cats["gradients"] == 0
    assert cats["optimizer_state"] is None and cats["other"] is None
    assert "before the trace" in at.unknown["optimizer_state"]
    assert mem.level == "allocator" and mem.baseline_bytes is None
    model = fake8.analysis.memory_model
    assert model is not None and (model.sharded_bytes_per_param, model.optimizer_class) == (4, "AdamW")
    assert not model.optimizer_bytes_measured


def test_h100_peak_holds_one_block_computing_and_one_prefetched(fake8: RunResult) -> None:
    """At the peak (the first backward block) FSDP2 holds that block's bf16 parameters and the root's
    (never resharded), and the next block's all-gather output (its backward prefetch)."""
    at = fake8.summary.memory.categories_at
    assert at is not None and (at.unit, at.phase) == ("blocks.7", "backward")
    assert at.categories["unsharded_params"] == 2 * (BLOCK_NUMEL + ROOT_NUMEL)
    assert at.categories["comm_buffers"] == 2 * BLOCK_NUMEL


def test_h100_reshard_false_keeps_every_block(gpu_fsdp_dir: Path) -> None:
    summary = analyse([gpu_fsdp_dir / "h100-fsdp2-fake8-reshard-false"], cache=False).summary
    cats = summary.memory.categories
    assert cats is not None and cats["unsharded_params"] == 2 * PSI and cats["comm_buffers"] == 0


def test_h100_unit_peaks_hold_the_same_shards(fake8: RunResult) -> None:
    """Every unit's peak holds the whole rank's shards (FSDP2 frees none during a step), as large as
    the allocator says at every world size it measured."""
    units = {u.name: u for u in fake8.summary.units}
    assert units
    for unit in units.values():
        assert unit.peak_categories is not None
        assert unit.peak_categories.categories["sharded_params"] == pytest.approx(
            _allocator_shards("h100-fsdp2-fake8-block", 8), rel=0.01)
        assert unit.peak_categories.categories["optimizer_state"] is None


def test_h100_hf_trainer_model_zero_grad_gradients_are_not_buffers(gpu_fsdp_dir: Path) -> None:
    """The transformers Trainer calls ``model.zero_grad()`` (no Optimizer range): the sharded
    gradients its reductions leave live until then, and are gradients. On one rank the only buffer
    at the embedding's backward peak is its own reduction's input: FSDP2 copies the unit's gradients
    into a reduce-scatter input in fp32 (vocabulary 32000 x 1024) even when no rank shares them."""
    result = analyse([gpu_fsdp_dir / "h100-hf-trainer-ws1"], cache=False)
    units = {u.name: u for u in result.summary.units}
    cats = units["model.embed_tokens"].peak_categories
    assert cats is not None and cats.phase == "backward"
    assert cats.categories["comm_buffers"] == 32_000 * 1_024 * 4
    assert (cats.categories["gradients"] or 0) > 4 * cats.categories["comm_buffers"]
    # no run.json units and no measurement: the shards are unknown, not 0
    assert cats.categories["sharded_params"] is None and "sharded_params" in cats.unknown


def test_cpu_recording_without_a_measurement_says_what_it_cannot_know(
        sample_run: Callable[[str], RunResult]) -> None:
    """A real CPU recording made by a plain torch.profiler (no recorder, so no memory measurement):
    the CPU profiler counts only what was allocated since the trace began, so the level says so and
    the sharded parameters and the optimizer state (made before the trace) are unknown, with why;
    FSDP's own blocks are seen."""
    summary = sample_run("fsdp2-cpu-2rank-plain").summary
    mem = summary.memory
    assert mem.categories is not None and mem.categories_at is not None
    assert mem.level == "since_trace_start" and mem.baseline_bytes is None
    assert mem.categories["sharded_params"] is None and mem.categories["optimizer_state"] is None
    assert "since the trace began" in mem.categories_at.unknown["sharded_params"]
    assert (mem.categories["activations"] or 0) > 0
    assert (mem.categories["unsharded_params"] or 0) + (mem.categories["gradients"] or 0) > 0


def _model_bytes(run_dir: Path) -> int:
    """The fp32 bytes of the model the sample's command built, counted on the model itself
    (examples/train.py's build_model with the command's arguments), not by fsdpviz."""
    import json
    import runpy

    command = json.loads((run_dir / "run.json").read_text())["command"]
    args = command[command.index("examples/train.py") + 1:]
    example = runpy.run_path(str(run_dir.parents[1] / "examples" / "train.py"))
    model = example["build_model"](example["parse_args"](args))
    return 4 * sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("sample", ["fsdp2-cpu-2rank", "fsdp1-cpu-2rank", "zero3-cpu-2rank"])
def test_recorded_cpu_samples_show_the_shards_and_the_optimizer_state(repo_root: Path, sample: str) -> None:
    """The samples are recorded by ``fsdpviz record``, which measures what each rank holds when the
    trace begins: the peak's sharded parameters are the model's own bytes over the 2 ranks (FSDP
    pads a shard by a few elements at most), and AdamW keeps two moments of them (plus a 4-byte step
    counter per parameter), not 0 and not unknown; DeepSpeed's optimizer keeps an fp32 master copy of
    the partition besides (``fp32_partitioned_groups_flat``), a third state of the shards' size."""
    run_dir = repo_root / "sample_traces" / sample
    mem = analyse([run_dir], cache=False).summary.memory
    assert mem.categories is not None and mem.level == "since_trace_start_plus_measured"
    shards = mem.categories["sharded_params"]
    state = mem.categories["optimizer_state"]
    assert shards is not None and state is not None
    assert shards == pytest.approx(_model_bytes(run_dir) / 2, rel=0.01)
    assert state == pytest.approx((3 if sample.startswith("zero3") else 2) * shards, rel=0.01)
