"""torch's fake process group for tests that shard a model for real in their own process."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from fsdpviz.naming import ROOT_UNIT, clean_fqn


def fake_process_group(world_size: int) -> Iterator[None]:
    """Rank 0 of a fake group of ``world_size`` while the generator is suspended (a fixture's body):
    FSDP2 shards for real, no collective runs. Skips where a group already exists in the process."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        pytest.skip("a process group is already initialised in this process")
    dist.init_process_group("fake", rank=0, world_size=world_size, store=FakeStore())
    yield
    dist.destroy_process_group()


def run_shard_code(code: str, model: Any, names: dict[Any, str]) -> tuple[Any, dict[str, list[str]]]:
    """``shard_model`` of ``code`` (whatif's written code) run on ``model``, and FSDP2's own units it left:
    each state's parameters (``names``: each module's path as fsdpviz names it), by the state's first
    module."""
    from torch.distributed.fsdp import FSDPModule

    namespace: dict = {}
    exec(compile(code, "shard_model", "exec"), namespace)  # noqa: S102 - the code under test
    sharded = namespace["shard_model"](model)
    got: dict[str, list[str]] = {}
    seen = set()
    for fqn, module in sharded.named_modules():
        state = module._get_fsdp_state() if isinstance(module, FSDPModule) else None
        if state is None or id(state) in seen or state._fsdp_param_group is None:
            continue
        seen.add(id(state))
        got[clean_fqn(fqn)] = sorted(
            ".".join(x for x in (names[p._module_info.module], p._module_info.param_name) if x and x != ROOT_UNIT)
            for p in state._fsdp_param_group.fsdp_params)
    return sharded, got


def unit_params(model: Any, units: list[str]) -> dict[str, list[str]]:
    """Each of ``units``' own parameters as run.json lists them: those under its module and under no
    nested unit's (the root holds the rest)."""
    def owner(name: str) -> str:
        held = [u for u in units if u != ROOT_UNIT and name.startswith(f"{u}.")]
        return max(held, key=len) if held else ROOT_UNIT
    out: dict[str, list[str]] = {}
    for name, _ in model.named_parameters():
        out.setdefault(owner(name), []).append(name)
    return out
