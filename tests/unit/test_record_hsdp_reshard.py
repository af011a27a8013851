"""The recorder reads FSDP2's ``reshard_after_forward=<int>`` off FSDP2's own state (run.json
``units[].reshard_after_forward_size``): a model sharded for real under torch's fake process group of 4,
its blocks resharded to 2 ranks after forward, one block with ``True`` and the root with ``False``."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from helpers.fakegroup import fake_process_group

from fsdpviz.record.units import build_fsdp2_units


@pytest.fixture(scope="module")
def fake_group_of_4() -> Iterator[None]:
    yield from fake_process_group(4)


def test_the_int_each_unit_was_sharded_with_is_recorded(fake_group_of_4: None) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (4,))
    model = torch.nn.Sequential(*(torch.nn.Linear(8, 8) for _ in range(3)), torch.nn.LayerNorm(8))  # the root's own
    fully_shard(model[0], mesh=mesh, reshard_after_forward=2)
    fully_shard(model[1], mesh=mesh, reshard_after_forward=2)
    fully_shard(model[2], mesh=mesh, reshard_after_forward=True)
    fully_shard(model, mesh=mesh, reshard_after_forward=False)
    units = {u.unit: u for u in build_fsdp2_units(model)}
    assert {name: (u.reshard_after_forward, u.reshard_after_forward_size) for name, u in units.items()} == {
        "0": (True, 2), "1": (True, 2), "2": (True, None), "(root)": (False, None)}
    assert units["0"].to_json()["reshard_after_forward_size"] == 2
