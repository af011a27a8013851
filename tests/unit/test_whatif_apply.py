"""``apply`` (whatif --code): the code names only modules of units whose parameters the recording lists, and says
what it cannot say. The round trip through real recordings is tests/integration/test_whatif_apply_roundtrip.py."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
from helpers.cli import json_here, run_here

SAMPLES = Path(__file__).parents[2] / "sample_traces"


def _apply(capsys: pytest.CaptureFixture[str], sample: str, *options: str) -> dict:
    return json_here(capsys, "whatif", str(SAMPLES / sample), *options, "--json", "-q", "--no-cache")["apply"]


def test_fsdp2_code_names_the_modules_whose_parameters_the_units_hold(capsys: pytest.CaptureFixture[str]) -> None:
    apply = _apply(capsys, "fsdp2-cpu-2rank", "--wrap", "merge:2")
    assert apply["framework"] == "fsdp2" and apply["note"] == ""
    tree = ast.parse(apply["code"])  # valid Python that defines shard_model(model, **fsdp_kwargs)
    functions = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    assert set(functions) == {"submodules", "shard_model"}  # the finder of wrapped paths, and the change
    func = functions["shard_model"]
    assert [a.arg for a in func.args.args] == ["model"]
    named = {c.args[0].value for c in ast.walk(func) if isinstance(c, ast.Call) and isinstance(c.func, ast.Name)
             and c.func.id == "m"}
    run = json.loads((SAMPLES / "fsdp2-cpu-2rank" / "run.json").read_text())
    params = [p for u in run["units"] for p, _ in u["params"]]
    assert named == {"blocks.0", "blocks.1"}
    assert all(any(p.startswith(f"{m}.") for p in params) for m in named)
    assert apply["lines"][0] == 'fully_shard([m("blocks.0"), m("blocks.1")], reshard_after_forward=True, **fsdp_kwargs)'
    assert apply["lines"][-1] == "fully_shard(model, reshard_after_forward=False, **fsdp_kwargs)"


def test_traces_without_run_json_get_no_code_but_what_was_not_resolved(capsys: pytest.CaptureFixture[str]) -> None:
    apply = _apply(capsys, "fsdp2-cpu-2rank-plain", "--wrap", "merge:2")
    assert apply["code"] is None and apply["note"].startswith("not resolved: blocks.0, blocks.1")
    done = run_here(capsys, "whatif", str(SAMPLES / "fsdp2-cpu-2rank-plain"), "--wrap", "merge:2", "--code", "-q")
    assert done.returncode == 2 and done.stdout == "" and done.stderr.startswith("error: no code for wrap merge:2")


def test_every_row_of_the_advisor_carries_its_code(capsys: pytest.CaptureFixture[str]) -> None:
    explored = json_here(capsys, "whatif", str(SAMPLES / "fsdp2-cpu-2rank"), "--explore", "--json", "-q", "--no-cache")
    rows = [*explored["ranked"], *explored["within_spread"], *explored["unranked"], *explored["over_budget"]]
    assert rows and all(r["apply"]["framework"] == "fsdp2" for r in rows)
    # every row has its code, but no prefetch, which FSDP2 cannot be told (below)
    assert {r["setting"] for r in rows if not r["apply"]["code"]} == {"prefetch none"}
    root = next(r for r in rows if r["setting"] == "wrap root")
    assert root["apply"]["lines"] == ["fully_shard(model, reshard_after_forward=False, **fsdp_kwargs)"]


def test_fsdp1_prefetch_none_is_said_as_fsdp1s_argument(capsys: pytest.CaptureFixture[str]) -> None:
    apply = _apply(capsys, "fsdp1-cpu-2rank", "--prefetch", "none")
    assert apply["lines"][-2:] == ["setting = dict(auto_wrap_policy=policy, backward_prefetch=None, forward_prefetch=False)",
                                   "return FSDP(model, **{**fsdp_kwargs, **setting})"]


def test_fsdp2_no_prefetch_has_no_code_as_fsdp2_prefetches_on_an_empty_list(capsys: pytest.CaptureFixture[str]) -> None:
    """torch's own FSDP2 state: an empty backward-prefetch list is its default (one unit ahead), so no
    call says "no prefetch"; the code is refused, saying why."""
    import inspect

    from torch.distributed.fsdp._fully_shard import _fsdp_state

    assert "default_prefetch = len(self._states_to_backward_prefetch) == 0" in inspect.getsource(_fsdp_state)
    apply = _apply(capsys, "fsdp2-cpu-2rank", "--prefetch", "none")
    assert apply["code"] is None and apply["note"].startswith("prefetch none: set_modules_to_backward_prefetch cannot")


def test_a_match_that_splits_a_recorded_unit_is_one_error_line(capsys: pytest.CaptureFixture[str]) -> None:
    """A recording whose first unit is two blocks sharded as one (FSDP2's ``fully_shard([blocks.0,
    blocks.1])``, run.json's own units): a regex that picks blocks.0 alone would cut that unit, which
    FSDP shards whole and whose per-module times the recording lacks. It says so instead of predicting a
    unit named blocks.0 and writing code that shards both."""
    run = Path(__file__).parents[1] / "recorded" / "fsdp2-pair-list" / "run"
    units = [u["unit"] for u in json.loads((run / "run.json").read_text())["units"]]
    assert units == ["(root)", "[blocks.0, blocks.1]", "blocks.2"]
    for option in ("--code", "--json"):
        proc = run_here(capsys, "whatif", str(run), "--wrap", r"match:^blocks\.[02]$", option, "-q", "--no-cache")
        assert proc.returncode == 2 and proc.stderr.count("\n") == 1
        assert proc.stderr.startswith(r"error: --wrap match:^blocks\.[02]$ splits the recorded unit [blocks.0, blocks.1] "
                                      "(it matches blocks.0, not blocks.1)")
    # a match that leaves the pair whole (in the root, or in their parent: one unit of the parent's
    # blocks, named as FSDP2 names a list of modules) still predicts
    for pattern, names in ((r"match:^blocks\.2$", ["(root)", "blocks.2"]), ("match:^blocks$", ["(root)", "[blocks.0, blocks.1, blocks.2]"])):
        whole = json_here(capsys, "whatif", str(run), "--wrap", pattern, "--json", "-q", "--no-cache")
        assert [u["name"] for u in whole["predicted"]["units"]] == names


def test_parameter_names_under_none_of_a_units_modules_get_no_code(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    # run.json's parameter names of a unit must lie under its modules: names that do not (here every one
    # moved under a module the model has not) leave the modules unplaced, and no code is written
    import shutil

    run = tmp_path / "run"
    shutil.copytree(Path(__file__).parents[1] / "recorded" / "fsdp2-pair-list" / "run", run,
                    ignore=shutil.ignore_patterns(".fsdpviz-cache"))
    meta = json.loads((run / "run.json").read_text())
    for unit in meta["units"]:
        unit["params"] = [[f"ghost.{name}", numel] for name, numel in unit["params"]]
    (run / "run.json").write_text(json.dumps(meta))
    apply = json_here(capsys, "whatif", str(run), "--wrap", "merge:2", "--json", "-q", "--no-cache")["apply"]
    assert apply["code"] is None and apply["note"].startswith("not resolved: blocks.0, blocks.1, blocks.2:")


@pytest.mark.slow
def test_fsdp1_code_keeps_the_recorded_strategy_and_takes_a_scripts_own_arguments(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """A recording under ``SHARD_GRAD_OP`` (run.json: no unit but the outermost resharded after forward,
    as the recorder reads FSDP1's strategy) gets code that shards so again: FSDP1's default would be
    ``FULL_SHARD``, not the setting predicted. And a script that passes its usual FSDP arguments through
    ``fsdp_kwargs``, prefetch ones included, gets the predicted setting, not a TypeError for an argument
    given twice. Truth: FSDP1's own module state after the code ran (two gloo ranks: on one, FSDP1 shards
    nothing whatever it is told)."""
    import shutil
    import socket
    import subprocess
    import sys

    run = tmp_path / "run"
    shutil.copytree(SAMPLES / "fsdp1-cpu-2rank", run, ignore=shutil.ignore_patterns(".fsdpviz-cache"))
    meta = json.loads((run / "run.json").read_text())
    for unit in meta["units"]:
        unit["reshard_after_forward"] = False
    (run / "run.json").write_text(json.dumps(meta))
    apply = json_here(capsys, "whatif", str(run), "--prefetch", "none", "--json", "-q", "--no-cache")["apply"]
    assert apply["code"] and "sharding_strategy=ShardingStrategy.SHARD_GRAD_OP" in apply["lines"][-2]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    examples = Path(__file__).parents[2] / "examples"
    script = f"""
import json, sys
import torch, torch.distributed as dist
sys.path.insert(0, {str(examples)!r})
from train import build_model, parse_args
dist.init_process_group("gloo")
{apply["code"]}
from torch.distributed.fsdp import BackwardPrefetch, ShardingStrategy
model = build_model(parse_args(["--framework", "fsdp1", "--layers", "2", "--dim", "32"]))
sharded = shard_model(model, device_id=torch.device("cpu"), backward_prefetch=BackwardPrefetch.BACKWARD_POST,
                      forward_prefetch=True, sharding_strategy=ShardingStrategy.FULL_SHARD)
if dist.get_rank() == 0:
    print(json.dumps({{name or "(root)": [m.sharding_strategy.name, m.backward_prefetch, m.forward_prefetch]
                      for name, m in sharded.named_modules() if isinstance(m, FSDP)}}))
dist.destroy_process_group()
"""
    (tmp_path / "shard.py").write_text(script)
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr",
                           "127.0.0.1", "--master_port", str(port), str(tmp_path / "shard.py")],
                          check=False, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    states = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(states) == 3  # the root and the two blocks, as recorded
    assert all(state == ["SHARD_GRAD_OP", None, False] for state in states.values()), states


def test_fsdp1_code_on_one_rank_does_not_take_no_sharding_for_a_strategy(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """On a shard group of one rank FSDP1 shards nothing (NO_SHARD, whatever it was told), so the recorder
    finds no unit resharded after forward: that is not SHARD_GRAD_OP. The code writes no strategy and
    says to pass the user's own."""
    import shutil

    run = tmp_path / "run"
    shutil.copytree(SAMPLES / "fsdp1-cpu-2rank", run, ignore=shutil.ignore_patterns(".fsdpviz-cache"))
    meta = json.loads((run / "run.json").read_text())
    for unit in meta["units"]:
        unit["reshard_after_forward"], unit["shard_size"] = False, 1
    (run / "run.json").write_text(json.dumps(meta))
    apply = json_here(capsys, "whatif", str(run), "--prefetch", "none", "--json", "-q", "--no-cache")["apply"]
    assert apply["code"] and "sharding_strategy" not in apply["code"]
    assert "a shard group of one rank" in apply["note"] and "pass yours in fsdp_kwargs" in apply["note"]


def test_fsdp1_one_root_unit_is_no_policy() -> None:
    """FSDP1 wraps the model alone without an auto-wrap policy: one root unit's code says so (over any
    policy the caller passes) and finds no module, and it compiles."""
    from fsdpviz.analysis.pipeline import analyse
    from fsdpviz.replay.model import read_model
    from fsdpviz.replay.settings import settings_of
    from fsdpviz.whatif.predict import predict

    run = Path(__file__).parents[2] / "sample_traces" / "fsdp1-cpu-2rank"
    apply = predict(read_model(analyse([run], cache=False, progress=False)), settings_of(wrap="root")).apply
    assert apply is not None and apply.code is not None
    assert "auto_wrap_policy=None" in apply.code and "submodules" not in apply.code and "CustomPolicy" not in apply.code
    compile(apply.code, "shard_model.py", "exec")
