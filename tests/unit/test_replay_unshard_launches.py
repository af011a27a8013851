"""FSDP2 on one rank casts a unit's parameters inside its pre hook, one launch at a time, with no
all-gather label around them: the device runs each cast while the host is still in the hook, and waits
a launch latency for the next. On the H100's one-rank recordings (../shared/traces/gpu-fsdp) the replay
launches the unshard's kernels where the trace file says the hook launched them, and the device's wait
on FSDP's hooks is then the trace file's."""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from helpers.rawfiles import fsdp2_host_wait_ms, pre_hook_launches_us

from fsdpviz.analysis.pipeline import RunResult
from fsdpviz.replay.model import Model
from fsdpviz.replay.recording import LAUNCH_GROUPS


def _model(result: RunResult) -> Model:
    """The replay of a shared recording: the model of its session result (conftest's ``gpu_fsdp_run`` /
    ``gpu_h200_run``), read once with it. It was read before the result's bound became the replay's split,
    so it is what ``read_model`` reads of a fresh ``analyse`` (``summary_model`` makes the same call, on every
    rank up to 8: the same programs, fitted costs and replays, as compared on every recording here when the
    file took the session's result)."""
    from fsdpviz.whatif.gains import summary_model

    model, why = summary_model(result)
    assert model is not None, why
    return model


def test_a_blocks_casts_are_launched_where_its_pre_hook_launched_them(gpu_fsdp_dir: Path,
                                                                      gpu_fsdp_run: Callable[[str], Any]) -> None:
    """Each block's unshard kernels, in both phases of every traced step, are the GPU work the trace file
    shows launched inside its ``FSDP::pre_forward`` / ``FSDP::pre_backward`` label (24 a pass: a cast and a
    device-to-device copy per parameter), at the same host time from the label's start within 2 µs each
    and with the same GPU time within 0.1 %."""
    name = "h100-fsdp2-ws1-block"
    rec = _model(gpu_fsdp_run(name)).recording
    steps = sorted({s.step for s in rec.steps})
    truth = pre_hook_launches_us(gpu_fsdp_dir / name / "traces" / "rank0.trace.json.gz", steps)
    checked = 0
    for s in rec.steps:
        for mb in s.micro:
            for p in (*mb.forward, *mb.backward):
                if not p.unit.startswith("blocks."):
                    continue
                launched = truth[(s.step, p.unit, p.phase)]
                assert 8 <= len(launched) <= LAUNCH_GROUPS and len(p.fsdp_pre_launches) == len(launched)
                for (at, ns), (us, gpu_us) in zip(p.fsdp_pre_launches, launched, strict=True):
                    assert at / 1e3 == pytest.approx(us, abs=2.0)
                    assert ns / 1e3 == pytest.approx(gpu_us, rel=1e-3)
                assert p.fsdp_pre_ns / 1e3 == pytest.approx(sum(g for _, g in launched), rel=1e-3)
                checked += 1
    assert checked == 2 * 8 * len(steps)


# (fixture of the folder, recording, the replay's ms a step against the trace file's)
RECORDINGS = [("gpu_fsdp_dir", "h100-fsdp2-ws1-block"), ("gpu_fsdp_dir", "h100-hf-trainer-ws1"),
              ("gpu_fsdp_dir", "h100-fsdp2-fake8-block"), ("gpu_fsdp_dir", "h100-fsdp2-fake8-block-modelB"),
              ("gpu_fsdp_dir", "h100-fsdp2-fake8-reshard-false"), ("gpu_h200_dir", "B"), ("gpu_h200_dir", "Bl"),
              ("gpu_h200_dir", "Broot")]
RUNS = {"gpu_fsdp_dir": "gpu_fsdp_run", "gpu_h200_dir": "gpu_h200_run"}  # the folder's fixture -> its results'


@pytest.mark.parametrize(("where", "name"), RECORDINGS)
def test_the_devices_wait_on_fsdps_hooks_is_the_trace_files(request: pytest.FixtureRequest, where: str,
                                                             name: str) -> None:
    """The replay of the traced steps: the device's idle time that waited on FSDP's own work is what the
    trace file says of FSDP2's labels (the time from each idle gap's start to the launch that ended it
    spent inside them), within 15 % on every shared FSDP2 recording without a host backend (ms a step,
    replay against the file: 18.4 / 16.8 and 26.6 / 23.8 on one rank, 16.6 / 15.2, 45.0 / 42.3 and 16.4 /
    14.4 under a fake group, 46.7 / 44.0, 67.2 / 63.9 and 6.6 / 6.3 on the H200). With the unshard's
    casts launched at the hook's end, each cast waited out the whole hook and the latencies between the
    casts counted as FSDP's: 24.8 and 30.8 on one rank; with a gather's copies run from their first
    launch, the fake groups' and the H200's were 4.9-17.4 % above."""
    folder: Path = request.getfixturevalue(where) / name
    model = _model(request.getfixturevalue(RUNS[where])(name))
    steps = sorted({s.step for s in model.recording.steps})
    assert steps == json.loads((folder / "run.json").read_text())["profile"]["steps"]
    assert {s.rank for s in model.recording.steps} == {0}
    truth = fsdp2_host_wait_ms(min((folder / "traces").glob("rank0.trace.json*")), steps)
    assert truth > 5.0
    replayed = statistics.mean(r.fsdp_host_ns for r in model.replays) / 1e6
    assert replayed == pytest.approx(truth, rel=0.15)
