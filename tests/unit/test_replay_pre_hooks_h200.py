"""A pass's host time before its compute, on the H200's model B recording (../shared/traces/gpu-h200):
FSDP's hooks and the block's own code, told apart as FSDP2's labels in the trace file tell them.

A merged unit's members do not run FSDP's pre-forward / pre-backward hooks, but each still runs its own
code up to its first op; the replay drops the first and keeps the second (replay/program.py)."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers.rawfiles import fsdp2_label_us, fsdp2_pre_hooks_us, launch_latency_us

from fsdpviz.analysis.pipeline import RunResult
from fsdpviz.replay import program as prog
from fsdpviz.replay.model import Model
from fsdpviz.replay.settings import Settings, Wrap
from fsdpviz.vocabulary import BACKWARD, FORWARD


def _model(gpu_h200_run: Callable[[str], RunResult]) -> Model:
    """B's replay: the model of its session result (conftest's ``gpu_h200_run``), read once with it. It was
    read before the result's bound became the replay's split, so it is what ``read_model`` reads of a fresh
    ``analyse`` (``summary_model`` makes the same ``read_model`` call, on every rank up to 8: the same
    programs, fitted costs and gathers, as compared when the file took the session's result)."""
    from fsdpviz.whatif.gains import summary_model

    model, why = summary_model(gpu_h200_run("B"))
    assert model is not None, why
    return model


def test_a_passs_hooks_are_fsdp2s_pre_labels_less_its_gathers(gpu_h200_dir: Path,
                                                               gpu_h200_run: Callable[[str], RunResult]) -> None:
    """Each block's FSDP time before its compute, per phase over the traced steps, is what the trace file
    says of FSDP2's ``FSDP::pre_forward`` / ``FSDP::pre_backward`` labels less the gather and copy-out
    labels inside them (costed with the gathers), within a microsecond a pass; the block's own code
    before its first launch is the rest of its pre time (70-160 µs a pass on B)."""
    rec = _model(gpu_h200_run).recording
    steps = sorted({s.step for s in rec.steps})
    truth = fsdp2_pre_hooks_us(gpu_h200_dir / "B" / "traces" / "rank0.trace.json.gz", steps)
    ours: dict[tuple[str, str], float] = {}
    own: list[float] = []
    for s in rec.steps:
        for mb in s.micro:
            for p in (*mb.forward, *mb.backward):
                if p.unit.startswith("blocks."):
                    ours[(p.unit, p.phase)] = ours.get((p.unit, p.phase), 0.0) + p.pre_framework_ns / 1e3
                    own.append(p.pre_ns - p.pre_framework_ns)
    blocks = {k: v for k, v in truth.items() if k[0].startswith("blocks.")}
    assert len(blocks) == 24 and set(ours) == set(blocks)
    for key, us in blocks.items():
        assert ours[key] == pytest.approx(us, abs=len(steps) * 1.0), key
    assert min(own) > 10_000.0  # every pass runs some code of its own before its first launch


def test_after_its_first_launch_a_blocks_forward_holds_fsdp2s_post_forward(
        gpu_h200_dir: Path, gpu_h200_run: Callable[[str], RunResult]) -> None:
    """After a block's first forward launch, FSDP's time is FSDP2's ``FSDP::post_forward`` label, as the
    trace file says, within a microsecond a pass; the rest of that stretch is the block's own launches
    (about 0.9 ms a pass on B), which the program runs before FSDP's post hook."""
    rec = _model(gpu_h200_run).recording
    steps = sorted({s.step for s in rec.steps})
    truth = fsdp2_label_us(gpu_h200_dir / "B" / "traces" / "rank0.trace.json.gz", steps, "post_forward")
    ours: dict[str, float] = {}
    for s in rec.steps:
        for mb in s.micro:
            for p in mb.forward:
                if p.unit.startswith("blocks."):
                    ours[p.unit] = ours.get(p.unit, 0.0) + p.post_ranges_ns / 1e3
                    assert p.post_ns - p.post_ranges_ns > 500_000.0
    blocks = {u: us for u, us in truth.items() if u.startswith("blocks.")}
    assert len(blocks) == 12 and set(ours) == set(blocks)
    for unit, us in blocks.items():
        assert ours[unit] == pytest.approx(us, abs=len(steps) * 1.0), unit


def test_merged_members_keep_their_own_code_and_drop_fsdps_hooks(gpu_h200_dir: Path,
                                                                   gpu_h200_run: Callable[[str], RunResult]) -> None:
    """One root unit from B: the program's host time before each block's compute is that block's own
    code alone, FSDP's hooks gone; the root's first pass keeps its hooks. The code runs where the trace
    runs it: after FSDP's pre hook has issued the unit's gather and copied it out, right before its
    compute (B: a median 77 µs a forward pass, 150 a backward)."""
    model = _model(gpu_h200_run)
    rec = model.recording
    step = rec.steps[0]
    program = prog.build(rec, step, Settings().with_(wrap=Wrap("root")), model.comm, model.gathers)
    passes = [p for mb in step.micro for p in (*mb.forward, *mb.backward) if p.unit.startswith("blocks.")]
    own = sum(p.pre_ns - p.pre_framework_ns for p in passes)
    hooks = sum(p.pre_framework_ns for p in passes)
    ops = [op for op in program.ops if not isinstance(op, prog.FsdpKernelsOp)]
    # a pass's own code before its compute: the last host work before the compute is issued, after the
    # pass's gather and copy-out
    kept = {"pre": sum(op.ns for op in ops if isinstance(op, prog.BusyOp) and op.what == "pre"),
            "own": sum(a.ns for a, b in itertools.pairwise(ops)
                       if isinstance(b, prog.ComputeOp) and isinstance(a, prog.BusyOp) and a.what == "own")}
    copied = [i for i, op in enumerate(ops) if isinstance(op, prog.CopyOutOp)]
    assert copied and all(isinstance(op, prog.BusyOp) and op.what == "own" for op in (ops[i + 1] for i in copied))
    root = [p for mb in step.micro for p in (*mb.forward, *mb.backward) if not p.unit.startswith("blocks.")]
    assert {p.phase for p in passes} == {FORWARD, BACKWARD} and hooks > own > 0
    # the blocks' own code stays whole; of FSDP's hooks only the root's own passes' remain
    assert kept["own"] == pytest.approx(own + sum(p.pre_ns - p.pre_framework_ns for p in root), rel=1e-9)
    assert kept["pre"] == pytest.approx(sum(p.pre_framework_ns for p in root), rel=1e-9)


def test_the_launch_latency_is_the_trace_files(gpu_h200_dir: Path, gpu_h200_run: Callable[[str], RunResult]) -> None:
    """The time from a launch to its work's start on an idle device, as the replay reads it, is what the
    trace file says read without fsdpviz (12 µs on B), within 0.5 µs."""
    rec = _model(gpu_h200_run).recording
    truth = launch_latency_us(gpu_h200_dir / "B" / "traces" / "rank0.trace.json.gz")
    assert 5.0 < truth < 30.0
    assert rec.launch_latency_ns / 1e3 == pytest.approx(truth, abs=0.5)
