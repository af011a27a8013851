"""``fsdpviz compare`` of real 2-rank CPU recordings: per block against pairs of blocks sharded with
``fully_shard([a, b])`` (``examples/train.py --wrap pair-list``).

Independent truth: the example's own model (``named_parameters``: each parameter's FQN and numel).
run.json must record, per unit, exactly the parameters of the modules it shards, and every row of
the comparison must hold the same parameters in both runs, in the terminal table as on the JSON.
The per-block recording is the session's shared ``fsdp2`` one.
"""

from __future__ import annotations

import importlib.util
import json
import runpy
from pathlib import Path
from typing import Any

import pytest
from helpers.cli import stdout_here
from helpers.jobs import NO_OUTPUT
from recording import EXAMPLE_RUNS, MODEL, PROFILE, Config, Recordings

pytestmark = pytest.mark.recorded

REPO = Path(__file__).resolve().parents[2]
PAIR_LIST = Config(("--framework", "fsdp2", "--wrap", "pair-list", *MODEL), (*NO_OUTPUT, *PROFILE),
                   committed="fsdp2-pair-list")


def _model_params() -> dict[str, int]:
    example = runpy.run_path(str(REPO / "examples" / "train.py"))
    model = example["build_model"](example["parse_args"](list(MODEL)))
    return {fqn: p.numel() for fqn, p in model.named_parameters()}


def _run_params(run_dir: Path) -> dict[str, dict[str, int]]:
    units = json.loads((run_dir / "run.json").read_text())["units"]
    return {u["unit"]: {fqn: numel for fqn, numel in u["params"]} for u in units}


@pytest.fixture(scope="module")
def runs(recordings: Recordings) -> dict[str, Path]:
    out = {}
    for label, config in {"block": EXAMPLE_RUNS["fsdp2"], "pair": PAIR_LIST}.items():
        rec = recordings.get(config)
        assert rec.proc.returncode == 0, rec.proc.stderr[-3000:]
        out[label] = rec.run_dir
    return out


@pytest.mark.parametrize("name", ["fsdp1", "zero3-submodule"])
def test_fsdp1_and_zero3_record_their_units_parameters(recordings: Recordings, name: str) -> None:
    """FSDP1's flat parameters and ZeRO-3's fetched modules hold the model's parameters, each once."""
    if name.startswith("zero3") and importlib.util.find_spec("deepspeed") is None:
        pytest.skip("deepspeed is not installed")
    rec = recordings.get(EXAMPLE_RUNS[name])
    assert rec.proc.returncode == 0, rec.proc.stderr[-3000:]
    units = _run_params(rec.run_dir)
    held = [(fqn, numel) for params in units.values() for fqn, numel in params.items()]
    assert sorted(held) == sorted(_model_params().items())
    if name == "fsdp1":
        assert set(units["blocks.0"]) == {f for f in _model_params() if f.startswith("blocks.0.")}
    else:
        assert units["blocks.0.qkv"] == {"blocks.0.qkv.weight": 32 * 96, "blocks.0.qkv.bias": 96}
        assert units["blocks.0"] == {}  # the parent block holds no parameters of its own


def test_run_json_records_each_units_parameters(runs: dict[str, Path]) -> None:
    model = _model_params()
    for label, run_dir in runs.items():
        units = _run_params(run_dir)
        held = {fqn: numel for params in units.values() for fqn, numel in params.items()}
        assert held == model, label  # every parameter once, with its numel
    block, pair = _run_params(runs["block"]), _run_params(runs["pair"])
    assert set(block["blocks.1"]) == {f for f in model if f.startswith("blocks.1.")}
    assert set(pair["[blocks.0, blocks.1]"]) == {f for f in model if f.startswith(("blocks.0.", "blocks.1."))}
    assert set(pair["(root)"]) == set(block["(root)"]) == {f for f in model if not f.startswith("blocks.")}


def test_rows_hold_the_same_parameters_in_both_runs(runs: dict[str, Path], capsys: pytest.CaptureFixture[str],
                                                    tmp_path: Path) -> None:
    out = json.loads(stdout_here(capsys, "compare", str(runs["block"]), str(runs["pair"]), "--label", "block",
                          "--label", "pair", "--json", "-q", "-o", str(tmp_path / "c.html")))
    assert out["unit_match_basis"] == "parameter names"
    params = {"block": _run_params(runs["block"]), "pair": _run_params(runs["pair"])}
    groups: list[dict[str, Any]] = out["unit_groups"]
    assert [g["members"] for g in groups] == [
        {"block": ["(root)"], "pair": ["(root)"]},
        {"block": ["blocks.0", "blocks.1"], "pair": ["[blocks.0, blocks.1]"]},
        {"block": ["blocks.2"], "pair": ["blocks.2"]},
    ]
    for g in groups:
        held = {label: {f for u in g["members"][label] for f in params[label][u]} for label in params}
        assert held["block"] == held["pair"], g["name"]
        assert not g["param_bytes_differ"]
        assert g["param_bytes"]["block"] == g["param_bytes"]["pair"] == 4 * sum(
            params["block"][u][f] for u in g["members"]["block"] for f in params["block"][u])
    # every star of a unit row beats the other run by more than the larger of the two spreads
    for g in groups:
        for metric, best in g["best"].items():
            if not best:
                continue
            values = g["values"]
            other = "pair" if best == ["block"] else "block"
            spreads = [s for s in g["spread_ms"].get(metric, {}).values() if s is not None]
            if len(spreads) == 2:
                assert abs(values[best[0]][metric] - values[other][metric]) > max(spreads), (g["name"], metric)


def test_terminal_prints_the_tables(runs: dict[str, Path], capsys: pytest.CaptureFixture[str],
                                    tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    page = tmp_path / "c.html"
    text = stdout_here(capsys, "compare", str(runs["block"]), str(runs["pair"]), "--label", "block", "--label", "pair",
                "-q", "--no-cache", "-o", str(page))
    assert page.exists() and text.rstrip().endswith(f"compare page: {page}")
    assert "runs side by side" in text and "per-unit comparison" in text
    assert "matched by parameter names" in text
    row = next(line for line in text.splitlines() if "blocks.0 + blocks.1" in line)
    assert "[blocks.0, blocks.1]" in row
    step = next(line for line in text.splitlines() if "step time" in line)
    assert "spread" in step


def test_fsdp2_blocks_against_zero3_submodules(recordings: Recordings, capsys: pytest.CaptureFixture[str],
                                               tmp_path: Path) -> None:
    """ZeRO-3 fetching each submodule: its units group under the FSDP2 block that holds the same
    parameters, and its embeddings, norm and head under FSDP2's root."""
    if importlib.util.find_spec("deepspeed") is None:
        pytest.skip("deepspeed is not installed")
    dirs = {}
    for label, name in (("fsdp2", "fsdp2"), ("zero3", "zero3-submodule")):
        rec = recordings.get(EXAMPLE_RUNS[name])
        assert rec.proc.returncode == 0, rec.proc.stderr[-3000:]
        dirs[label] = rec.run_dir
    out = json.loads(stdout_here(capsys, "compare", str(dirs["fsdp2"]), str(dirs["zero3"]), "--label", "fsdp2",
                          "--label", "zero3", "--json", "-q", "-o", str(tmp_path / "c.html")))
    assert out["unit_match_basis"] == "parameter names"
    groups = {g["name"]: g for g in out["unit_groups"]}
    assert list(groups) == ["(root)", "blocks.0", "blocks.1", "blocks.2"]
    params = {label: _run_params(d) for label, d in dirs.items()}
    for g in groups.values():
        held = {label: {f for u in g["members"][label] for f in params[label][u]} for label in params}
        assert held["fsdp2"] == held["zero3"], g["name"]
    assert {"tok_emb", "pos_emb", "norm", "head"} <= set(groups["(root)"]["members"]["zero3"])
