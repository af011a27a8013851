"""ZeRO-3's forward under another prefetch bucket (replay/memory.py ``_rebucketed``), on one step built
by hand whose answer is known: the recording's bucket gathered the whole model at the root's fetch
into one flat buffer; with no prefetch each unit gathers its own two parameters at its own fetch and
waits for them there, so no flat buffer outlives its fetch and the step's peak is the level without
the recorded buffer.

On CPU, gloo's worker thread drops its reference to a collective's tensors after the wait returns,
and under load that can fall after backward has begun: the recorded buffer must go all the same.
A gather of one parameter gathers into the parameter itself, which lives into backward and stays.
"""

from __future__ import annotations

import numpy as np
import pytest

from fsdpviz import vocabulary
from fsdpviz.analysis import memory_categories as mcat
from fsdpviz.naming import ROOT_UNIT
from fsdpviz.replay.memory import Block, MemorySetting, StepMemory, predict_step

F, B = vocabulary.FORWARD, vocabulary.BACKWARD
PARAMS = {"a": (101, 99), "b": (100, 100), "c": (61,)}  # elements of each unit's parameters
SHARDS, ELEMENT = 2, 4
# the recorded gather of every parameter: each one's partition (ceil(n / 2)) times the 2 ranks, 4 bytes each
WHOLE = (51 + 50 + 50 + 50 + 31) * SHARDS * ELEMENT
ACTIVATIONS = 10_000
C_PARAM = 61 * ELEMENT  # c's one parameter, gathered alone into itself


def _step(buffer_freed: int, whole: int = WHOLE, c_param: int = C_PARAM) -> StepMemory:
    """Forward 0-100 (root, then a, b, c), backward from 100; a recorded flat buffer of ``whole`` bytes
    made at 5 and freed at ``buffer_freed``; c's parameter (a gather of one) made at 80, released at 150."""
    windows = {(ROOT_UNIT, F, 0): (0, 100), ("a", F, 0): (10, 40), ("b", F, 0): (40, 70), ("c", F, 0): (70, 100),
               ("c", B, 0): (100, 120), ("b", B, 0): (120, 140), ("a", B, 0): (140, 160),
               (ROOT_UNIT, B, 0): (100, 170)}
    events = sorted({0: 0, 5: whole, buffer_freed: -whole, 80: c_param, 150: -c_param, 200: 0}.items())
    t = np.array([e for e, _ in events], dtype=np.int64)
    params = np.cumsum([d for _, d in events])
    levels = np.zeros((len(t), len(mcat.CATEGORIES)), dtype=np.int64)
    levels[:, mcat.CODE[mcat.UNSHARDED_PARAMS]] = params
    levels[:, mcat.CODE[mcat.ACTIVATIONS]] = ACTIVATIONS
    blocks = [Block(unit="a, b, c", category=mcat.UNSHARDED_PARAMS, phase=F, alloc=5, free=buffer_freed, bytes=whole),
              Block(unit="c", category=mcat.UNSHARDED_PARAMS, phase=F, alloc=80, free=150, bytes=c_param)]
    return StepMemory(rank=0, step=1, t=t, levels=levels, blocks=blocks, windows=windows,
                      computed={k: w[1] for k, w in windows.items()})


def _setting(recorded: tuple[int, int] | None, shards: int = SHARDS,
             params: dict[str, tuple[int, ...]] = PARAMS) -> MemorySetting:
    units = [ROOT_UNIT, "a", "b", "c"]
    return MemorySetting(group={u: u for u in units}, order=units, reshard=dict.fromkeys(units, True),
                         recorded_reshard=dict.fromkeys(units, True), prefetch="recorded", scale=1.0,
                         drop_gather_buffers=False, framework=vocabulary.ZERO3, zero3_bucket=0,
                         zero3_recorded=recorded, unit_params=dict(params), shards=shards, element_bytes=ELEMENT)


@pytest.mark.parametrize("freed", [90, 105], ids=["freed-in-forward", "freed-late-in-backward"])
def test_the_recorded_flat_buffer_goes_however_late_it_was_freed(freed: int) -> None:
    step = _step(freed)
    assert step.peak_bytes == ACTIVATIONS + WHOLE + C_PARAM  # the recorded buffer and c's parameter, at 80
    change = predict_step(step, _setting((10**9, SHARDS)))
    assert change.peak_bytes == ACTIVATIONS + C_PARAM
    assert change.categories[mcat.UNSHARDED_PARAMS] == C_PARAM


def test_the_recorded_buffer_is_sized_on_the_recorded_ranks() -> None:
    """Predicting 4 ranks from a 2-rank recording: the recorded buffer is 2 ranks' partitions (4 ranks'
    would pad to 1,872 bytes, not the recorded 1,856)."""
    assert (51 + 50 + 50 + 50 + 31) * 2 != (26 + 25 + 25 + 25 + 16) * 4
    assert predict_step(_step(105), _setting((10**9, SHARDS), shards=4)).peak_bytes == ACTIVATIONS + C_PARAM


def test_a_parameter_the_size_of_a_recorded_buffer_is_told_apart_by_its_free_alone() -> None:
    """A recorded bucket of 100 elements gathers a's two parameters as one flat buffer of 400 bytes,
    b's as another, and c's one parameter of 100 elements (400 bytes too) into itself: a block of 400
    bytes freed in backward may be c's parameter, so it stays, and so does a buffer freed late."""
    params = {"a": (50, 50), "b": (50, 50), "c": (100,)}
    step = _step(105, whole=400, c_param=400)
    assert predict_step(step, _setting((100, SHARDS), params=params)).peak_bytes == ACTIVATIONS + 800
    assert predict_step(_step(90, whole=400, c_param=400),
                        _setting((100, SHARDS), params=params)).peak_bytes == ACTIVATIONS + 400


def test_without_the_recorded_bucket_only_a_buffer_freed_in_forward_is_known_to_be_one() -> None:
    """Unknown bucket: a block freed in backward may be a parameter, so it stays as recorded."""
    assert predict_step(_step(90), _setting(None)).peak_bytes == ACTIVATIONS + C_PARAM
    assert predict_step(_step(105), _setting(None)).peak_bytes == ACTIVATIONS + WHOLE + C_PARAM


def test_a_recorded_buffer_held_over_from_the_step_before_goes_too() -> None:
    """gloo's worker thread can hold a collective's last tensors into the next step: the step opens
    with the previous step's recorded buffer still alive (the allocator counts it to the end). Under
    another bucket that buffer is not made, so the prediction holds neither it nor this step's."""
    step = _step(90)
    held = Block(unit="a, b, c", category=mcat.UNSHARDED_PARAMS, phase=F, alloc=-50, free=10**6, bytes=WHOLE,
                 own=False)
    step.blocks.append(held)
    step.levels[:, mcat.CODE[mcat.UNSHARDED_PARAMS]] += WHOLE
    assert step.peak_bytes == ACTIVATIONS + 2 * WHOLE + C_PARAM
    assert predict_step(step, _setting((10**9, SHARDS))).peak_bytes == ACTIVATIONS + C_PARAM
    assert predict_step(step, _setting(None)).peak_bytes == ACTIVATIONS + WHOLE + C_PARAM  # unknown: as recorded
