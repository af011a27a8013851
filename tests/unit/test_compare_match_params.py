"""Unit matching by the parameters units hold, against the example model's own parameters.

The unit tables are read off ``examples/train.py``'s model with torch (``named_parameters``), not
from fsdpviz: per block (``blocks.N``), pairs with ``fully_shard([a, b])`` (``[blocks.0, blocks.1]``,
same FQNs), the example's ``--wrap pair`` restructuring (``blocks.0+1.0.qkv.weight``) and a
restructuring whose names mislead: ``blocks.0`` of the pair model holds what ``blocks.0`` and
``blocks.1`` hold per block. Every row must hold the same parameters in every run.
"""

from __future__ import annotations

import runpy
from pathlib import Path
from typing import Any

import pytest
from torch import nn

from fsdpviz.analysis.compare.units import (
    BY_FQN,
    BY_PARAM_SIZES,
    BY_UNIT_SIZES,
    RunUnit,
    match_units,
)

EXAMPLE = runpy.run_path(str(Path(__file__).resolve().parents[2] / "examples" / "train.py"))
LAYERS = 4
FLOAT32 = 4


def _model(wrap: str = "block") -> Any:
    return EXAMPLE["build_model"](EXAMPLE["parse_args"](["--layers", str(LAYERS), "--dim", "32", "--wrap", wrap]))


def _units(model: nn.Module, unit_names: list[str], *, with_params: bool = True,
           modules: dict[str, list[str]] | None = None) -> list[RunUnit]:
    """RunUnits in forward order: ``(root)`` first (FSDP2 runs the root's pre-forward first), then
    ``unit_names``; each holds the parameters under its modules that no later unit claims."""
    named = list(model.named_parameters())
    claimed: dict[str, str] = {}
    for unit in unit_names:
        for module in (modules or {}).get(unit, [unit]):
            for fqn, _ in named:
                if fqn.startswith(module + "."):
                    claimed[fqn] = unit
    out = []
    for order, unit in enumerate(["(root)", *unit_names]):
        params = tuple((fqn, p.numel()) for fqn, p in named if claimed.get(fqn, "(root)") == unit)
        out.append(RunUnit(unit, order, FLOAT32 * sum(n for _, n in params), params=params if with_params else ()))
    return out


def _per_block(**kw: Any) -> list[RunUnit]:
    return _units(_model(), [f"blocks.{i}" for i in range(LAYERS)], **kw)


def _pair_list() -> list[RunUnit]:
    names = [f"[blocks.{i}, blocks.{i + 1}]" for i in range(0, LAYERS, 2)]
    return _units(_model(), names, modules={n: [f"blocks.{i}", f"blocks.{i + 1}"]
                                             for n, i in zip(names, range(0, LAYERS, 2))})


def _misleading_pairs(**kw: Any) -> list[RunUnit]:
    """``blocks`` regrouped into a ModuleList of pairs: unit ``blocks.0`` holds blocks 0 and 1."""
    model = _model()
    blocks = list(model.blocks.children())
    model.blocks = nn.ModuleList(EXAMPLE["BlockPair"](*blocks[i:i + 2]) for i in range(0, LAYERS, 2))
    return _units(model, [f"blocks.{i}" for i in range(LAYERS // 2)], **kw)


def _fqns(units: list[RunUnit], names: list[str]) -> set[str]:
    return {f for u in units if u.name in names for f, _ in u.params}


def _assert_same_parameters(match: Any, runs: dict[str, list[RunUnit]]) -> None:
    """Every row holds the same parameter count in every run, and every parameter is in one row."""
    for group in match.groups:
        counts = {label: sum(n for u in runs[label] if u.name in group.members[label] for _, n in u.params)
                  for label in runs}
        assert len(set(counts.values())) == 1, (group.name, counts)
        assert not group.bytes_differ
    for label, units in runs.items():
        rows = [n for g in match.groups for n in g.members[label]]
        assert sorted(rows) == sorted(u.name for u in units)


def test_fully_shard_pairs_match_per_block_by_fqn() -> None:
    runs = {"block": _per_block(), "pair": _pair_list()}
    match = match_units(runs)
    assert match.basis == BY_FQN
    _assert_same_parameters(match, runs)
    assert [g.members for g in match.groups] == [
        {"block": ["(root)"], "pair": ["(root)"]},
        {"block": ["blocks.0", "blocks.1"], "pair": ["[blocks.0, blocks.1]"]},
        {"block": ["blocks.2", "blocks.3"], "pair": ["[blocks.2, blocks.3]"]},
    ]
    # the FSDP2 group's name covers exactly those modules
    assert [g.name for g in match.groups] == ["(root)", "[blocks.0, blocks.1]", "[blocks.2, blocks.3]"]
    block01 = match.groups[1]
    assert _fqns(runs["block"], block01.members["block"]) == _fqns(runs["pair"], block01.members["pair"])


def test_restructured_pairs_match_by_parameter_sizes() -> None:
    model = _model("pair")
    pair = _units(model, [f"blocks.{n}" for n, _ in model.blocks.named_children()])
    runs = {"block": _per_block(), "pair": pair}
    match = match_units(runs)
    assert match.basis == BY_PARAM_SIZES  # the FQNs changed (blocks.0+1.0.qkv.weight)
    _assert_same_parameters(match, runs)
    assert [g.members["pair"] for g in match.groups] == [["(root)"], ["blocks.0+1"], ["blocks.2+3"]]
    assert [g.members["block"] for g in match.groups] == [["(root)"], ["blocks.0", "blocks.1"],
                                                           ["blocks.2", "blocks.3"]]


@pytest.mark.parametrize("with_params", [True, False], ids=["fqns-recorded", "names-only"])
def test_misleading_names_are_not_matched(with_params: bool) -> None:
    runs = {"block": _per_block(with_params=with_params), "pair": _misleading_pairs(with_params=with_params)}
    match = match_units(runs)
    assert match.basis == (BY_PARAM_SIZES if with_params else BY_UNIT_SIZES)
    assert [g.members for g in match.groups] == [
        {"block": ["(root)"], "pair": ["(root)"]},
        {"block": ["blocks.0", "blocks.1"], "pair": ["blocks.0"]},
        {"block": ["blocks.2", "blocks.3"], "pair": ["blocks.1"]},
    ]
    # "blocks.0" means different parameters in the two runs: the row is named by the finer run
    assert [g.name for g in match.groups] == ["(root)", "blocks.0 + blocks.1", "blocks.2 + blocks.3"]
    assert not any(g.bytes_differ for g in match.groups)
    # (root) is set against (root) only: it holds the embeddings, norm and head in both runs
    root = match.groups[0]
    assert root.param_bytes["block"] == root.param_bytes["pair"]


def test_zero3_submodules_with_parameterless_parents_match_blocks() -> None:
    """ZeRO-3 fetching each submodule, plus the parent blocks and root as units of no parameters."""
    model = _model()
    fetched = [n for n, m in model.named_modules() if n and list(m.parameters(recurse=False))]
    units = []
    for order, name in enumerate(["(root)", *(f"blocks.{i}" for i in range(LAYERS)), *fetched]):
        own = [] if name == "(root)" or name.count(".") == 1 else \
            [(f"{name}.{p}", t.numel()) for p, t in model.get_submodule(name).named_parameters(recurse=False)]
        units.append(RunUnit(name, order, FLOAT32 * sum(n for _, n in own), params=tuple(own)))
    runs = {"fsdp2": _per_block(), "zero3": units}
    match = match_units(runs)
    assert match.basis == BY_FQN
    names = [g.name for g in match.groups]
    assert names == ["(root)", *(f"blocks.{i}" for i in range(LAYERS))]
    block1 = match.groups[2]
    assert block1.members["fsdp2"] == ["blocks.1"]
    assert block1.members["zero3"][0] == "blocks.1"  # the parent block, then its submodules
    assert set(block1.members["zero3"][1:]) == {f"blocks.1.{c}" for c, _ in model.blocks[1].named_children()}
    assert "(root)" in match.groups[0].members["zero3"]
    assert {"tok_emb", "pos_emb", "norm", "head"} <= set(match.groups[0].members["zero3"])


def test_root_only_run_is_whole_model_with_parameters() -> None:
    model = _model()
    whole = [RunUnit("(root)", 0, FLOAT32 * sum(p.numel() for p in model.parameters()),
                     params=tuple((f, p.numel()) for f, p in model.named_parameters()))]
    match = match_units({"block": _per_block(), "root": whole})
    assert match.whole_model == {"root": "(root)"}
    assert [g.members["block"] for g in match.groups] == [["(root)"], *([f"blocks.{i}"] for i in range(LAYERS))]
    assert all(g.held_by == {"root": "(root)"} for g in match.groups)


@pytest.mark.parametrize("with_params", [True, False], ids=["fqns-recorded", "names-only"])
def test_different_models_say_whether_their_parameters_were_listed(with_params: bool) -> None:
    """Two models of the example, of other depths and widths (torch's own parameters: the names and the
    sizes differ): no match by parameters, so the units are matched by name; whether that is because
    the parameters differ or because they were not recorded is what compare's note says
    (analysis/compare/runs.py)."""
    small = EXAMPLE["build_model"](EXAMPLE["parse_args"](["--layers", "2", "--dim", "48"]))
    runs = {"deep": _units(_model(), [f"blocks.{i}" for i in range(LAYERS)], with_params=with_params),
            "small": _units(small, ["blocks.0", "blocks.1"], with_params=with_params)}
    match = match_units(runs)
    assert match.basis not in (BY_FQN, BY_PARAM_SIZES)
    assert match.params_listed is with_params
