"""Which trace ranges mean what: the one place the analysis reads a gather, a reduction, a
``zero_grad`` or an optimizer step off the labels (labels.LABELS) and range names.

- **gather**: FSDP2's ``FSDP::all_gather (u)`` and fsdpviz's ``fsdpviz::all_gather (u)`` (FSDP1,
  ZeRO-3). FSDP2's gather makes the all-gather output; its ``FSDP::all_gather_copy_out (u)`` copies it
  into the unsharded parameters. fsdpviz's gather writes straight into the parameters.
- **gather into parameters**: FSDP2's copy-out, fsdpviz's gather.
- **reduce**: a unit's gradient reduction, FSDP2's ``FSDP::post_backward_reduce (u)`` or fsdpviz's
  ``fsdpviz::reduce_scatter (u)``.
- **post-backward**: the reductions and FSDP2's other post-backward labels (reshard, accumulation),
  and FSDP1's ``FullyShardedDataParallel._post_backward_hook`` (a range that names no unit).
- **optimizer step**: ``Optimizer.step#Class.step`` (torch.optim's own range, any class).
- **zero_grad**: ``Optimizer.zero_grad#Class.zero_grad``. ``nn.Module.zero_grad`` (the transformers
  Trainer's ``model.zero_grad()``) leaves no range: sharded gradients are found without it
  (:mod:`fsdpviz.analysis.memory_categories`).
- **data loading**: ``enumerate(DataLoader)#...`` (the profiler's range around a batch's ``next()``).
"""

from __future__ import annotations

import re
from typing import Final

import numpy as np
import pandas as pd

from fsdpviz.structure.categorical import as_str
from fsdpviz.structure.labels import (
    COPY_OUT_ACTION,
    FAMILY_FSDP2,
    FAMILY_FSDPVIZ,
    FETCH_ACTIONS,
    FSDP2_REDUCE_ACTION,
    FSDPVIZ_REDUCE_ACTION,
    GATHER_ACTION,
    POST_BACKWARD_ACTIONS,
)

OPTIMIZER_STEP_PREFIX: Final = "Optimizer.step#"
ZERO_GRAD_PREFIX: Final = "Optimizer.zero_grad#"
# torch.profiler's range around each ``next()`` of a DataLoader iterator (single- or multi-process)
DATA_LOADING_PREFIX: Final = "enumerate(DataLoader)#"
FSDP1_POST_BACKWARD: Final = "FullyShardedDataParallel._post_backward_hook"
_OPTIMIZER_CLASS_RE: Final = re.compile(r"^Optimizer\.step#(?P<cls>\w+)\.step")


def _columns(labels: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    # as_str: a copy of the strings out, not a cast per row (the rules read these columns many times a rank)
    return as_str(labels["family"]), as_str(labels["action"])


def gather(labels: pd.DataFrame) -> np.ndarray:
    """Per label: a unit's gather (FSDP2's or fsdpviz's ``all_gather``)."""
    family, action = _columns(labels)
    return ((family == FAMILY_FSDP2) | (family == FAMILY_FSDPVIZ)) & (action == GATHER_ACTION)


def fsdp2_gather(labels: pd.DataFrame) -> np.ndarray:
    """Per label: FSDP2's ``FSDP::all_gather``, which makes the all-gather output buffer."""
    family, action = _columns(labels)
    return (family == FAMILY_FSDP2) & (action == GATHER_ACTION)


def copy_out(labels: pd.DataFrame) -> np.ndarray:
    """Per label: FSDP2's ``FSDP::all_gather_copy_out``."""
    family, action = _columns(labels)
    return (family == FAMILY_FSDP2) & (action == COPY_OUT_ACTION)


def gather_into_params(labels: pd.DataFrame) -> np.ndarray:
    """Per label: where the unsharded parameters are written (FSDP2's copy-out, fsdpviz's gather)."""
    family, action = _columns(labels)
    return copy_out(labels) | ((family == FAMILY_FSDPVIZ) & (action == GATHER_ACTION))


def reduce(labels: pd.DataFrame) -> np.ndarray:
    """Per label: a unit's gradient reduction."""
    family, action = _columns(labels)
    return (((family == FAMILY_FSDP2) & (action == FSDP2_REDUCE_ACTION))
            | ((family == FAMILY_FSDPVIZ) & (action == FSDPVIZ_REDUCE_ACTION)))


def fsdpviz_collective(labels: pd.DataFrame, *, fetch: bool = False) -> np.ndarray:
    """Per label: fsdpviz's own gather or reduce label of an FSDP1 / ZeRO-3 unit (with ``fetch``, also
    its ZeRO-3 fetch / release labels): framework work around a collective, never a unit's compute."""
    family, action = _columns(labels)
    actions = [GATHER_ACTION, FSDPVIZ_REDUCE_ACTION, *(sorted(FETCH_ACTIONS) if fetch else ())]
    return (family == FAMILY_FSDPVIZ) & np.isin(action, actions)


def post_backward(labels: pd.DataFrame) -> np.ndarray:
    """Per label: FSDP's post-backward work of a unit (the reduction among it)."""
    family, action = _columns(labels)
    return reduce(labels) | ((family == FAMILY_FSDP2) & np.isin(action, list(POST_BACKWARD_ACTIONS)))


def is_optimizer_step(names: np.ndarray | pd.Series) -> np.ndarray:
    """Per range name: an optimizer step (``Optimizer.step#...``)."""
    return np.char.startswith(np.asarray(names, dtype=str), OPTIMIZER_STEP_PREFIX)


def is_zero_grad(names: np.ndarray | pd.Series) -> np.ndarray:
    """Per range name: an optimizer's ``zero_grad``."""
    return np.char.startswith(np.asarray(names, dtype=str), ZERO_GRAD_PREFIX)


def is_data_loading(names: np.ndarray | pd.Series) -> np.ndarray:
    """Per range name: a DataLoader handing out a batch (``enumerate(DataLoader)#...__next__``)."""
    return np.char.startswith(np.asarray(names, dtype=str), DATA_LOADING_PREFIX)


def is_fsdp1_post_backward(names: np.ndarray | pd.Series) -> np.ndarray:
    """Per range name: FSDP1's post-backward hook."""
    return np.asarray(names, dtype=str) == FSDP1_POST_BACKWARD


def optimizer_classes(names: np.ndarray | pd.Series) -> list[str]:
    """The optimizer classes the step ranges among ``names`` name, in order of first appearance."""
    found: list[str] = []
    for name in np.asarray(names, dtype=str)[is_optimizer_step(names)]:
        match = _OPTIMIZER_CLASS_RE.match(str(name))
        if match and match.group("cls") not in found:
            found.append(match.group("cls"))
    return found
