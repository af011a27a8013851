"""Prefetch in each framework's own words: what a recording's arguments were, and what a predicted
prefetch setting would be as the arguments a user writes.

The model speaks of prefetch as a depth: ``implicit`` (the framework's own default; FSDP2's and FSDP1's:
nothing ahead in forward, one unit ahead in backward), ``none`` (nothing ahead) and ``N`` (N units ahead in both
passes). Users write their framework's arguments instead:

- FSDP2: ``set_modules_to_forward_prefetch`` / ``set_modules_to_backward_prefetch`` lists (``N``: the
  next N units), or nothing (``implicit``). A recording may have other depths in the two passes
  (backward-only prefetch): the model's depth is the forward one, and :func:`fsdp2_depths` keeps both
  for the code that writes the recorded setting back;
- FSDP1: ``forward_prefetch`` (one unit ahead in forward) and ``backward_prefetch`` (``BACKWARD_PRE`` /
  ``BACKWARD_POST``: one unit ahead in backward; None: none). FSDP1 prefetches at most one unit ahead,
  so a depth of 2 or more has no FSDP1 arguments;
- ZeRO-3: ``stage3_prefetch_bucket_size``, in parameter elements: the parameters fetched ahead of the
  module in use. A predicted depth of N units is given as the bucket that holds the largest N
  consecutive units' elements; ``none`` is 0. A recorded bucket of any other size is read as
  ``implicit`` (DeepSpeed's own trace-based prefetch within that bucket), with the recorded size said
  beside it: how many units a bucket holds changes along the model, so it is no one depth.

run.json's ``units[].forward_prefetch`` / ``backward_prefetch`` hold what the recorder read from the
framework (docs/run-folder.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from fsdpviz.runfolder import RunInfo, UnitInfo
from fsdpviz.vocabulary import FSDP1, FSDP2, ZERO3

IMPLICIT: Final = "implicit"
NONE: Final = "none"
FSDP1_BACKWARD_DEFAULT: Final = "BACKWARD_PRE"  # FSDP1's own default
FSDP1_MAX_DEPTH: Final = 1
NO_FSDP2_NONE: Final = ("cannot be said: an empty list is FSDP2's default, which prefetches one unit ahead in "
                        "backward; no FSDP2 argument turns that off")
ZERO3_DEFAULT_BUCKET: Final = 50_000_000  # DeepSpeed's stage3_prefetch_bucket_size default (elements)


def _first(units: Sequence[UnitInfo], field: str) -> object:
    values = [getattr(u, field) for u in units if getattr(u, field) is not None]
    return values[0] if values else None


def recorded(run: RunInfo | None, framework: str) -> tuple[str, dict[str, object]]:
    """The recording's prefetch as the model's depth, and the framework's own arguments that gave it
    (empty where run.json does not say: traces recorded without fsdpviz)."""
    if run is None or not run.units:
        return IMPLICIT, {}
    units = run.units
    if framework == FSDP2:
        depths = fsdp2_depths(run)
        if depths is None:  # a run.json of units whose prefetch lists it does not say: nothing to name
            return IMPLICIT, {}
        depth, backward = depths
        args: dict[str, object] = {"set_modules_to_forward_prefetch": f"the next {depth} unit(s)" if depth else
                                   "not called (FSDP2's implicit prefetch)"}
        if backward and backward != depth:
            # backward-only prefetch, or other depths in the two passes: the model's one depth is the
            # forward one (the replay keeps the recorded issue order); the arguments say both
            args["set_modules_to_backward_prefetch"] = f"the previous {backward} unit(s)"
        return (str(depth) if depth else IMPLICIT), args
    if framework == FSDP1:
        ahead, behind = _first(units, "forward_prefetch"), _first(units, "backward_prefetch")
        if ahead is None and behind is None:
            return IMPLICIT, {}
        args = {"forward_prefetch": bool(ahead), "backward_prefetch": behind}
        if ahead:
            return "1", args
        return (IMPLICIT if behind else NONE), args
    if framework == ZERO3:
        bucket = _first(units, "forward_prefetch")
        if not isinstance(bucket, int) or isinstance(bucket, bool):
            return IMPLICIT, {}
        return (NONE if bucket == 0 else IMPLICIT), {"stage3_prefetch_bucket_size": bucket}
    return IMPLICIT, {}


def fsdp2_depths(run: RunInfo | None) -> tuple[int, int] | None:
    """FSDP2's explicit prefetch depths as recorded, (forward, backward): the longest
    ``set_modules_to_forward_prefetch`` / ``set_modules_to_backward_prefetch`` list of any unit (0: no
    list, FSDP2's default); None where run.json does not say (traces recorded without fsdpviz)."""
    if run is None or not run.units or all(u.forward_prefetch is None for u in run.units):
        return None

    def longest(field: str) -> int:
        return max((len(v) for u in run.units if isinstance(v := getattr(u, field), list)), default=0)

    return longest("forward_prefetch"), longest("backward_prefetch")


def arguments(framework: str, depth: str, unit_numels: Sequence[int]) -> dict[str, object] | None:
    """The framework's arguments for the model's prefetch ``depth`` (``unit_numels``: the units'
    parameter elements in forward order, for ZeRO-3's bucket); None where the framework cannot
    express it (FSDP1 beyond one unit ahead)."""
    if framework == FSDP2:
        if depth == IMPLICIT:
            return {"set_modules_to_forward_prefetch": "not called (FSDP2's implicit prefetch)"}
        if depth == NONE:
            # FSDP2 prefetches one unit ahead in backward whenever a unit's backward list is empty
            # (FSDPState._pre_backward: default_prefetch = not _states_to_backward_prefetch)
            return {"set_modules_to_forward_prefetch": "[] for every unit (FSDP2's default)",
                    "set_modules_to_backward_prefetch": NO_FSDP2_NONE}
        return {"set_modules_to_forward_prefetch": f"the next {depth} unit(s)",
                "set_modules_to_backward_prefetch": f"the previous {depth} unit(s)"}
    if framework == FSDP1:
        if depth == IMPLICIT:
            return {"forward_prefetch": False, "backward_prefetch": FSDP1_BACKWARD_DEFAULT}
        if depth == NONE:
            return {"forward_prefetch": False, "backward_prefetch": None}
        if int(depth) <= FSDP1_MAX_DEPTH:
            return {"forward_prefetch": True, "backward_prefetch": FSDP1_BACKWARD_DEFAULT}
        return None
    if framework == ZERO3:
        if depth == IMPLICIT:
            return {"stage3_prefetch_bucket_size": ZERO3_DEFAULT_BUCKET}
        if depth == NONE:
            return {"stage3_prefetch_bucket_size": 0}
        n = int(depth)
        windows = [sum(unit_numels[i:i + n]) for i in range(max(1, len(unit_numels) - n + 1))]
        return {"stage3_prefetch_bucket_size": max(windows) if windows else 0}
    return None


DEFAULT_WORDS: Final = {
    FSDP2: "FSDP2's default: one unit ahead in backward, none in forward",
    FSDP1: "FSDP1's default: one unit ahead in backward (BACKWARD_PRE), none in forward",
    ZERO3: "DeepSpeed's own prefetch within its bucket",
}
UNSAID: Final = "assumed the framework's default: the recording does not say its prefetch arguments (run.json)"


def depth_words(framework: str, depth: str, args: dict[str, object] | None) -> str:
    """The model's prefetch ``depth`` as the framework knows it, where ``args`` (the framework's own
    arguments of the setting, :func:`recorded` / :func:`arguments`) say which: ``implicit`` is each
    framework's own default (:data:`DEFAULT_WORDS`), not FSDP2's term alone; FSDP1's backward-only
    prefetch is ``implicit`` whichever ``backward_prefetch`` gives it; without arguments nothing says
    which (:data:`UNSAID`)."""
    if depth != IMPLICIT or framework not in DEFAULT_WORDS:
        return depth
    if not args:
        return f"{IMPLICIT}, {UNSAID}"
    if framework == FSDP1 and args.get("backward_prefetch") != FSDP1_BACKWARD_DEFAULT:
        return f"{IMPLICIT}, one unit ahead in backward ({args.get('backward_prefetch')}), none in forward"
    if framework == FSDP2 and "set_modules_to_backward_prefetch" in args:  # backward-only lists
        return f"{IMPLICIT} in forward (none ahead), {args['set_modules_to_backward_prefetch']} in backward"
    return f"{IMPLICIT}, {DEFAULT_WORDS[framework]}"


def words(args: dict[str, object]) -> str:
    """``forward_prefetch=True, backward_prefetch=BACKWARD_PRE``."""
    return ", ".join(f"{k}={v}" for k, v in args.items())
