"""FSDP1 units merged into one: which of a member's gradient blocks wait for the one flat gradient.

Autograd makes an FSDP1 unit's flat gradient from its parameters' own gradients when the unit's
backward ends; merged, the members' parameter gradients wait until the last member's backward. A
unit's backward also frees other gradient-like temporaries before its flat gradient (an expert loop's,
one the size of a weight), which do not wait. Built by hand, so the answer is known by construction:
two members ``b`` then ``a`` in backward, each with parameters of 1,000, 1,000 and 24 elements and one
weight-sized temporary freed early. Parameters in fp32 (run.json's 4 bytes per element), gradients in
bf16 (2 bytes: a mixed-precision policy), read off the flat gradient's size; on a GPU the caching
allocator reports blocks rounded up to 512 bytes.
"""

from __future__ import annotations

import pytest

from fsdpviz import vocabulary
from fsdpviz.analysis import memory_categories as mcat
from fsdpviz.replay.memory import Block, MemorySetting, _flat_gradients

SIZES = (1000, 1000, 24)  # each member's parameters, in elements


def _grad(unit: str, alloc: int, free: int, n: int) -> Block:
    return Block(unit=unit, category=mcat.UNSHARDED_GRADS, phase=vocabulary.BACKWARD, alloc=alloc, free=free, bytes=n)


def _member(unit: str, t: int, each: int, rounded: bool) -> list[Block]:
    """A member's backward from ``t``: an early temporary of a weight's size, its parameters' gradients
    (freed when its flat gradient is made, at ``t + 10``), and the flat gradient."""
    def size(n: int) -> int:
        return -(-n * each // 512) * 512 if rounded else n * each

    return [_grad(unit, t - 5, t - 2, size(SIZES[0])),  # the temporary, freed long before
            *(_grad(unit, t + i, t + 10, size(n)) for i, n in enumerate(SIZES)),
            _grad(unit, t + 9, t + 30, size(sum(SIZES)))]


def _setting(element_bytes: int) -> MemorySetting:
    units = ["a", "b"]
    return MemorySetting(group=dict.fromkeys(units, "[a, b]"), order=units, reshard=dict.fromkeys(units, True),
                         recorded_reshard=dict.fromkeys(units, True), prefetch="recorded", scale=1.0,
                         drop_gather_buffers=False, framework=vocabulary.FSDP1,
                         unit_params=dict.fromkeys(units, SIZES), element_bytes=element_bytes)


@pytest.mark.parametrize(("each", "rounded"), [(2, False), (4, False), (4, True)],
                         ids=["bf16-gradients-of-fp32-parameters", "fp32", "fp32-cuda-blocks"])
def test_a_members_parameter_gradients_wait_and_its_temporary_does_not(each: int, rounded: bool) -> None:
    b = _member("b", 10, each, rounded)  # first in backward
    a = _member("a", 40, each, rounded)  # last: its flat gradient is the merged one's making
    out, waiting = _flat_gradients(_setting(element_bytes=4), [*b, *a])
    # every member's three parameter gradients wait until a's are freed (the merged flat gradient's making)
    assert sorted((w.alloc, w.bytes) for w in waiting) == sorted((blk.alloc, blk.bytes) for blk in (*b[1:4], *a[1:4]))
    assert {w.free for w in waiting} == {a[1].free}
    # the early temporaries are left where they were, whatever their size
    assert b[0] in out and a[0] in out and not {w.alloc for w in waiting} & {b[0].alloc, a[0].alloc}
