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
from typing import Any, Final

import numpy as np

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


def prefix_hits(names: list[str], prefix: str) -> np.ndarray:
    """Per name code: whether the name starts with ``prefix`` (index it with the events' codes)."""
    return np.fromiter((n.startswith(prefix) for n in names), dtype=bool, count=len(names))


def factorize_rows(*keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Group rows by equal keys: (group code per row, first row of each group), groups numbered
    in order of first appearance."""
    n = len(keys[0])
    if n == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    combined = np.zeros(n, dtype=np.int64)
    for key in keys:
        uniq, inverse = np.unique(key, return_inverse=True)
        # Bounded by the product of the keys' distinct counts: far below 2**63 for lanes.
        combined = combined * len(uniq) + inverse
    _, first, inverse = np.unique(combined, return_index=True, return_inverse=True)
    by_appearance = np.argsort(first, kind="stable")
    renumber = np.empty_like(by_appearance)
    renumber[by_appearance] = np.arange(len(by_appearance))
    return renumber[inverse.reshape(-1)], first[by_appearance]


def build_lanes(
    is_gpu: np.ndarray, key_a: np.ndarray, key_b: np.ndarray, name_code: np.ndarray, names: list[str],
    thread_names: dict[tuple[int, int], list[str]],
) -> tuple[np.ndarray, dict[str, list[Any]]]:
    """Lane of every event (codes into the returned table's ``lane``) and the LANES columns of one
    rank (all but ``rank``), in display order."""
    codes, first = factorize_rows(is_gpu, key_a, key_b)
    n_lanes = len(first)
    gpu = is_gpu[first].tolist()
    a = key_a[first].tolist()
    b = key_b[first].tolist()

    def per_lane(prefix: str, among: np.ndarray | None = None) -> list[int]:
        hit = prefix_hits(names, prefix)[name_code] if names else np.zeros(len(codes), bool)
        if among is not None:
            hit &= among
        return np.bincount(codes[hit], minlength=n_lanes).tolist()

    n_events = np.bincount(codes, minlength=n_lanes).tolist()
    n_steps = per_lane("ProfilerStep#", ~is_gpu)
    n_gloo = per_lane("gloo:")
    n_autograd = per_lane("autograd::engine::evaluate_function")
    thread_name = [
        "" if g else " / ".join(dict.fromkeys(short_thread_name(n) for n in thread_names.get((ka, kb), [])))
        for g, ka, kb in zip(gpu, a, b)
    ]
    main = _main_lane(gpu, a, b, n_steps, n_events)
    kinds = [_lane_kind(i == main, g, name, gl, ag)
             for i, (g, name, gl, ag) in enumerate(zip(gpu, thread_name, n_gloo, n_autograd))]
    display = sorted(range(n_lanes), key=lambda i: (_ROLE_ORDER[kinds[i]], a[i], b[i]))
    position = np.empty(n_lanes, dtype=np.int32)
    position[display] = np.arange(n_lanes, dtype=np.int32)
    kinds = [kinds[i] for i in display]
    gpu = [gpu[i] for i in display]
    a = [a[i] for i in display]
    b = [b[i] for i in display]
    lanes: dict[str, list[Any]] = {
        "lane": _lane_names(kinds, gpu, a, b),
        "lane_kind": kinds,
        "pid": [-1 if g else ka for g, ka in zip(gpu, a)],
        "tid": b,
        "device": [ka if g else -1 for g, ka in zip(gpu, a)],
        "thread_name": [thread_name[i] for i in display],
        "order": list(range(n_lanes)),
        "n_events": [n_events[i] for i in display],
    }
    return position[codes] if n_lanes else np.zeros(0, np.int32), lanes


def _lane_kind(is_main: bool, gpu: bool, thread_name: str, n_gloo: int, n_autograd: int) -> str:
    name = thread_name.lower()
    if gpu:
        return schema.LANE_GPU_STREAM
    if is_main:
        return schema.LANE_CPU_MAIN
    if "gloo" in name or (n_gloo > 0 and "autograd" not in name):
        return schema.LANE_CPU_GLOO
    if "autograd" in name or n_autograd > 0:
        return schema.LANE_CPU_AUTOGRAD
    return schema.LANE_CPU_OTHER


def _main_lane(gpu: list[bool], a: list[int], b: list[int], n_steps: list[int], n_events: list[int]) -> int | None:
    cpu = [i for i, g in enumerate(gpu) if not g]
    if not cpu:
        return None
    if max(n_steps[i] for i in cpu) > 0:
        return max(cpu, key=lambda i: (n_steps[i], -i))  # the first of the busiest, as idxmax
    pid_is_tid = [i for i in cpu if a[i] == b[i]]
    if pid_is_tid:
        return pid_is_tid[0]
    return max(cpu, key=lambda i: (n_events[i], -i))


def _lane_names(kinds: list[str], gpu: list[bool], a: list[int], b: list[int]) -> list[str]:
    n_devices = len({ka for g, ka in zip(gpu, a) if g})
    count = {kind: kinds.count(kind) for kind in set(kinds)}
    seen: dict[str, int] = {}
    names: list[str] = []
    for kind, ka, kb in zip(kinds, a, b):
        k = seen.get(kind, 0)
        seen[kind] = k + 1
        if kind == schema.LANE_CPU_MAIN:
            names.append("main")
        elif kind == schema.LANE_CPU_AUTOGRAD:
            names.append("autograd" if count[kind] == 1 else f"autograd {k}")
        elif kind == schema.LANE_CPU_GLOO:
            names.append(f"gloo {k}")
        elif kind == schema.LANE_CPU_OTHER:
            names.append(f"thread {kb}")
        else:
            names.append(f"stream {kb}" if n_devices <= 1 else f"cuda:{ka} stream {kb}")
    return names
