"""``--wrap match:`` naming a module that holds recorded units whole and no parameter of its own: a
ModuleList of experts, each expert sharded apart inside its block, as mixture-of-experts stacks shard
them. Its units become one (as a merge makes them) and nothing of the block's own parameters moves;
a module that also holds the block's own parameters (``moe``, with the router) is still refused.

The model is built here and sharded by torch's FSDP2 on its fake process group; each unit's parameters
are read off the model as run.json lists them (a unit's own: under its module and no nested unit's).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from helpers.fakegroup import fake_process_group, run_shard_code, unit_params
from torch import nn

from fsdpviz.errors import UsageError
from fsdpviz.naming import ROOT_UNIT, unit_modules
from fsdpviz.replay import program as prog
from fsdpviz.replay.recorded import Recording
from fsdpviz.replay.settings import GIVEN, Settings, Wrap
from fsdpviz.vocabulary import FSDP2
from fsdpviz.whatif.apply import apply_code

EXPERTS = 3


class MoE(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.router = nn.Linear(dim, EXPERTS)
        self.experts = nn.ModuleList(nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))
                                     for _ in range(EXPERTS))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights = self.router(x).softmax(-1)
        return sum(weights[..., i:i + 1] * expert(x) for i, expert in enumerate(self.experts))


class Block(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.proj = nn.Linear(dim, dim)
        self.moe = MoE(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.moe(self.proj(self.norm(x)))


class Model(nn.Module):
    def __init__(self, dim: int = 16) -> None:
        super().__init__()
        self.emb = nn.Embedding(32, dim)
        self.blocks = nn.ModuleList(Block(dim) for _ in range(2))
        self.head = nn.Linear(dim, 32)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.emb(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


BLOCKS = ["blocks.0", "blocks.1"]
UNITS = [ROOT_UNIT, *(u for b in BLOCKS for u in (b, *(f"{b}.moe.experts.{e}" for e in range(EXPERTS))))]


def _params(model: nn.Module) -> dict[str, list[str]]:
    return unit_params(model, UNITS)


def _recording(params: dict[str, list[str]] | None) -> Recording:
    return Recording(framework=FSDP2, device="cpu", world_size=2, units=list(UNITS),
                     unit_bytes=dict.fromkeys(UNITS, 4096), modules={u: [u] for u in UNITS},
                     reshard_after_forward={u: u != ROOT_UNIT for u in UNITS}, prefetch="implicit", steps=[],
                     ranks_per_host=2, cpu_count=0, prefetch_depths=(0, 0),
                     unit_param_names={u: tuple(p) for u, p in (params or {}).items()})


def _experts(block: str) -> str:
    return "[" + ", ".join(f"{block}.moe.experts.{e}" for e in range(EXPERTS)) + "]"


def test_a_list_of_expert_units_becomes_one_unit_and_takes_nothing_of_its_block() -> None:
    rec = _recording(_params(Model()))
    group = prog.group_units(rec, Settings(wrap=Wrap("match", pattern=r"^blocks\.\d+$|experts$")))
    assert group == {ROOT_UNIT: ROOT_UNIT, **{b: b for b in BLOCKS},
                     **{f"{b}.moe.experts.{e}": _experts(b) for b in BLOCKS for e in range(EXPERTS)}}
    # experts alone: each block's experts one unit, the blocks' own parameters go to the root
    group = prog.group_units(rec, Settings(wrap=Wrap("match", pattern=r"experts$")))
    assert {group[b] for b in BLOCKS} == {ROOT_UNIT}
    assert group["blocks.1.moe.experts.2"] == _experts("blocks.1")
    # the blocks alone: each block one unit of its own module, its experts' parameters with it (FSDP2's
    # fully_shard of the block, the experts no longer sharded apart)
    group = prog.group_units(rec, Settings(wrap=Wrap("match", pattern=r"^blocks\.\d+$")))
    assert group == {ROOT_UNIT: ROOT_UNIT, **{b: b for b in BLOCKS},
                     **{f"{b}.moe.experts.{e}": b for b in BLOCKS for e in range(EXPERTS)}}
    # moe holds the router, a parameter of its block's own unit: a unit of it would split the block
    with pytest.raises(UsageError, match=r"makes units inside recorded units \(blocks.0.moe, blocks.1.moe\)"):
        prog.group_units(rec, Settings(wrap=Wrap("match", pattern=r"moe$")))


def test_without_the_units_parameters_a_module_inside_a_unit_is_refused() -> None:
    # a recording whose run.json lists no parameters: whether experts holds the block's cannot be known
    with pytest.raises(UsageError, match=r"makes units inside recorded units \(blocks.0.moe.experts"):
        prog.group_units(_recording(None), Settings(wrap=Wrap("match", pattern=r"experts$")))


@pytest.fixture(scope="module")
def fake_group() -> Iterator[None]:
    """torch's fake process group (rank 0 of 2): FSDP2 shards for real, no collective runs."""
    yield from fake_process_group(2)


@pytest.mark.parametrize("pattern", [r"^blocks\.\d+$|experts$", r"^blocks\.\d+$"])
def test_the_written_code_makes_fsdp2_build_the_predicted_units(fake_group: None, pattern: str) -> None:
    torch.manual_seed(0)
    model = Model()
    names = {module: fqn for fqn, module in model.named_modules()}
    params = _params(model)
    rec = _recording(params)
    settings = Settings(wrap=Wrap("match", pattern=pattern), sources={"wrap": GIVEN})
    apply = apply_code(rec, params, settings, "wrap match")
    assert apply.code is not None, apply.note
    sharded, got = run_shard_code(apply.code, model, names)
    _, new_units, members = prog.regrouped(rec, settings)
    # the root and each block, and each block's experts where they are matched
    assert len(new_units) == 1 + len(BLOCKS) * (2 if "experts" in pattern else 1)
    assert got == {unit_modules(n)[0]: sorted(p for u in members[n] for p in params.get(u, [])) for n in new_units}
    sharded(torch.randint(32, (2, 8))).sum().backward()
