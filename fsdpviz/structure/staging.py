"""A host backend's collectives on a GPU rank, and the copies they stage through host memory.

gloo (or MPI) runs a collective of CUDA tensors on a CPU thread of its own: the calling thread's
``c10d::*`` op copies the input to pinned host memory (``Memcpy DtoH``; a reduce-scatter also a
device-to-device copy of it), and the backend's thread runs the collective (``gloo:all_gather``) and
copies the result back (``Memcpy HtoD``). These copies are the collective's own work, not the
model's: they are communication, beside the backend's op itself. A copy is a host backend's when the
host launched it, on the launching thread, from inside the backend's op or the ``c10d::*`` op that
issued it: per kind, the k-th outermost ``c10d::*`` op that launched no NCCL kernel issued the k-th
backend op (gloo runs a reduce-scatter as an all-reduce), as :mod:`fsdpviz.structure.collectives`
pairs them. A ``c10d::*`` op of a kind no backend op ran (a NCCL or fake group's beside a gloo one)
issued none; a copy FSDP's own ranges launched outside these ops stays FSDP's.

On a rank without a host backend's collectives (NCCL alone), nothing here applies: a collective there
is its kernel (HTA's definition).
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Final

import numpy as np
import pandas as pd

from fsdpviz import vocabulary
from fsdpviz.structure.categorical import as_str, matching, startswith
from fsdpviz.structure.collectives import gloo_family, match_in_order, outermost
from fsdpviz.structure.fsdp_work import launch_points, launched_inside
from fsdpviz.structure.intervals import Intervals, union_intervals
from fsdpviz.structure.spans import GPU_WORK_KINDS, HTA_COMM_RE
from fsdpviz.trace import schema
from fsdpviz.trace.comms import HOST_BACKEND_PREFIXES

HOST_COMM_KINDS: Final = (schema.KIND_CPU_OP, schema.KIND_ANNOTATION)
NO_COLLECTIVE: Final = -1  # a staged copy launched inside a collective op that no row of the table holds


def host_backend_collectives(events: pd.DataFrame) -> pd.DataFrame:
    """The collectives a host backend (gloo, MPI) ran on its own CPU threads: on a GPU rank they
    move CUDA tensors through host memory, and the op's duration is the collective's."""
    host = _collective_ops(events)
    return host[startswith(host["name"], HOST_BACKEND_PREFIXES)]


def _collective_ops(events: pd.DataFrame) -> pd.DataFrame:
    return events[events["kind"].isin(HOST_COMM_KINDS).to_numpy() & (events["comm"] != "").to_numpy()]


def communication_kernels(gpu: pd.DataFrame) -> np.ndarray:
    """Per row of ``gpu``: a collective's kernel (HTA's definition: NCCL's)."""
    return matching(gpu["name"], HTA_COMM_RE)


def staged(events: pd.DataFrame, gpu: pd.DataFrame) -> np.ndarray:
    """Per row of ``gpu`` (GPU events of the rank of ``events``): a copy a host backend's collective
    staged (module docstring); all False on a rank without a host backend's collectives."""
    if not len(gpu) or host_backend_collectives(events).empty:
        return np.zeros(len(gpu), dtype=bool)
    ops = _host_backend_ops(events)
    ranges = {str(lane): union_intervals(g["start_ns"].to_numpy(np.int64),
                                         (g["start_ns"] + g["dur_ns"]).to_numpy(np.int64))
              for lane, g in ops.groupby(ops["lane"].astype(str), sort=False)}
    return launched_inside(events, gpu, ranges) & ~communication_kernels(gpu)


def _host_backend_ops(events: pd.DataFrame) -> pd.DataFrame:
    """The ops of one rank's host-backend collectives: the backend's own (``gloo:*``, ``mpi:*``) and the
    ``c10d::*`` ops that issued them (module docstring)."""
    ops = _collective_ops(events)
    backend = ops[startswith(ops["name"], HOST_BACKEND_PREFIXES)]
    issuing = ops[startswith(ops["name"], "c10d::")]
    issuing = outermost(issuing[~_launched_nccl(events, issuing)])
    if backend.empty or issuing.empty:
        return backend
    has_rs = bool((backend["comm"] == vocabulary.REDUCE_SCATTER).any())
    backend_family = np.array([gloo_family(c, has_rs) for c in as_str(backend["comm"])], dtype=object)
    issuing_family = np.array([gloo_family(c, has_rs) for c in as_str(issuing["comm"])], dtype=object)
    issued = np.zeros(len(issuing), dtype=bool)
    backend_start = backend["start_ns"].to_numpy(np.int64)
    issuing_start = issuing["start_ns"].to_numpy(np.int64)
    for family in np.unique(backend_family):
        rows = np.flatnonzero(issuing_family == family)
        runs = np.sort(backend_start[backend_family == family])
        order = rows[np.argsort(issuing_start[rows], kind="stable")]
        match = match_in_order(issuing_start[order], runs)
        issued[order[match[match >= 0]]] = True
    return pd.concat([backend, issuing[issued]])


def _launched_nccl(events: pd.DataFrame, ops: pd.DataFrame) -> np.ndarray:
    """Per row of ``ops`` (host ops of the rank of ``events``): a NCCL kernel was launched inside it."""
    gpu = events[events["kind"].isin(GPU_WORK_KINDS).to_numpy()]
    nccl = gpu[communication_kernels(gpu)]
    out = np.zeros(len(ops), dtype=bool)
    if nccl.empty or ops.empty:
        return out
    t, lanes = launch_points(events, nccl)
    op_lanes = ops["lane"].astype(str).to_numpy(dtype=object)
    op_start = ops["start_ns"].to_numpy(np.int64)
    op_end = op_start + ops["dur_ns"].to_numpy(np.int64)
    for lane in np.unique(op_lanes):
        on = op_lanes == lane
        at = np.sort(t[(t >= 0) & (lanes == lane)])
        out[on] = np.searchsorted(at, op_end[on]) > np.searchsorted(at, op_start[on])
    return out


def collective_work(events: pd.DataFrame, gpu: pd.DataFrame) -> np.ndarray:
    """Per row of ``gpu``: a collective's own work, its kernel or a copy it staged."""
    return communication_kernels(gpu) | staged(events, gpu)


def staged_copies(events: pd.DataFrame, coll: pd.DataFrame, steps: Collection[int] | None = None
                  ) -> tuple[np.ndarray, Intervals]:
    """(row, (start_ns, end_ns)) of each copy a collective of ``coll`` staged (``coll``: the rank's
    collectives, one row each, :mod:`fsdpviz.structure.collectives`; ``row``: its position there, or
    :data:`NO_COLLECTIVE` for a copy launched in a collective op no row holds). A row holds the
    backend's op (its ``lane``, ``start_ns`` to ``end_ns``) and its issuing op (``issue_lane`` from
    ``issue_ns``). ``steps``: only the copies launched in these steps."""
    gpu = events[events["kind"].isin(GPU_WORK_KINDS).to_numpy()]
    if steps is not None:
        gpu = gpu[gpu["step"].isin(list(steps)).to_numpy()]
    gpu = gpu[staged(events, gpu)]
    start = gpu["start_ns"].to_numpy(np.int64)
    end = start + gpu["dur_ns"].to_numpy(np.int64)
    row = np.full(len(gpu), NO_COLLECTIVE, dtype=np.int64)
    if not len(gpu) or coll.empty:
        return row, (start, end)
    t, lanes = launch_points(events, gpu)
    ops = _collective_ops(events)
    issue_end = (ops.assign(end_ns=ops["start_ns"] + ops["dur_ns"], lane=ops["lane"].astype(str))
                 .groupby(["lane", "start_ns"])["end_ns"].max())
    issue_key = pd.MultiIndex.from_arrays([coll["issue_lane"].astype(str).to_numpy(),
                                           coll["issue_ns"].to_numpy(np.int64)])
    issued_until = issue_end.reindex(issue_key).to_numpy()
    has_issue = ~np.isnan(issued_until.astype(float))
    op_lane = np.concatenate([coll["lane"].astype(str).to_numpy(dtype=object),
                              coll["issue_lane"].astype(str).to_numpy(dtype=object)[has_issue]])
    op_start = np.concatenate([coll["start_ns"].to_numpy(np.int64), coll["issue_ns"].to_numpy(np.int64)[has_issue]])
    op_end = np.concatenate([coll["end_ns"].to_numpy(np.int64), issued_until[has_issue].astype(np.int64)])
    op_row = np.concatenate([np.arange(len(coll)), np.flatnonzero(has_issue)])
    for lane in np.unique(op_lane):
        on = op_lane == lane
        order = np.argsort(op_start[on], kind="stable")
        s, e, r = op_start[on][order], op_end[on][order], op_row[on][order]
        mine = np.flatnonzero((t >= 0) & (lanes == lane))
        i = np.searchsorted(s, t[mine], side="right") - 1
        ok = (i >= 0) & (t[mine] < e[np.clip(i, 0, None)])
        row[mine[ok]] = r[i[ok]]
    return row, (start, end)
