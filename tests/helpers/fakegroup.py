"""torch's fake process group for tests that shard a model for real in their own process."""

from __future__ import annotations

from collections.abc import Iterator

import pytest


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
