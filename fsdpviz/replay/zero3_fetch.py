"""Which parameters DeepSpeed ZeRO-3 gathers together in forward, and how long each gather's buffer
lives, for a prefetch bucket (``stage3_prefetch_bucket_size``) -- what the memory model moves when
the bucket changes (:mod:`.memory`), and the gathers the replay's program issues then
(:mod:`.program`).

Read off DeepSpeed's own source (``runtime/zero/partitioned_param_coordinator.py`` and
``partition_parameters.py``, 0.19), once its trace of the step is complete:

- every module DeepSpeed hooks is *fetched* when its forward starts (``fetch_sub_module``), in the
  recorded order -- modules without parameters of their own too (a block around its layers, the root);
- a fetch first gathers the module's own parameters that are not gathered yet, as one gather; then
  waits for them; then *prefetches*: it takes parameters off the step's parameter queue (the modules'
  parameters in fetch order, each module's in ``ds_id`` order: as it registers them), skipping those
  gathered already, until their elements reach the bucket (the last one taken may pass it), and
  gathers them as one more gather. A bucket of 0 prefetches nothing;
- a gather of several parameters (``all_gather_coalesced``) allocates one flat buffer of every
  parameter's partition (``ceil(numel / shards)`` elements) times the shards; the first wait on it
  copies every parameter out of it (``torch.cat``), and the buffer lives as long as the gather's
  handle: until the last of its parameters has been waited for, at the fetch of that parameter's
  module. A gather of one parameter gathers into a buffer that becomes the parameter itself: no
  buffer apart from it;
- with ``stage3_max_reuse_distance`` at its default (1e9 elements), no parameter used again in the
  step is released in forward, so the forward's fetches are the only gathers until backward.

Where this stops: ``stage3_max_live_parameters`` below the model's elements would stop a prefetch
early (run.json does not record it); a module DeepSpeed hooks that is no unit (a parameterless
activation module) prefetches too, and is not in the recorded units' order; a parameter shared by two
modules is counted in both; parameters DeepSpeed keeps whole on every rank
(``stage3_param_persistence_threshold``, not in run.json) are gathered by nobody, so the caller leaves out
the units the recording never gathered.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Gather:
    """One gather of the forward: issued at ``issuer``'s fetch, its buffer freed at ``freed_by``'s."""

    issuer: str  # the unit whose fetch issued it
    params: tuple[tuple[str, int], ...]  # (unit, index of the parameter in the unit)
    buffer_elements: int  # the flat buffer's elements (0: one parameter, gathered into itself)
    freed_by: str  # the unit whose fetch waits for its last parameter (the buffer goes then)


def forward_gathers(order: Sequence[str], params: Mapping[str, Sequence[int]], bucket: int,
                    shards: int) -> list[Gather]:
    """The gathers of one forward: ``order`` the units in fetch order, ``params`` each unit's
    parameters' elements (in ``ds_id`` order), ``bucket`` the prefetch bucket in elements,
    ``shards`` the ranks each parameter is partitioned over."""
    queue = [(unit, i, n) for unit in order for i, n in enumerate(params.get(unit, ()))]
    gathered: dict[tuple[str, int], int] = {}  # parameter -> index of the gather that carries it
    gathers: list[list[tuple[str, int]]] = []
    issuers: list[str] = []
    waited_last: dict[int, str] = {}
    at = 0  # the queue's front

    def gather(unit: str, taken: list[tuple[str, int]]) -> None:
        for p in taken:
            gathered[p] = len(gathers)
        gathers.append(taken)
        issuers.append(unit)

    for unit in order:
        own = [(unit, i) for i in range(len(params.get(unit, ())))]
        missing = [p for p in own if p not in gathered]
        if missing:
            gather(unit, missing)
        for p in own:  # the wait pops each parameter's handle: the last pop frees a coalesced buffer
            waited_last[gathered[p]] = unit
        while at < len(queue) and queue[at][0] == unit:  # this fetch's own parameters leave the queue
            at += 1
        taken: list[tuple[str, int]] = []
        elements = 0
        while bucket > 0 and at < len(queue) and elements < bucket:
            u, i, n = queue[at]
            at += 1
            if (u, i) not in gathered and (u, i) not in taken:
                taken.append((u, i))
                elements += n
        if taken:
            gather(unit, taken)
    out = []
    for k, taken in enumerate(gathers):
        partition = sum(math.ceil(params[u][i] / shards) for u, i in taken)
        out.append(Gather(issuer=issuers[k], params=tuple(taken),
                          buffer_elements=partition * shards if len(taken) > 1 else 0,
                          freed_by=waited_last.get(k, order[-1])))
    return out
