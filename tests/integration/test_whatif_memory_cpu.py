"""``fsdpviz whatif``'s peak memory on real 2-rank CPU recordings, against recordings of the setting.

The example trainer with two micro-batches per optimizer step (FSDP2, 2 blocks) is recorded as is
and again with ``--no-reshard-after-forward`` and with ``--prefetch 2``: the truth for a predicted
setting is a recording of that setting. Memory is compared as the rise of the allocated level
within a step (peak - level at the step's start), the highest over ranks and steps: on CPU the
level a step opens at also holds buffers whose free the profiler did not see (gloo's threads free
the buffers of asynchronous collectives), and how many of those pile up differs between recordings.

The rule that holds whatever the model: a setting that can only add memory (a deeper prefetch,
coarser units, fewer ranks) never predicts a lower peak than the recording's -- on the
grad-accumulation recording and on the plain per-block one. Keeping parameters from forward to
backward is not one of them: it makes no backward all-gather output or copy-in, and with two blocks on
CPU the recorded peak sits on such a gather (whatif/bounds.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from recording import EXAMPLE_RUNS, WIDE_RUNS, Recordings, grad_accum_config

from fsdpviz.analysis.pipeline import analyse
from fsdpviz.replay.model import Model, read_model
from fsdpviz.replay.settings import Settings, Wrap
from fsdpviz.whatif.explore import explore
from fsdpviz.whatif.predict import Prediction, predict

pytestmark = [pytest.mark.slow, pytest.mark.recorded]

# setting -> the trainer's flags that record it
RECORDED_AS = {"reshard after forward false": ("--no-reshard-after-forward",), "prefetch 2": ("--prefetch", "2")}
SETTINGS = {"reshard after forward false": Settings().with_(reshard_after_forward=False),
            "prefetch 2": Settings().with_(prefetch="2")}
ONLY_ADD = {"prefetch 2": SETTINGS["prefetch 2"], "prefetch 1": Settings().with_(prefetch="1"),
            "merge:2": Settings().with_(wrap=Wrap("merge", k=2)),
            "root": Settings().with_(wrap=Wrap("root")), "world size 1": Settings().with_(world_size=1)}
# measured on this machine (2026-11-26, the 2-block model): -7.6 % (reshard) and +1.5 % (prefetch 2)
# of the recorded rise; before the model read micro-batches, -22.6 % and -13.6 %. The recording of the
# setting is a second job whose rise varies with the gloo buffers whose free the profiler did not see:
# fresh pairs of recordings gave from -8 % to +27 % (and beyond 10 % below on a loaded machine). So
# against it the band is wide (a gross miss, such as a unit's gather lost or doubled, lies outside);
# the old model's misses are caught by the rule that holds on the source recording alone (below).
RISE_BELOW, RISE_ABOVE = 0.40, 0.40



@dataclass(frozen=True)
class Rise:
    """The highest rise within a step and the highest peak, over ranks and steps."""

    rise_bytes: int
    peak_bytes: int


def recorded(model: Model) -> Rise:
    steps = [s for s in model.recording.steps if s.memory is not None]
    assert steps
    return Rise(max(s.memory.peak_bytes - s.memory.start_bytes for s in steps if s.memory is not None),
                max(s.peak_bytes for s in steps))


def predicted(p: Prediction) -> Rise:
    rises = [m.peak_bytes - s.memory.start_bytes for s, m in zip(p.steps, p.memory, strict=True)
             if m is not None and s.memory is not None]
    assert rises and p.predicted.peak_allocated_bytes is not None
    return Rise(max(rises), p.predicted.peak_allocated_bytes)


def _model(recordings: Recordings, *extra: str) -> Model:
    rec = recordings.get(grad_accum_config("fsdp2", *extra))
    assert rec.proc.returncode == 0, rec.proc.stderr[-2000:]
    return read_model(analyse([rec.run_dir], cache=False, progress=False))


@pytest.fixture(scope="module")
def accumulated(recordings: Recordings) -> Model:
    return _model(recordings)


@pytest.mark.parametrize("name", list(RECORDED_AS))
def test_micro_batch_memory_matches_a_recording_of_the_setting(accumulated: Model, recordings: Recordings,
                                                               name: str) -> None:
    truth = recorded(_model(recordings, *RECORDED_AS[name]))
    got = predicted(predict(accumulated, SETTINGS[name]))
    assert (1 - RISE_BELOW) * truth.rise_bytes <= got.rise_bytes <= (1 + RISE_ABOVE) * truth.rise_bytes
    if name in ONLY_ADD:  # the setting adds memory (the model before micro-batches were read: less)
        assert got.rise_bytes >= recorded(accumulated).rise_bytes


def _never_lower(model: Model) -> None:
    base = recorded(model)
    for name, settings in ONLY_ADD.items():
        p = predict(model, settings)
        assert p.predicted.peak_allocated_bytes is not None
        assert p.predicted.peak_allocated_bytes >= base.peak_bytes, name
        for step, change in zip(p.steps, p.memory, strict=True):
            assert step.memory is not None and change is not None
            assert change.peak_bytes >= step.memory.peak_bytes, (name, step.rank, step.step)
    # a setting that can lower memory is not held up: twice the ranks hold half the shards
    wider = predict(model, Settings().with_(world_size=4))
    assert wider.predicted.peak_allocated_bytes is not None
    assert wider.predicted.peak_allocated_bytes < base.peak_bytes


def test_settings_that_only_add_memory_never_lower_the_peak(accumulated: Model, recordings: Recordings) -> None:
    _never_lower(accumulated)
    rec = recordings.get(EXAMPLE_RUNS["fsdp2"])
    plain = read_model(analyse([rec.run_dir], cache=False, progress=False))
    _never_lower(plain)
    peak = recorded(plain).peak_bytes
    explored = explore(plain, peak)  # "no more memory than today"
    assert explored.budget_bytes == peak
    for c in [*explored.ranked, *explored.within_spread, *explored.unranked]:
        described = c.settings.describe()
        if c.prediction is not None and described.startswith(("prefetch 1", "prefetch 2", "wrap")):
            assert c.prediction.predicted.peak_allocated_bytes is not None
            assert c.prediction.predicted.peak_allocated_bytes >= peak, described


@pytest.mark.parametrize(("wrap", "recorded"), [(Wrap("root"), "root"), (Wrap("merge", k=2), "pair")])
def test_a_merged_unit_copies_out_after_its_one_transfer(recordings: Recordings, wrap: Wrap, recorded: str) -> None:
    """One root unit's and pairs' peaks, predicted from the per-block recording, against recordings of
    them: a merged unit copies its parameters out after its one transfer, once every member's staging
    buffer is freed, and the next unit's backward prefetch is issued after that copy-out (FSDP2's
    pre-backward copies its own unit out first), so the parameters, a gather's output and the staging
    of a transfer still in flight are never alive together. On the committed recordings: both peaks
    exact, with the recordings' parameters and collective buffers at them. With the parameters made at
    the first member's copy-out, before the merged transfer, the root's was 7.0 % high (24.6 MiB of
    collective buffers at the peak); with the next pair's prefetch issued before this pair's transfer
    was done, the pairs' 6.5 % (21.1 MiB)."""
    models: dict[str, Model] = {}
    for name in ("block", recorded):
        rec = recordings.get(WIDE_RUNS[name])
        assert rec.proc.returncode == 0, rec.proc.stderr[-3000:]
        models[name] = read_model(analyse([rec.run_dir], cache=False, progress=False))
    truth = max((s.memory for s in models[recorded].recording.steps if s.memory is not None),
                key=lambda m: m.peak_bytes)
    p = predict(models["block"], Settings().with_(wrap=wrap))
    assert p.predicted.peak_allocated_bytes is not None and p.predicted.memory_categories is not None
    # the recorded level's own short-lived blocks (autograd's, the allocator's: "other", unsharded
    # gradients) land where the per-block step had them, up to 1.5 MiB (3.3 %) above the predicted
    # blocks in one step of three fresh recordings; the two categories the setting moves are exact
    assert abs(p.predicted.peak_allocated_bytes - truth.peak_bytes) <= 0.05 * truth.peak_bytes
    at_peak = p.predicted.memory_categories
    for category in ("unsharded_params", "comm_buffers"):
        assert at_peak[category] == pytest.approx(truth.peak_categories[category], rel=0.05), category


@pytest.mark.parametrize("extra", [(), ("--no-reshard-after-forward",)], ids=["reshard", "no-reshard"])
def test_micro_batches_read_each_units_resharding_as_fsdp2_holds_it(recordings: Recordings,
                                                                     extra: tuple[str, ...]) -> None:
    """Under gradient accumulation the second micro-batch's forward gathers come after the first one's
    backward: they are forward gathers, and a unit gathered in forward alone keeps its parameters. The
    model's resharding per unit is what the recorder read of FSDP2's own modules (run.json), and the
    setting recorded, asked for, predicts the recorded step and peak (a recording without resharding was
    read as resharding every unit: its own setting predicted 17 % faster than it ran, and one root unit
    gathered again in backward)."""
    rec = recordings.get(grad_accum_config("fsdp2", *extra))
    model = read_model(analyse([rec.run_dir], cache=False, progress=False))
    run = model.result.traces.run
    assert run is not None
    declared = {u.unit: u.reshard_after_forward for u in run.units}
    assert model.recording.reshard_after_forward == declared
    assert declared["(root)"] is False and set(declared.values()) == ({False} if extra else {False, True})
    same = predict(model, Settings().with_(reshard_after_forward=not extra))
    assert same.predicted.step_time_ms == pytest.approx(same.baseline.step_time_ms, rel=1e-3)
    assert same.predicted.peak_allocated_bytes == same.baseline.peak_allocated_bytes


@pytest.mark.parametrize("framework", ["fsdp2", "fsdp1"])
def test_one_root_unit_from_accumulated_blocks_peaks_as_a_recording_of_it(recordings: Recordings,
                                                                          framework: str) -> None:
    """One root unit, predicted from the per-block recording with two micro-batches per step (FSDP1 with
    activation checkpointing), against a recording of the root unit in the same trainer: the peaks agree
    (on the committed recordings to the byte for FSDP2, within 8 B for FSDP1). While the model read a
    gather after the first micro-batch's backward as a backward one, every unit looked resharding, root
    included, and the root gathered again in backward: +7.3 % (FSDP2) and +12.4 % (FSDP1)."""
    extra = ("--checkpoint",) if framework == "fsdp1" else ()
    models: dict[str, Model] = {}
    for name, flags in (("block", extra), ("root", (*extra, "--wrap", "root"))):
        rec = recordings.get(grad_accum_config(framework, *flags))
        assert rec.proc.returncode == 0, rec.proc.stderr[-2000:]
        models[name] = read_model(analyse([rec.run_dir], cache=False, progress=False))
    assert list(models["root"].recording.units) == ["(root)"]
    truth = recorded(models["root"]).peak_bytes
    got = predict(models["block"], Settings().with_(wrap=Wrap("root"))).predicted.peak_allocated_bytes
    assert got is not None
    # fresh recordings move the CPU level by up to a few % (gloo's buffers, autograd's short-lived
    # blocks: test_a_merged_unit_copies_out_after_its_one_transfer); the old model's misses lie outside
    assert abs(got - truth) <= 0.05 * truth
