"""Units' sizes and dtypes read from the trace alone, where run.json has no unit table.

FSDP2 on torch < 2.13 recorded by an older fsdpviz, and anyone's plain torch.profiler traces, name
their units (FSDP2's labels) but carry no sizes besides the arguments of each unit's all-gather.
Independent truth: the unit table ``fsdpviz record`` read off the framework for the same model (run.json of
the sample recordings, FSDP1's flat parameters for the same GPT on the H100) and a GPT block's
parameter count by arithmetic (12 d^2 + 13 d: qkv, projection, two MLP matrices with biases, two norms).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fsdpviz.analysis.pipeline import analyse

SAMPLES = Path(__file__).resolve().parents[2] / "sample_traces"


def _block_numel(dim: int) -> int:
    return 12 * dim * dim + 13 * dim


def test_plain_traces_get_the_recorded_sizes(tmp_path: Path) -> None:
    # GIVEN the FSDP2 sample's traces without its run.json
    run = json.loads((SAMPLES / "fsdp2-cpu-2rank" / "run.json").read_text())
    shutil.copytree(SAMPLES / "fsdp2-cpu-2rank" / "traces", tmp_path / "traces")
    # WHEN they are summarised as plain traces
    summary = analyse([tmp_path / "traces"], cache=False).summary
    # THEN every unit has the size and dtype fsdpviz record read off FSDP2 itself
    recorded = {u["unit"]: u for u in run["units"]}
    assert summary.units_source == "trace"
    assert [u.name for u in summary.units] == sorted(recorded, key=lambda u: recorded[u]["order"])
    for unit in summary.units:
        assert unit.param_numel == recorded[unit.name]["param_numel"] > 0, unit.name
        assert unit.param_bytes == recorded[unit.name]["param_bytes"]
        assert unit.dtype == recorded[unit.name]["dtype"] == "float32" and unit.size_source == "trace"
    # and the run folder itself says its sizes came from run.json
    assert analyse([SAMPLES / "fsdp2-cpu-2rank"], cache=False).summary.units_source == "run.json"


def test_h100_fsdp2_without_unit_table(gpu_fsdp_run: Callable[[str], Any]) -> None:
    fsdp2 = gpu_fsdp_run("h100-fsdp2-fake8-block").summary  # torch 2.11: run.json units []
    fsdp1 = gpu_fsdp_run("h100-fsdp1-fake8-block").summary  # the same model, FSDP1's own flat parameters
    assert fsdp2.units_source == "trace" and fsdp1.units_source == "run.json"
    flat = {u.name: u.param_numel for u in fsdp1.units}
    assert {u.name: u.param_numel for u in fsdp2.units} == flat
    blocks = [u for u in fsdp2.units if u.name.startswith("blocks.")]
    assert len(blocks) == 8 and all(u.param_numel == _block_numel(2048) for u in blocks)
    # bf16 parameters through MixedPrecisionPolicy: the gather moves 2 bytes an element
    assert all(u.dtype == "bfloat16" and u.param_bytes == 2 * u.param_numel for u in fsdp2.units)


def test_h100_gloo_run_in_float32(gpu_fsdp_run: Callable[[str], Any]) -> None:
    summary = gpu_fsdp_run("h100-fsdp2-gloo2-block").summary
    blocks = [u for u in summary.units if u.name.startswith("blocks.")]
    assert len(blocks) == 8
    assert all(u.param_numel == _block_numel(1024) and u.dtype == "float32" and u.param_bytes == 4 * u.param_numel
               for u in blocks)


def test_world_size_one_gathers_nothing_so_sizes_stay_unknown(gpu_fsdp_run: Callable[[str], Any]) -> None:
    summary = gpu_fsdp_run("h100-fsdp2-ws1-block").summary
    assert summary.units and all(u.param_numel is None and u.size_source == "" for u in summary.units)
    assert summary.units_source is None
