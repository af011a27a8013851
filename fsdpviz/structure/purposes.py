"""What each collective served, and each purpose's communication and exposed time per rank.

A rank runs collectives for several masters at once: FSDP gathers parameters and reduce-scatters
gradients, HSDP all-reduces them across replicas, tensor parallelism (TP) all-reduces activations
inside the blocks, and the training script itself synchronises (``dist.barrier``) or exchanges
Python objects (``all_gather_object``: a size and a byte tensor, each a small collective). Only the
first three are FSDP communication. The rules, read from what the run did rather than from names:

- ``fsdp_all_gather`` / ``fsdp_reduce_scatter`` / ``hsdp_all_reduce``: a collective that FSDP's own
  gather or reduce label issued (``spans.attribute_collectives`` gives it a span kind: an
  all-gather inside a gather label, a reduce-scatter or an all-reduce inside a reduce label);
- ``tensor_parallel``: any other collective of the tensor-parallel process group (a NCCL
  collective whose ``Process Group Name`` is the group distributedInfo describes as the mesh's TP
  dimension; on CPU ``fsdpviz record`` names each gloo collective's group, record/groups.py), or,
  where the trace names no group (gloo recorded without fsdpviz) or no group is known as TP's, one
  issued as a functional collective (``_c10d_functional::*``, which DTensor's redistributions use)
  in a run whose TP degree is not known to be 1;
- ``other``: the rest (barriers, object collectives, collectives issued outside FSDP's labels).

Per purpose and rank: ``comm_ns`` the union of its collectives' run intervals in the analysed
steps (with a host backend on CUDA tensors, the copies each collective stages through the host:
:mod:`fsdpviz.structure.staging`), ``exposed_ns`` that union minus the rank's compute (the
whole-step overlap's compute set); ``collectives`` how many there were, ``kinds`` which (the
collective's name and count, most first), ``after_backward`` how many were issued after their step's
last backward label ended (the optimizer step, however the framework wraps it) of the ``timed`` whose
step has a backward label to tell, the findings' words for communication no FSDP unit issued
(analysis/findings.py).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Mapping
from typing import Final

import numpy as np
import pandas as pd

from fsdpviz import vocabulary
from fsdpviz.structure.categorical import as_str
from fsdpviz.structure.intervals import Intervals, overlap_ns, total_ns, union_intervals
from fsdpviz.trace import schema

FUNCTIONAL_PREFIXES: Final = ("_c10d_functional::", "c10d_functional::")
PURPOSE_TIMES: Final[schema.Schema] = {
    "rank": "int32",
    "purpose": "string",  # one of vocabulary.PURPOSES
    "comm_ns": "int64",  # union of the purpose's collectives over the analysed steps
    "exposed_ns": "int64",  # of which no compute ran beside it
    "collectives": "int64",  # how many collectives of the purpose ran in the analysed steps
    "kinds": "string",  # their names and counts, most first: "all_reduce 3, barrier 3"
    "after_backward": "int64",  # of which issued after their step's last backward label ended
    "timed": "int64",  # of which in a step with a backward label: whether issued after it is known
}
PURPOSE_TITLES: Final = {
    vocabulary.FSDP_ALL_GATHER: "FSDP all-gather",
    vocabulary.FSDP_REDUCE_SCATTER: "FSDP reduce-scatter",
    vocabulary.HSDP_ALL_REDUCE: "HSDP all-reduce",
    vocabulary.TENSOR_PARALLEL: "tensor parallel",
    vocabulary.OTHER_PURPOSE: "other",
}
_KIND_PURPOSE: Final = {
    vocabulary.ALL_GATHER: vocabulary.FSDP_ALL_GATHER,
    vocabulary.REDUCE_SCATTER: vocabulary.FSDP_REDUCE_SCATTER,
    vocabulary.ALL_REDUCE: vocabulary.HSDP_ALL_REDUCE,
}


def collective_purposes(coll: pd.DataFrame, *, tp_groups: Collection[str] = (), tp: int | None = None
                        ) -> np.ndarray:
    """The purpose (vocabulary.PURPOSES) of each row of ``coll`` (spans.UNIT_COLLECTIVES).

    ``tp_groups``: names of the tensor-parallel process groups (``pg`` values); ``tp``: the run's
    TP degree, None when unknown (a functional collective then counts as TP's).
    """
    if coll.empty:
        return np.zeros(0, dtype=object)
    kind = as_str(coll["kind"])
    purpose = np.array([_KIND_PURPOSE.get(k, vocabulary.OTHER_PURPOSE) for k in kind], dtype=object)
    unclaimed = purpose == vocabulary.OTHER_PURPOSE
    pg = as_str(coll["pg"])
    of_tp_group = np.isin(pg, list(tp_groups)) if tp_groups else np.zeros(len(coll), dtype=bool)
    functional = np.fromiter((n.startswith(FUNCTIONAL_PREFIXES) for n in as_str(coll["issue_name"])),
                             dtype=bool, count=len(coll))
    # no group to go by: the trace names none (gloo not recorded by fsdpviz), or none is known as TP's
    no_group = (pg == "") | (not tp_groups)
    tp_possible = tp is None or tp > 1
    is_tp = unclaimed & (of_tp_group | (functional & no_group & tp_possible))
    return np.where(is_tp, vocabulary.TENSOR_PARALLEL, purpose)


def purpose_times(rank: int, coll: pd.DataFrame, purposes: np.ndarray, compute: Intervals,
                  staged: tuple[np.ndarray, Intervals] | None = None,
                  backward_end: Mapping[int, int] | None = None) -> pd.DataFrame:
    """PURPOSE_TIMES of one rank: ``coll`` its collectives in the analysed steps (one row per
    collective, not per unit), ``purposes`` theirs, ``compute`` its compute union. ``staged``: the
    copies a host backend's collectives staged through host memory (their row in ``coll``, -1 for
    none, and their intervals; :func:`fsdpviz.structure.staging.staged_copies`): each counts for its
    collective's purpose, one of no row for ``other``. ``backward_end``: per step, when its last
    backward label ended (none known: no collective counts as issued after it)."""
    rows = []
    start = coll["start_ns"].to_numpy(np.int64)
    end = coll["end_ns"].to_numpy(np.int64)
    names = as_str(coll["comm"]) if len(coll) else np.zeros(0, dtype=object)
    # issued when the training thread issued it; where the trace does not say, when it started
    issued = np.where(as_str(coll["issue_lane"]) != "", coll["issue_ns"].to_numpy(np.int64), start) if len(coll) \
        else start
    after = np.zeros(len(coll), dtype=bool)
    known = np.zeros(len(coll), dtype=bool)
    if backward_end and len(coll):
        ended = pd.Series(coll["step"].to_numpy()).map(backward_end).to_numpy(dtype=np.float64)
        known = ~np.isnan(ended)
        after = known & (issued >= np.nan_to_num(ended, nan=0.0))
    copy_row, (copy_start, copy_end) = staged if staged is not None else (
        np.zeros(0, dtype=np.int64), (np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)))
    copy_purpose = np.where(copy_row >= 0, np.asarray(purposes, dtype=object)[np.clip(copy_row, 0, None)]
                            if len(purposes) else vocabulary.OTHER_PURPOSE, vocabulary.OTHER_PURPOSE)
    for purpose in vocabulary.PURPOSES:
        mine = purposes == purpose
        copies = copy_purpose == purpose
        comm = union_intervals(np.concatenate([start[mine], copy_start[copies]]),
                               np.concatenate([end[mine], copy_end[copies]]))
        comm_ns = total_ns(comm)
        counts = Counter(names[mine].tolist())
        rows.append({"rank": rank, "purpose": purpose, "comm_ns": comm_ns,
                     "exposed_ns": comm_ns - overlap_ns(comm, compute), "collectives": int(mine.sum()),
                     "kinds": ", ".join(f"{name or 'unnamed'} {n}" for name, n in
                                        sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))),
                     "after_backward": int((mine & after).sum()), "timed": int((mine & known).sum())})
    return schema.conform(pd.DataFrame(rows), PURPOSE_TIMES, table="purpose times")


def per_step_ns(purposes: pd.DataFrame, purpose: str, column: str, n_steps: Mapping[int, int]) -> float | None:
    """One purpose's ``column`` (``comm_ns`` / ``exposed_ns``) per step: each rank's over its analysed
    steps (``n_steps``, at least 1), the median over ranks, as the run's own communication is; None where
    no rank has a row of it. The summary's figure by purpose and the findings' read this one."""
    rows = purposes[(purposes["purpose"] == purpose).to_numpy()]
    if rows.empty:
        return None
    per = np.array([max(int(n_steps.get(int(r), 1)), 1) for r in rows["rank"]], dtype=np.float64)
    return float(np.median(rows[column].to_numpy(dtype=np.float64) / per))


def one_row_per_collective(coll: pd.DataFrame) -> pd.DataFrame:
    """UNIT_COLLECTIVES has a row per unit a ZeRO-3 bucket carried: the collective once."""
    if coll.empty:
        return coll
    return coll.drop_duplicates(["rank", "lane", "start_ns", "end_ns"])
