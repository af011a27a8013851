"""Lanes of one rank: which CPU thread is the training loop, the autograd engine, a gloo worker;
which GPU streams exist; and a short readable name for each.

Kineto names threads ``thread 4037 (python3.8)`` from the OS thread name at some moment, and the
same thread may be named twice (``pt_main_thread`` and later ``pt_autograd_0``). The roles are
decided from names and contents together, so traces from other launchers still read right:

- main: the thread holding the ``ProfilerStep#N`` ranges; else the thread whose id is the pid;
  else the busiest CPU thread.
- gloo: a thread named ``*gloo*`` (``pt_gloo_runloop``), or one running ``gloo:*`` collectives.
- autograd: a thread named ``*autograd*``, or one running ``autograd::engine::evaluate_function``.
- everything else on the CPU is ``cpu_other``; GPU lanes are ``(device, stream)``.

Names: ``main``, ``autograd`` (``autograd 1``... when several), ``gloo 0``, ``gloo 1``...,
``thread <tid>``, and ``stream <id>`` (``cuda:<d> stream <id>`` when a rank drives several GPUs).
"""

from __future__ import annotations

import re
from typing import Final

import numpy as np
import pandas as pd

from fsdpviz.trace import schema

_THREAD_NAME_RE: Final = re.compile(r"^thread \d+ \((.*)\)$")
_ROLE_ORDER: Final = {
    schema.LANE_CPU_MAIN: 0,
    schema.LANE_CPU_AUTOGRAD: 1,
    schema.LANE_CPU_GLOO: 2,
    schema.LANE_CPU_OTHER: 3,
    schema.LANE_GPU_STREAM: 4,
}


def short_thread_name(kineto_name: str) -> str:
    """``thread 4037 (pt_autograd_0)`` -> ``pt_autograd_0``; other spellings are kept as they are."""
    match = _THREAD_NAME_RE.match(kineto_name.strip())
    return match.group(1) if match else kineto_name.strip()


def name_prefix_mask(names: pd.Series, prefix: str) -> np.ndarray:
    """Rows whose categorical ``name`` starts with ``prefix``, tested once per distinct name."""
    cats = names.cat.categories
    hit = np.fromiter((str(c).startswith(prefix) for c in cats), dtype=bool, count=len(cats))
    codes = names.cat.codes.to_numpy()
    return np.where(codes >= 0, hit[codes], False) if len(cats) else np.zeros(len(names), bool)


def build_lanes(
    events: pd.DataFrame, thread_names: dict[tuple[int, int], list[str]], rank: int
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Add a ``lane`` column to ``events`` and return (events, LANES table) for one rank."""
    # Hash-based grouping: far cheaper than a MultiIndex on 10^5-10^6 rows.
    keys = events[["is_gpu", "key_a", "key_b"]]
    codes = keys.groupby(["is_gpu", "key_a", "key_b"], sort=False).ngroup().to_numpy()
    lanes = keys.drop_duplicates().reset_index(drop=True)
    n_lanes = len(lanes)
    lanes["n_events"] = np.bincount(codes, minlength=n_lanes)

    is_step = name_prefix_mask(events["name"], "ProfilerStep#") & ~events["is_gpu"].to_numpy()
    is_gloo = name_prefix_mask(events["name"], "gloo:")
    is_autograd = name_prefix_mask(events["name"], "autograd::engine::evaluate_function")
    lanes["n_steps"] = np.bincount(codes[is_step], minlength=n_lanes)
    lanes["n_gloo"] = np.bincount(codes[is_gloo], minlength=n_lanes)
    lanes["n_autograd"] = np.bincount(codes[is_autograd], minlength=n_lanes)

    lanes["thread_name"] = [
        "" if gpu else " / ".join(dict.fromkeys(short_thread_name(n) for n in thread_names.get((a, b), [])))
        for gpu, a, b in zip(lanes["is_gpu"], lanes["key_a"], lanes["key_b"])
    ]
    lanes["lane_kind"] = _lane_kinds(lanes)
    lanes["order"] = lanes["lane_kind"].map(_ROLE_ORDER)
    lanes = lanes.sort_values(["order", "key_a", "key_b"], kind="stable").reset_index()
    lanes["order"] = np.arange(len(lanes))
    lanes["lane"] = _lane_names(lanes)
    lanes["rank"] = rank
    lanes["pid"] = np.where(lanes["is_gpu"], -1, lanes["key_a"])
    lanes["tid"] = lanes["key_b"]
    lanes["device"] = np.where(lanes["is_gpu"], lanes["key_a"], -1)

    name_of_code = np.empty(len(lanes), dtype=object)
    name_of_code[lanes["index"].to_numpy()] = lanes["lane"].to_numpy()
    events = events.assign(lane=pd.Categorical(name_of_code[codes], categories=lanes["lane"]))
    return events.drop(columns=["is_gpu", "key_a", "key_b"]), lanes.drop(columns=["index"])


def _lane_kinds(lanes: pd.DataFrame) -> list[str]:
    main_idx = _main_lane(lanes)
    kinds: list[str] = []
    for i, row in lanes.iterrows():  # one row per thread/stream: a handful, not per event
        name = row["thread_name"].lower()
        if row["is_gpu"]:
            kinds.append(schema.LANE_GPU_STREAM)
        elif i == main_idx:
            kinds.append(schema.LANE_CPU_MAIN)
        elif "gloo" in name or (row["n_gloo"] > 0 and "autograd" not in name):
            kinds.append(schema.LANE_CPU_GLOO)
        elif "autograd" in name or row["n_autograd"] > 0:
            kinds.append(schema.LANE_CPU_AUTOGRAD)
        else:
            kinds.append(schema.LANE_CPU_OTHER)
    return kinds


def _main_lane(lanes: pd.DataFrame) -> int | None:
    cpu = lanes.index[~lanes["is_gpu"]]
    if len(cpu) == 0:
        return None
    cpu_lanes = lanes.loc[cpu]
    if cpu_lanes["n_steps"].max() > 0:
        return int(cpu_lanes["n_steps"].idxmax())
    pid_is_tid = cpu_lanes.index[cpu_lanes["key_a"] == cpu_lanes["key_b"]]
    if len(pid_is_tid):
        return int(pid_is_tid[0])
    return int(cpu_lanes["n_events"].idxmax())


def _lane_names(lanes: pd.DataFrame) -> list[str]:
    n_devices = lanes.loc[lanes["is_gpu"], "key_a"].nunique()
    count = lanes["lane_kind"].value_counts()
    seen: dict[str, int] = {}
    names: list[str] = []
    for kind, a, b in zip(lanes["lane_kind"], lanes["key_a"], lanes["key_b"]):
        k = seen.get(kind, 0)
        seen[kind] = k + 1
        if kind == schema.LANE_CPU_MAIN:
            names.append("main")
        elif kind == schema.LANE_CPU_AUTOGRAD:
            names.append("autograd" if count[kind] == 1 else f"autograd {k}")
        elif kind == schema.LANE_CPU_GLOO:
            names.append(f"gloo {k}")
        elif kind == schema.LANE_CPU_OTHER:
            names.append(f"thread {b}")
        else:
            names.append(f"stream {b}" if n_devices <= 1 else f"cuda:{a} stream {b}")
    return names
