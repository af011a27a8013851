"""Every collective a rank ran, where it ran, and the CPU instant that issued it.

GPU: a collective is an NCCL kernel on a CUDA stream. Its issue point is the runtime call that
launched it (``cudaLaunchKernel`` / ``cuLaunchKernelEx``, same ``correlation``) on the CPU thread
that ran the FSDP code; when that call is missing, the CPU op with the kernel's ``External id``.

CPU/gloo: a collective runs as ``gloo:all_gather`` / ``gloo:all_reduce`` on a gloo worker thread
and is issued by a ``c10d::*`` op on the training thread. Nothing links the two, and on CPU neither
names its process group. Every ``ProcessGroupGloo`` runs its work on threads of its own, in the
order it was issued; groups run side by side (a 2-D mesh: FSDP's and tensor parallelism's), so one
queue per collective kind would pair a group's op with another group's. What tells the groups
apart is the tensor: the gloo op's input is the tensor the issuing op handed its group
(``comm_numel``: a gather's shard, a reduce-scatter's whole input, a TP activation, a 1-element
barrier or object-size flag). So the k-th issuing op of a kind and payload is the k-th gloo
collective of that kind and payload; a kind whose ops do not all say their payload (``gloo:barrier``
has no tensor) falls back to one queue per kind. Payloads alone cannot keep apart two groups
moving tensors of one size (HSDP's shard and replica groups, a script's own ``dist.new_group``s):
there ``fsdpviz record`` names the group at both ends (record/groups.py), the call by a
``fsdpviz.group <name>`` range around the issuing op and the run by its worker thread's name
``gloo pg <name>``. A kind whose issuing ops and runs all name their group is paired per group (and
payload): one group's collectives run in the order they were issued. gloo has no reduce-scatter:
``c10d::_reduce_scatter_base_`` runs as ``gloo:all_reduce``, so both share a kind. An issuing op
inside another (``_c10d_functional::all_reduce`` calls ``c10d::allreduce_``) issues nothing more. A
gloo op that starts before the next unmatched issuing op was issued before recording began and
stays unmatched.

The issuing op also tells a reduce-scatter from an all-reduce on CPU, and gives the bytes.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Final

import numpy as np
import pandas as pd

from fsdpviz import vocabulary
from fsdpviz.structure.categorical import as_str, startswith
from fsdpviz.trace import schema

COLLECTIVES: Final[schema.Schema] = {
    "rank": "int32",
    "step": "int32",  # step of the issue point
    "lane": "string",  # where it ran (NCCL stream / gloo thread)
    "start_ns": "int64",
    "end_ns": "int64",
    "comm": "string",
    "bytes": "int64",
    "pg": "string",
    "issue_lane": "string",  # "" when the issue point is unknown
    "issue_ns": "int64",
    "issue_name": "string",
}
ISSUE_PREFIXES: Final = ("c10d::", "_c10d_functional::", "c10d_functional::")
# a gloo worker thread the recorder named after its group; Kineto may list a thread under several
# names over time (``python / gloo pg 1``)
_GLOO_THREAD_RE: Final = re.compile(rf"(?:^| / ){re.escape(vocabulary.GLOO_THREAD_PREFIX)}(\S+)")


def lane_kinds(events: pd.DataFrame, lanes: pd.DataFrame) -> np.ndarray:
    """``lane_kind`` of each event row of one rank (via that rank's LANES rows)."""
    return _per_lane(events, lanes, lambda mine: as_str(mine["lane_kind"]))


def thread_group(thread_name: str) -> str:
    """The process group a gloo worker thread works for, from the name ``fsdpviz record`` gave it; ""."""
    match = _GLOO_THREAD_RE.search(thread_name)
    return match.group(1) if match else ""


def lane_groups(events: pd.DataFrame, lanes: pd.DataFrame) -> np.ndarray:
    """The process group each event row of one rank ran for, by its lane's thread name; "" if unnamed."""
    return _per_lane(events, lanes, lambda mine: np.array([thread_group(n) for n in as_str(mine["thread_name"])],
                                                          dtype=object))


def _per_lane(events: pd.DataFrame, lanes: pd.DataFrame, value: Callable[[pd.DataFrame], np.ndarray]
              ) -> np.ndarray:
    """``value`` of each event row's lane (one rank's events; ``value`` maps its LANES rows)."""
    if events.empty:
        return np.zeros(0, dtype=object)
    rank = int(events["rank"].to_numpy()[0])
    mine = lanes[lanes["rank"] == rank]
    kind_of = dict(zip(as_str(mine["lane"]), value(mine)))
    lane = events["lane"]
    if isinstance(lane.dtype, pd.CategoricalDtype):  # map once per distinct lane
        cats = np.array([kind_of.get(str(c), "") for c in lane.cat.categories], dtype=object)
        codes = lane.cat.codes.to_numpy()
        return np.where(codes >= 0, cats[np.clip(codes, 0, None)] if len(cats) else "", "")
    return lane.astype(str).map(kind_of).fillna("").to_numpy(dtype=object)


def is_gpu_rank(events: pd.DataFrame) -> bool:
    """A rank with kernels is analysed on its GPU timeline."""
    return bool((events["kind"] == schema.KIND_KERNEL).any())


def gpu_ranks(events: pd.DataFrame) -> set[int]:
    """Ranks with kernels."""
    return {int(r) for r in events.loc[(events["kind"] == schema.KIND_KERNEL).to_numpy(), "rank"].unique()}


def _frame(rows: dict[str, object]) -> pd.DataFrame:
    return schema.conform(pd.DataFrame(rows), COLLECTIVES, table="collectives")


def gpu_collectives(events: pd.DataFrame) -> pd.DataFrame:
    """NCCL kernels (of any number of ranks) with their launching CPU call."""
    kernels = events[((events["kind"] == schema.KIND_KERNEL) & (events["comm"] != "")).to_numpy()]
    if kernels.empty:
        return schema.make_empty(COLLECTIVES)
    launches = events[((events["kind"] == schema.KIND_RUNTIME) & (events["correlation"] >= 0)).to_numpy()]
    launches = launches.drop_duplicates(["rank", "correlation"])
    by_corr = pd.DataFrame({"rank": launches["rank"].to_numpy(), "correlation": launches["correlation"].to_numpy(),
                            "issue_lane": as_str(launches["lane"]),
                            "issue_ns": pd.array(launches["start_ns"].to_numpy(), dtype="Int64"),
                            "issue_name": as_str(launches["name"])})
    k = pd.DataFrame({"rank": kernels["rank"].to_numpy(), "correlation": kernels["correlation"].to_numpy(),
                      "external_id": kernels["external_id"].to_numpy()}).merge(
        by_corr, on=["rank", "correlation"], how="left")
    missing = k["issue_ns"].isna().to_numpy()
    if missing.any():  # fall back to the CPU op holding the kernel's External id
        cpu = events[(events["kind"].isin([schema.KIND_CPU_OP, schema.KIND_ANNOTATION])
                      & (events["external_id"] >= 0)).to_numpy()].drop_duplicates(["rank", "external_id"], keep="last")
        by_ext = pd.DataFrame({"rank": cpu["rank"].to_numpy(), "external_id": cpu["external_id"].to_numpy(),
                               "lane": as_str(cpu["lane"]),
                               "t": pd.array(cpu["start_ns"].to_numpy(), dtype="Int64"),
                               "n": as_str(cpu["name"])})
        fb = k.loc[missing, ["rank", "external_id"]].merge(by_ext, on=["rank", "external_id"], how="left")
        k.loc[missing, "issue_lane"] = fb["lane"].to_numpy()
        k.loc[missing, "issue_ns"] = fb["t"].to_numpy()
        k.loc[missing, "issue_name"] = fb["n"].to_numpy()
    start = kernels["start_ns"].to_numpy(np.int64)
    known = k["issue_ns"].notna().to_numpy()
    return _frame({
        "rank": kernels["rank"].to_numpy(),
        "step": kernels["step"].to_numpy(),
        "lane": as_str(kernels["lane"]),
        "start_ns": start,
        "end_ns": start + kernels["dur_ns"].to_numpy(np.int64),
        "comm": as_str(kernels["comm"]),
        "bytes": kernels["comm_bytes"].to_numpy(),
        "pg": as_str(kernels["pg"]),
        "issue_lane": np.where(known, k["issue_lane"].fillna("").to_numpy(), ""),
        "issue_ns": np.where(known, k["issue_ns"].fillna(0).to_numpy(dtype=np.int64), start),
        "issue_name": k["issue_name"].fillna("").to_numpy(),
    })


def gloo_family(comm: str, gloo_has_rs: bool) -> str:
    """The kind a gloo op runs for an issued collective of kind ``comm``: without a gloo reduce-scatter in
    the trace, PyTorch runs a reduce-scatter as ``gloo:all_reduce``."""
    if comm == vocabulary.REDUCE_SCATTER and not gloo_has_rs:
        return vocabulary.ALL_REDUCE
    return comm


def match_in_order(issue_t: np.ndarray, run_t: np.ndarray) -> np.ndarray:
    """For each run (sorted), the index of its issuing op (sorted) or -1: the k-th issue is the
    k-th run, skipping runs that start before the next unmatched issue (issued before recording)."""
    out = np.full(len(run_t), -1, dtype=np.int64)
    i = 0
    for j, t in enumerate(run_t.tolist()):
        if i < len(issue_t) and issue_t[i] <= t:
            out[j] = i
            i += 1
    return out


def outermost(issues: pd.DataFrame) -> pd.DataFrame:
    """The issuing ops not inside another issuing op of the same lane (sorted by start)."""
    if len(issues) < 2:
        return issues
    issues = issues.sort_values("start_ns", kind="stable")
    keep = np.ones(len(issues), dtype=bool)
    for rows in issues.groupby(as_str(issues["lane"]), sort=False).indices.values():
        start = issues["start_ns"].to_numpy(np.int64)[rows]
        end = start + issues["dur_ns"].to_numpy(np.int64)[rows]
        reach = np.maximum.accumulate(end)
        inside = np.zeros(len(rows), dtype=bool)
        inside[1:] = start[1:] < reach[:-1]
        keep[rows] = ~inside
    return issues[keep]


def issue_groups(issues: pd.DataFrame, events: pd.DataFrame) -> np.ndarray:
    """The process group each issuing op names by the ``fsdpviz.group <name>`` range around it on its
    lane (``events``: the same rank's); "" where none encloses it."""
    out = np.full(len(issues), "", dtype=object)
    labels = events[startswith(events["name"], vocabulary.GROUP_LABEL_PREFIX)]
    if labels.empty or issues.empty:
        return out
    label_lane, issue_lane = as_str(labels["lane"]), as_str(issues["lane"])
    label_start = labels["start_ns"].to_numpy(np.int64)
    label_end = label_start + labels["dur_ns"].to_numpy(np.int64)
    label_group = np.array([n[len(vocabulary.GROUP_LABEL_PREFIX):] for n in as_str(labels["name"])], dtype=object)
    issue_start = issues["start_ns"].to_numpy(np.int64)
    issue_end = issue_start + issues["dur_ns"].to_numpy(np.int64)
    for lane in np.unique(issue_lane):
        rows, mine = np.flatnonzero(issue_lane == lane), np.flatnonzero(label_lane == lane)
        if not len(mine):
            continue
        mine = mine[np.argsort(label_start[mine], kind="stable")]  # one call's range holds no other
        at = np.searchsorted(label_start[mine], issue_start[rows], side="right") - 1
        found = at >= 0
        lab = mine[np.clip(at, 0, None)]
        inside = found & (label_end[lab] >= issue_end[rows])
        out[rows[inside]] = label_group[lab[inside]]
    return out


def _queues(runs: pd.DataFrame, issues: pd.DataFrame, run_family: np.ndarray, issue_family: np.ndarray,
            run_group: np.ndarray, issue_group: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
    """(run rows, issue rows) of each queue: per kind, then per group where every op of the kind names
    its group, then per payload where every op says it."""
    out = []
    run_numel = runs["comm_numel"].to_numpy(np.int64)
    issue_numel = issues["comm_numel"].to_numpy(np.int64)
    for family in np.unique(run_family):
        r_rows, i_rows = np.flatnonzero(run_family == family), np.flatnonzero(issue_family == family)
        if (run_group[r_rows] != "").all() and (issue_group[i_rows] != "").all():
            parts = [(r_rows[run_group[r_rows] == g], i_rows[issue_group[i_rows] == g])
                     for g in np.unique(run_group[r_rows])]
        else:
            parts = [(r_rows, i_rows)]
        for r_part, i_part in parts:
            if (run_numel[r_part] > 0).all() and (issue_numel[i_part] > 0).all():
                for numel in np.unique(run_numel[r_part]):
                    out.append((r_part[run_numel[r_part] == numel], i_part[issue_numel[i_part] == numel]))
            else:
                out.append((r_part, i_part))
    return out


def cpu_collectives(events: pd.DataFrame, kinds: np.ndarray, groups: np.ndarray | None = None) -> pd.DataFrame:
    """gloo collectives of one rank matched to their ``c10d::*`` issuing ops (none on a rank whose
    collectives all ran elsewhere, e.g. as NCCL kernels). ``groups``: each event's lane's process
    group (:func:`lane_groups`), None when no lane names one."""
    has_comm = (events["comm"] != "").to_numpy()
    on_gloo = has_comm & (kinds == schema.LANE_CPU_GLOO)
    runs = events[on_gloo]
    if runs.empty:
        return schema.make_empty(COLLECTIVES)
    on_train = np.isin(kinds, [schema.LANE_CPU_MAIN, schema.LANE_CPU_AUTOGRAD, schema.LANE_CPU_OTHER])
    issues = outermost(events[has_comm & on_train & (events["kind"] == schema.KIND_CPU_OP).to_numpy()
                               & startswith(events["name"], ISSUE_PREFIXES)])
    order = np.argsort(runs["start_ns"].to_numpy(np.int64), kind="stable")
    runs = runs.iloc[order]
    run_group = (groups[on_gloo][order] if groups is not None else np.full(len(runs), "", dtype=object))
    issue_group = issue_groups(issues, events)
    gloo_has_rs = bool((runs["comm"] == vocabulary.REDUCE_SCATTER).any())
    run_family = np.array([gloo_family(c, gloo_has_rs) for c in as_str(runs["comm"])], dtype=object)
    issue_family = np.array([gloo_family(c, gloo_has_rs) for c in as_str(issues["comm"])], dtype=object)
    # each queue's matches as row positions, one table built from them at the end (a table per queue
    # cost more than the matching on a CPU recording's few hundred collectives)
    run_start = runs["start_ns"].to_numpy(np.int64)
    issue_start = issues["start_ns"].to_numpy(np.int64)
    run_at: list[np.ndarray] = []
    issue_at: list[np.ndarray] = []
    for r_rows, i_rows in _queues(runs, issues, run_family, issue_family, run_group, issue_group):
        match = match_in_order(issue_start[i_rows], run_start[r_rows])
        ok = match >= 0
        run_at.append(r_rows[ok])
        issue_at.append(i_rows[match[ok]])
    if not run_at:
        return schema.make_empty(COLLECTIVES)
    ra, ia = np.concatenate(run_at), np.concatenate(issue_at)
    r, m = runs.iloc[ra], issues.iloc[ia]
    # the group: where it ran (its worker's name), else what its call said, else the trace's own
    group = np.where(run_group[ra] != "", run_group[ra],
                     np.where(issue_group[ia] != "", issue_group[ia], as_str(m["pg"])))
    start = run_start[ra]
    issue_bytes = m["comm_bytes"].to_numpy()
    return _frame({
        "rank": r["rank"].to_numpy(),
        "step": m["step"].to_numpy(),
        "lane": as_str(r["lane"]),
        "start_ns": start,
        "end_ns": start + r["dur_ns"].to_numpy(np.int64),
        "comm": as_str(m["comm"]),  # the issuing op tells RS from all-reduce
        "bytes": np.where(issue_bytes > 0, issue_bytes, r["comm_bytes"].to_numpy()),
        "pg": group,
        "issue_lane": as_str(m["lane"]),
        "issue_ns": issue_start[ia],
        "issue_name": as_str(m["name"]),
    })


def find_collectives(events: pd.DataFrame, lanes: pd.DataFrame) -> pd.DataFrame:
    """COLLECTIVES of all ranks: NCCL kernels on GPU ranks, and the collectives a host backend
    (gloo) ran on its own threads, on CPU ranks and on GPU ranks that communicate through it."""
    kernel_ranks = set(events.loc[(events["kind"] == schema.KIND_KERNEL).to_numpy(), "rank"].unique().tolist())
    on_gpu = events["rank"].isin(list(kernel_ranks)).to_numpy()
    parts = [gpu_collectives(events[on_gpu])] if on_gpu.any() else []
    for _, rank_events in events.groupby("rank", sort=True):
        named = lane_groups(rank_events, lanes)
        parts.append(cpu_collectives(rank_events, lane_kinds(rank_events, lanes),
                                     named if (named != "").any() else None))
    parts = [p for p in parts if len(p)]
    if not parts:
        return schema.make_empty(COLLECTIVES)
    out = pd.concat(parts, ignore_index=True)
    return out.sort_values(["rank", "start_ns"], kind="stable").reset_index(drop=True)
