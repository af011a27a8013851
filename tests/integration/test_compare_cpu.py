"""``examples/compare_wrap_policies.sh`` end to end: three real 2-rank CPU recordings compared.

The script records the example trainer (FSDP2) with ``--wrap block``, ``pair`` and ``root`` (a tiny
model and few steps here) and writes ``compare.json`` and ``compare.html``. Independent references:
the model itself (built by the example's own code: module names and parameter counts), FSDP2's
gathering rules (every unit gathers in forward, and again in backward unless it keeps its
parameters, as the root does), and each run's own ``fsdpviz summary --json``.
"""

from __future__ import annotations

import json
import os
import runpy
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from helpers.jobs import retried

from fsdpviz.cli import main

pytestmark = pytest.mark.example_script

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "examples" / "compare_wrap_policies.sh"
MODEL_ARGS = "--layers 4 --dim 32 --steps 5"
RECORD_ARGS = "--warmup 1 --steps 3 --no-report"  # the compare page is under test (report.html: test_record.py)
FLOAT32_BYTES = 4
WRAPS = ("block", "pair", "root")


def _numel(module: Any) -> int:
    return sum(p.numel() for p in module.parameters())


@pytest.fixture(scope="module")
def script_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    out = tmp_path_factory.mktemp("wrap-policies")
    env = dict(os.environ, PYTHON=sys.executable, MODEL_ARGS=MODEL_ARGS, RECORD_ARGS=RECORD_ARGS, OMP_NUM_THREADS="1")
    env.pop("FSDPVIZ_RUN_DIR", None)
    def empty_out() -> None:
        shutil.rmtree(out)
        out.mkdir()

    done = retried(lambda: subprocess.run(["bash", str(SCRIPT), str(out)], capture_output=True, text=True, env=env,
                                          timeout=900, check=False),
                   tidy=empty_out)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"compare page: {out}/compare.html" in done.stderr
    return out, json.loads((out / "compare.json").read_text())


def _summary(run_dir: Path, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    """``fsdpviz summary RUN --json``, in this process."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as done:
        main(["summary", str(run_dir), "--json", "--no-cache"])
    out, err = capsys.readouterr()
    assert done.value.code == 0, err
    return json.loads(out)


@pytest.mark.slow
def test_unit_structure_follows_the_model(script_run) -> None:
    out, result = script_run
    example = runpy.run_path(str(REPO / "examples" / "train.py"))
    model = example["build_model"](example["parse_args"](MODEL_ARGS.split()))
    blocks = list(model.blocks.children())
    block_bytes = [FLOAT32_BYTES * _numel(b) for b in blocks]
    total_bytes = FLOAT32_BYTES * _numel(model)
    assert result["labels"] == list(WRAPS)
    units = {r["label"]: {u["name"]: u["param_bytes"] for u in r["units"]} for r in result["runs"]}
    assert list(units["block"]) == ["(root)", "blocks.0", "blocks.1", "blocks.2", "blocks.3"]
    assert list(units["pair"]) == ["(root)", "blocks.0+1", "blocks.2+3"]
    assert list(units["root"]) == ["(root)"]
    assert [units["block"][f"blocks.{i}"] for i in range(4)] == block_bytes
    assert units["pair"]["blocks.0+1"] == block_bytes[0] + block_bytes[1]
    assert units["root"]["(root)"] == total_bytes
    assert all(sum(u.values()) == total_bytes for u in units.values())
    assert result["deltas"]["n_units"] == [0, -2, -4]
    # Matched groups: two blocks against one pair; the one-unit run is compared on its totals.
    groups = {g["name"]: g for g in result["unit_groups"]}
    assert list(groups) == ["(root)", "blocks.0+1", "blocks.2+3"]
    assert groups["blocks.2+3"]["members"] == {"block": ["blocks.2", "blocks.3"], "pair": ["blocks.2+3"], "root": []}
    assert groups["blocks.2+3"]["param_bytes"] == {"block": block_bytes[2] + block_bytes[3],
                                                   "pair": block_bytes[2] + block_bytes[3]}
    assert result["whole_model_runs"] == {"root": "(root)"}
    # pair restructures the model (blocks.0+1.0.qkv.weight): matched by the parameters' sizes in forward order
    assert result["unit_match_basis"] == "parameter sizes in forward order"
    page = (out / "compare.html").read_text(encoding="utf-8")
    assert "Per-unit comparison" in page and "blocks.0+1" in page


@pytest.mark.slow
def test_gathers_per_step_follow_fsdp2(script_run) -> None:
    out, result = script_run
    exposed = next(f for f in result["findings"] if f["kind"] == "exposed_comm")
    expected = {}
    for wrap in WRAPS:
        run_units = json.loads((out / wrap / "run.json").read_text())["units"]
        # Forward gathers every unit; backward gathers again the units resharded after forward.
        expected[wrap] = float(len(run_units) + sum(bool(u["reshard_after_forward"]) for u in run_units))
    assert expected == {"block": 9.0, "pair": 5.0, "root": 1.0}
    assert exposed["values"]["all_gathers_per_step"] == expected


@pytest.mark.slow
def test_deltas_and_best_marks_match_the_individual_summaries(script_run, capsys: pytest.CaptureFixture[str]) -> None:
    out, result = script_run
    summaries = [_summary(out / wrap, capsys) for wrap in WRAPS]
    for run, summary in zip(result["runs"], summaries):
        assert {k: v for k, v in run.items() if k != "label"} == summary
    for key, path in (("step_time_ms", ("step_time_ms",)), ("overlap.exposed_comm_ms", ("overlap", "exposed_comm_ms")),
                      ("overlap.overlap_pct", ("overlap", "overlap_pct")),
                      ("memory.peak_allocated_bytes", ("memory", "peak_allocated_bytes"))):
        values = []
        for s in summaries:
            v: Any = s
            for part in path:
                v = v[part]
            values.append(v)
        assert result["deltas"][key] == pytest.approx([v - values[0] for v in values], abs=1e-9), key
        pick = max if key == "overlap.overlap_pct" else min
        best = [WRAPS[i] for i, v in enumerate(values) if v == pick(values)]
        if key in result["best_withheld"]:
            if key.startswith("memory."):  # peaks of runs whose level drifts are not ranked
                assert any(d is not None for d in result["memory_drift_bytes"])
            else:  # a difference within the step-to-step spread of the runs (a share's in points)
                spread = (result["spread_points"] if key == "overlap.overlap_pct" else result["spread_ms"])[key]
                first = values.index(pick(values))
                assert any(abs(v - values[first]) <= max(spread[first], spread[i])
                           for i, v in enumerate(values) if i != first and spread[i] is not None), key
            best = []
        assert result["best"][key] == (best if len(set(values)) > 1 else []), key
