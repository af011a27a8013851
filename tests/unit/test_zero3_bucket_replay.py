"""ZeRO-3 under another prefetch bucket: the replay's forward gathers held to DeepSpeed's own.

The committed ``example-zero3-block`` recording ran DeepSpeed 0.19 with a prefetch bucket of one block
(12,704 elements: ``examples/train.py --prefetch 1``). Its trace shows every forward all-gather
DeepSpeed issued: the fetch that issued it (the unit whose window holds its label) and its bytes. The
replay, told that the recording ran DeepSpeed's default bucket (5e7 elements: the whole model in one
gather) and asked for a bucket of one unit ahead -- for these units the same 12,704 elements -- must
issue the gathers DeepSpeed issued, at the same fetches, of the same bytes: the grouping is what the
step's time follows on CPU (a collective the thread waits for, each with its own round trip).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from fsdpviz.analysis.pipeline import analyse
from fsdpviz.replay import program as prog
from fsdpviz.replay.model import read_model
from fsdpviz.replay.prefetch_args import ZERO3_DEFAULT_BUCKET
from fsdpviz.replay.settings import settings_of
from fsdpviz.vocabulary import FORWARD

RUN = Path(__file__).parents[1] / "recorded" / "example-zero3-block" / "run"


def test_another_bucket_gathers_as_deepspeed_gathered_under_it() -> None:
    model = read_model(analyse([RUN], cache=False, progress=False))
    rec = model.recording
    recorded_bucket = rec.prefetch_args["stage3_prefetch_bucket_size"]
    assert recorded_bucket == 12_704  # one block's elements, as the trainer's --prefetch 1 wrote it
    told_default = dataclasses.replace(rec, prefetch_args={"stage3_prefetch_bucket_size": ZERO3_DEFAULT_BUCKET})
    setting = settings_of(prefetch=1)  # every other field as recorded
    assert prog.zero3_bucket(told_default, setting) == recorded_bucket
    for step in rec.steps:
        # what DeepSpeed issued: the gathers that moved bytes, with the fetch whose window issued each
        truth = [(g.issued_in[0] if g.issued_in else g.unit, g.unit, g.bytes)
                 for g in step.gathers if g.phase == FORWARD and g.bytes > 0]
        program = prog.build(told_default, step, setting, model.comm, model.gathers)
        issued = _issuers(program)
        replayed = [(issued[i], g.unit, g.bytes) for i, g in enumerate(program.gathers) if g.phase == FORWARD]
        assert replayed == truth and len(truth) == 4, (step.rank, step.step)


def _issuers(program: prog.Program) -> dict[int, str]:
    """gather id -> the unit whose fetch issued it: a fetch's gathers come before its unit's compute."""
    out: dict[int, str] = {}
    pending: list[int] = []
    for op in program.ops:
        if isinstance(op, prog.GatherOp):
            pending.append(op.gid)
        elif isinstance(op, prog.ComputeOp):
            out.update((gid, op.unit) for gid in pending)
            pending = []
    return out
