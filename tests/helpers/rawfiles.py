"""What a run folder's files say by themselves, read without fsdpviz: the truth some tests hold
fsdpviz's numbers against (the profiler's own step spans and GPU events, the recorder's wall clock)."""

from __future__ import annotations

import functools
import gzip
import json
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

GPU_EVENTS = ("kernel", "gpu_memcpy", "gpu_memset")


def all_events(path: Path) -> list[dict[str, Any]]:
    """Every event of one Kineto trace file (.json or .json.gz), whatever its phase (``[memory]`` samples
    are instant events, ``ph: i``)."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        return list(json.load(f)["traceEvents"])


def trace_events(path: Path) -> list[dict[str, Any]]:
    """The complete (``ph: X``) events of one Kineto trace file (.json or .json.gz), read once per process
    while the file stays as it was (several tests hold fsdpviz to one shared recording): a new list each
    call, whose events callers must not change."""
    stat = path.stat()
    return list(_complete_events(path.resolve(), path.suffix == ".gz", stat.st_mtime_ns, stat.st_size))


# a shared recording's trace holds about 50 MB of events once parsed (H200 B: 33,153); a file's tests run
# one after another, so two are enough
@functools.lru_cache(maxsize=2)
def _complete_events(path: Path, gz: bool, _mtime_ns: int, _size: int) -> tuple[dict[str, Any], ...]:
    with (gzip.open if gz else open)(path, "rt") as f:
        return tuple(e for e in json.load(f)["traceEvents"] if e.get("ph") == "X")


@dataclass(frozen=True)
class RawTrace:
    """One trace file's CPU-side ProfilerStep spans and GPU events (µs, the file's clock)."""

    steps: dict[int, tuple[float, float]]
    gpu: list[tuple[float, float]]

    def step_ms(self, step: int) -> float:
        start, end = self.steps[step]
        return (end - start) / 1e3

    def busy_us(self, lo: float, hi: float) -> float:
        """Time in ``[lo, hi)`` with any GPU event running."""
        total, covered = 0.0, lo
        for a, b in self.gpu:
            a, b = max(a, covered), min(b, hi)
            if b > a:
                total, covered = total + b - a, b
        return total


def raw_trace(path: Path) -> RawTrace:
    events = trace_events(path)
    steps = {int(e["name"].split("#")[1]): (float(e["ts"]), float(e["ts"]) + float(e["dur"])) for e in events
             if e.get("cat") == "user_annotation" and e.get("name", "").startswith("ProfilerStep#")}
    gpu = sorted((float(e["ts"]), float(e["ts"]) + float(e["dur"])) for e in events if e.get("cat") in GPU_EVENTS)
    return RawTrace(steps, gpu)


def starts_in_step(path: Path, step: int, names: tuple[str, ...]) -> dict[str, list[float]]:
    """Per name of ``names``: the start (µs) of each event of that name inside ProfilerStep#``step``."""
    events = trace_events(path)
    ((lo, hi),) = _step_spans(events, [step])
    out: dict[str, list[float]] = {name: [] for name in names}
    for e in events:
        if e.get("name") in out and lo <= float(e["ts"]) < hi:
            out[e["name"]].append(float(e["ts"]))
    return {name: sorted(ts) for name, ts in out.items()}


def timer_step_ms(path: Path) -> dict[int, float]:
    """The recorder's wall clock of each whole step in one rank's timers file (timers/rank{R}.jsonl)."""
    return {r["step"]: r["ms"] for r in map(json.loads, path.read_text().splitlines())
            if r["unit"] == "" and r["phase"] == "step" and r["kind"] == "total"}


def profiled_over_clean(folder: Path) -> float:
    """The timers' whole step in the profiled steps over the clean ones (here every step after the one
    right after the trace; fsdpviz's own clean steps leave out more): per rank the median over steps,
    then the median over ranks, from the raw files."""
    profiled = list(json.loads((folder / "run.json").read_text())["profile"]["steps"])
    ratios = []
    for path in sorted((folder / "timers").glob("rank*.jsonl")):
        walls = timer_step_ms(path)
        clean = [ms for s, ms in walls.items() if s > max(profiled) + 1]
        assert clean, f"no clean step timed in {path.name}"
        ratios.append(statistics.median(walls[s] for s in profiled if s in walls) / statistics.median(clean))
    return statistics.median(ratios)


def kernels_launched_in(path: Path, range_name: str, steps: list[int]) -> float:
    """Per step, the ms of GPU work whose launch lies inside a CPU range named ``range_name`` (FSDP2's
    own labels, e.g. ``FSDP::pre_backward``, which hold the backward gathers' copies), over ``steps``
    (their ProfilerStep spans); the kernels' own durations, overlaps with other work not taken out."""
    events = trace_events(path)
    spans = {int(e["name"].split("#")[1]): (float(e["ts"]), float(e["ts"]) + float(e["dur"])) for e in events
             if e.get("cat") == "user_annotation" and e.get("name", "").startswith("ProfilerStep#")}
    ranges = sorted((float(e["ts"]), float(e["ts"]) + float(e["dur"])) for e in events
                    if e.get("cat") in ("user_annotation", "cpu_op") and e.get("name", "").split(" (")[0] == range_name)
    gpu = {e["args"]["correlation"]: float(e["dur"]) for e in events
           if e.get("cat") in GPU_EVENTS and "correlation" in e.get("args", {})}
    total = 0.0
    for e in events:
        if e.get("cat") != "cuda_runtime" or e.get("args", {}).get("correlation") not in gpu:
            continue
        ts = float(e["ts"])
        if any(lo <= ts < hi for s in steps for lo, hi in [spans[s]]) and any(a <= ts <= b for a, b in ranges):
            total += gpu[e["args"]["correlation"]]
    return total / 1e3 / len(steps)


def own_gpu_ms(path: Path, steps: list[int]) -> float:
    """Per step, the ms the GPU ran any event launched (a runtime or driver call) inside that step's
    ProfilerStep span, wherever the event ran: each step's own GPU work, mean over ``steps``."""
    events = trace_events(path)
    spans = {int(e["name"].split("#")[1]): (float(e["ts"]), float(e["ts"]) + float(e["dur"])) for e in events
             if e.get("cat") == "user_annotation" and e.get("name", "").startswith("ProfilerStep#")}
    launched = {e["args"]["correlation"]: float(e["ts"]) for e in events
                if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})}
    gpu = [(launched.get(e["args"].get("correlation"), -1.0), float(e["ts"]), float(e["ts"]) + float(e["dur"]))
           for e in events if e.get("cat") in GPU_EVENTS]
    per_step = []
    for step in steps:
        lo, hi = spans[step]
        mine = sorted((a, b) for at, a, b in gpu if lo <= at < hi)
        total, end = 0.0, float("-inf")
        for a, b in mine:
            total += max(b - max(a, end), 0.0)
            end = max(end, b)
        per_step.append(total / 1e3)
    return statistics.fmean(per_step)


def unit_timer_ratio(folder: Path, phase: str) -> float:
    """The timers' own units' pass, summed over units, in the clean steps over the profiled ones: per rank
    the median over steps, then the median over ranks. Clean: the steps after the one right after the
    trace (whose end the trace's writing slows), read from the raw timer files."""
    run = json.loads((folder / "run.json").read_text())
    profiled = list(run["profile"]["steps"])
    rows = [json.loads(line) for f in sorted((folder / "timers").glob("rank*.jsonl"))
            for line in f.read_text().splitlines() if line.strip()]
    per: dict[int, dict[int, float]] = {}  # rank -> step -> the units' own work in that pass
    for r in rows:
        if r["kind"] == "compute" and r["unit"] and r["phase"] == phase and r["ms"] is not None:
            steps = per.setdefault(int(r["rank"]), {})
            steps[int(r["step"])] = steps.get(int(r["step"]), 0.0) + float(r["ms"])
    clean = sorted({s for steps in per.values() for s in steps if s > max(profiled) + 1})
    assert clean, "no clean step timed"

    def median(wanted: list[int]) -> float:
        return statistics.median(statistics.median(ms for s, ms in steps.items() if s in wanted)
                                 for steps in per.values())

    return median(clean) / median(profiled)


def _step_spans(events: list[dict[str, Any]], steps: list[int]) -> list[tuple[float, float]]:
    """The ProfilerStep spans of ``steps`` (µs)."""
    return [(float(e["ts"]), float(e["ts"]) + float(e["dur"])) for e in events
            if e.get("cat") == "user_annotation" and e.get("name", "").startswith("ProfilerStep#")
            and int(e["name"].split("#")[1]) in steps]


def _unit_ranges(events: list[dict[str, Any]]) -> dict[Any, list[tuple[float, float]]]:
    """Per thread, the spans of FSDP2's labels that name a unit (``FSDP::<what> (<unit>)``)."""
    ranges: dict[Any, list[tuple[float, float]]] = {}
    for e in events:
        name = e.get("name", "")
        if e.get("cat") in ("user_annotation", "cpu_op") and name.startswith("FSDP::") and name.endswith(")") \
                and " (" in name:
            ranges.setdefault(e.get("tid"), []).append((float(e["ts"]), float(e["ts"]) + float(e["dur"])))
    return ranges


def fsdp2_unit_kernels_ms(path: Path, steps: list[int]) -> float:
    """Per step, the ms of GPU work launched (its runtime call's start) inside one of FSDP2's labels that
    names a unit (``FSDP::<what> (<unit>)``) on the launching thread, within ``steps``' ProfilerStep
    spans: the kernels' own durations, mean over ``steps``."""
    events = trace_events(path)
    spans, ranges = _step_spans(events, steps), _unit_ranges(events)
    gpu = {e["args"]["correlation"]: float(e["dur"]) for e in events
           if e.get("cat") in GPU_EVENTS and "correlation" in e.get("args", {})}
    total, seen = 0.0, set()
    for e in events:
        corr = e.get("args", {}).get("correlation")
        if e.get("cat") not in ("cuda_runtime", "cuda_driver") or corr not in gpu or corr in seen:
            continue
        ts = float(e["ts"])
        if any(lo <= ts < hi for lo, hi in spans) and any(a <= ts < b for a, b in ranges.get(e.get("tid"), [])):
            seen.add(corr)
            total += gpu[corr]
    return total / 1e3 / len(steps)


def _union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        elif b > a:
            out.append((a, b))
    return out


def fsdp2_kernels_alone_ms(path: Path, steps: list[int]) -> float:
    """Per step, the ms during which GPU work launched inside FSDP2's unit labels (as
    :func:`fsdp2_unit_kernels_ms` finds it) ran and no other GPU work did, inside ``steps``'
    ProfilerStep spans: FSDP's kernels that the model's work did not hide, mean over ``steps``. For runs
    without collectives on the device (a fake process group, one rank), where that is all of the GPU's
    work beside the model's."""
    events = trace_events(path)
    spans, ranges = _step_spans(events, steps), _unit_ranges(events)
    launched_in = set()
    for e in events:
        corr = e.get("args", {}).get("correlation")
        if e.get("cat") in ("cuda_runtime", "cuda_driver") and corr is not None \
                and any(a <= float(e["ts"]) < b for a, b in ranges.get(e.get("tid"), [])):
            launched_in.add(corr)
    own: list[tuple[float, float]] = []
    other: list[tuple[float, float]] = []
    for e in events:
        if e.get("cat") in GPU_EVENTS:
            iv = (float(e["ts"]), float(e["ts"]) + float(e["dur"]))
            (own if e.get("args", {}).get("correlation") in launched_in else other).append(iv)
    total = 0.0
    for lo, hi in spans:
        mine = _union([(max(a, lo), min(b, hi)) for a, b in own if b > lo and a < hi])
        theirs = _union([(max(a, lo), min(b, hi)) for a, b in other if b > lo and a < hi])
        total += sum(b - a for a, b in mine)
        total -= sum(max(0.0, min(b, d) - max(a, c)) for a, b in mine for c, d in theirs
                     if c < b and d > a)
    return total / 1e3 / len(steps)


def gather_label_launches(path: Path, steps: list[int]) -> list[tuple[str, float, float, float, float, float,
                                                                       list[tuple[float, float]]]]:
    """Per ``FSDP::all_gather (<unit>)`` label (the root's: ``FSDP::all_gather``, unit ``(root)``) inside
    ``steps``' ProfilerStep spans, in order: the unit; where in the label (a share of its wall time, from
    its start) the host launched the first GPU work before its ``fsdp::all_gather_copy_in`` op (FSDP2's
    cast of the parameters), the first inside that op (the copy-in) and the first after it (a fake group's
    copies), 1.0 where there is none; the GPU time (ns) of the work launched before the op and after
    it; and each launch after it, in order: (where in the label, its work's GPU ns)."""
    events = trace_events(path)
    spans = _step_spans(events, steps)
    gpu: dict[Any, float] = {}
    for e in events:
        if e.get("cat") in GPU_EVENTS and "correlation" in e.get("args", {}):
            corr = e["args"]["correlation"]
            gpu[corr] = gpu.get(corr, 0.0) + float(e["dur"])
    launches = sorted((t, tid, gpu[c]) for c, (t, tid) in _launches(events).items() if c in gpu)
    labels = sorted((float(e["ts"]), float(e["ts"]) + float(e["dur"]), e.get("tid"), e["name"]) for e in events
                    if e.get("cat") == "user_annotation"
                    and (e.get("name", "").startswith("FSDP::all_gather (") or e.get("name") == "FSDP::all_gather")
                    and any(a <= float(e["ts"]) < b for a, b in spans))
    copy_in = [(float(e["ts"]), float(e["ts"]) + float(e["dur"]), e.get("tid")) for e in events
               if e.get("name") == "fsdp::all_gather_copy_in"]
    out = []
    for a, b, tid, name in labels:
        op = next(((s, e) for s, e, t in copy_in if t == tid and a <= s < b), (b, b))
        mine = [(t, us) for t, who, us in launches if who == tid and a <= t < b]
        before = [(t, us) for t, us in mine if t < op[0]]
        inside = [(t, us) for t, us in mine if op[0] <= t < op[1]]
        after = [(t, us) for t, us in mine if t >= op[1]]

        def share(launched: list[tuple[float, float]], a: float = a, b: float = b) -> float:
            return (min(t for t, _ in launched) - a) / (b - a) if launched else 1.0

        out.append((name[len("FSDP::all_gather ("):-1] or "(root)", share(before), share(inside), share(after),
                    1e3 * sum(us for _, us in before), 1e3 * sum(us for _, us in after),
                    [((t - a) / (b - a), 1e3 * us) for t, us in after]))
    return out


def fsdp2_pre_hooks_us(path: Path, steps: list[int]) -> dict[tuple[str, str], float]:
    """Per (unit, phase): the µs of FSDP2's ``FSDP::pre_forward (<unit>)`` / ``FSDP::pre_backward (<unit>)``
    labels starting within ``steps``' ProfilerStep spans, less the all-gather and copy-out labels inside
    them on the same thread (``FSDP::all_gather (...)``, ``FSDP::all_gather_copy_out (...)``), summed."""
    events = trace_events(path)
    spans = _step_spans(events, steps)
    labels = [e for e in events if e.get("cat") in ("user_annotation", "cpu_op") and e.get("name", "").startswith("FSDP::")]
    inner = [e for e in labels if e["name"].startswith(("FSDP::all_gather (", "FSDP::all_gather_copy_out ("))]
    out: dict[tuple[str, str], float] = {}
    for e in labels:
        for prefix, phase in (("FSDP::pre_forward (", "forward"), ("FSDP::pre_backward (", "backward")):
            a = float(e["ts"])
            if not e["name"].startswith(prefix) or not any(lo <= a < hi for lo, hi in spans):
                continue
            b = a + float(e["dur"])
            held = sum(float(x["dur"]) for x in inner if x.get("tid") == e.get("tid") and a <= float(x["ts"])
                       and float(x["ts"]) + float(x["dur"]) <= b)
            key = (e["name"][len(prefix):-1], phase)
            out[key] = out.get(key, 0.0) + b - a - held
    return out


def fsdp2_label_us(path: Path, steps: list[int], what: str) -> dict[str, float]:
    """Per unit: the µs of FSDP2's ``FSDP::<what> (<unit>)`` labels starting within ``steps``' ProfilerStep
    spans, summed."""
    events = trace_events(path)
    spans = _step_spans(events, steps)
    prefix = f"FSDP::{what} ("
    out: dict[str, float] = {}
    for e in events:
        if e.get("cat") in ("user_annotation", "cpu_op") and e.get("name", "").startswith(prefix) \
                and any(lo <= float(e["ts"]) < hi for lo, hi in spans):
            unit = e["name"][len(prefix):-1]
            out[unit] = out.get(unit, 0.0) + float(e["dur"])
    return out


def launch_latency_us(path: Path) -> float:
    """The median µs from a launch (the first CUDA runtime or driver call of a correlation) to its GPU
    event's start, over the GPU events that started on an idle device (after every GPU event before
    them ended) and were launched after it went idle."""
    events = trace_events(path)
    launch = {c: t for c, (t, _) in _launches(events).items()}
    gpu = sorted((float(e["ts"]), float(e["ts"]) + float(e["dur"]), launch[c]) for e in events
                 if e.get("cat") in GPU_EVENTS and (c := (e.get("args") or {}).get("correlation")) in launch)
    out, busy_until = [], gpu[0][1]
    for start, end, at in gpu[1:]:
        if start > busy_until and at > busy_until:
            out.append(start - at)
        busy_until = max(busy_until, end)
    return statistics.median(out)


def _launches(events: list[dict[str, Any]]) -> dict[Any, tuple[float, Any]]:
    """Per correlation: when and on which thread its first CUDA runtime or driver call began (µs)."""
    out: dict[Any, tuple[float, Any]] = {}
    for e in events:
        corr = (e.get("args") or {}).get("correlation")
        if e.get("cat") in ("cuda_runtime", "cuda_driver") and corr is not None \
                and (corr not in out or float(e["ts"]) < out[corr][0]):
            out[corr] = (float(e["ts"]), e.get("tid"))
    return out


def pre_hook_launches_us(path: Path, steps: list[int]) -> dict[tuple[int, str, str], list[tuple[float, float]]]:
    """Per (step, unit, phase): the GPU work launched inside FSDP2's ``FSDP::pre_forward (<unit>)`` /
    ``FSDP::pre_backward (<unit>)`` label on its thread, outside the all-gather and copy-out labels in
    it, in launch order: (µs from the label's start to the launch, the work's GPU µs)."""
    events = trace_events(path)
    spans = dict(zip(steps, _step_spans(events, steps)))
    launch = _launches(events)
    gpu: dict[Any, float] = {}
    for e in events:
        if e.get("cat") in GPU_EVENTS and (c := (e.get("args") or {}).get("correlation")) in launch:
            gpu[c] = gpu.get(c, 0.0) + float(e["dur"])
    inner = [(float(e["ts"]), float(e["ts"]) + float(e["dur"]), e.get("tid")) for e in events
             if e.get("name", "").startswith(("FSDP::all_gather (", "FSDP::all_gather_copy_out ("))]
    out: dict[tuple[int, str, str], list[tuple[float, float]]] = {}
    for e in events:
        for prefix, phase in (("FSDP::pre_forward (", "forward"), ("FSDP::pre_backward (", "backward")):
            a = float(e["ts"])
            step = next((s for s, (lo, hi) in spans.items() if lo <= a < hi), None)
            if not e.get("name", "").startswith(prefix) or step is None:
                continue
            b, tid = a + float(e["dur"]), e.get("tid")
            mine = sorted((t - a, gpu[c]) for c, (t, who) in launch.items()
                          if c in gpu and who == tid and a <= t < b
                          and not any(x <= t < y and w == tid for x, y, w in inner))
            out.setdefault((step, e["name"][len(prefix):-1], phase), []).extend(mine)
    return out


# FSDP2's labels that name no unit's work (the root's module has the empty name: its labels carry none)
_NOT_A_UNITS = ("FSDP::root_pre_forward", "FSDP::root_post_backward_callback", "FSDP::cast_forward_inputs",
                "FSDP::inputs_to_device")


def fsdp2_host_wait_ms(path: Path, steps: list[int]) -> float:
    """Per step, the ms the GPU sat idle waiting on FSDP2's hooks: of each gap in the GPU's work inside
    ``steps``' ProfilerStep spans that ended with work launched after the gap began, the time from the
    gap's start to that launch during which the launching thread was inside one of FSDP2's labels of a
    unit's work (``FSDP::<what> (<unit>)``, the root's ``FSDP::<what>``; not ``_NOT_A_UNITS``); of work
    starting together, the latest launch ends the gap. Mean over ``steps``."""
    events = trace_events(path)
    launch = _launches(events)
    ranges: dict[Any, list[tuple[float, float]]] = {}
    for e in events:
        if e.get("cat") in ("user_annotation", "cpu_op") and e.get("name", "").startswith("FSDP::") \
                and e["name"] not in _NOT_A_UNITS:
            ranges.setdefault(e.get("tid"), []).append((float(e["ts"]), float(e["ts"]) + float(e["dur"])))
    ranges = {tid: _union(r) for tid, r in ranges.items()}
    work = sorted(((float(e["ts"]), float(e["ts"]) + float(e["dur"])) + launch[c] for e in events
                   if e.get("cat") in GPU_EVENTS and (c := (e.get("args") or {}).get("correlation")) in launch),
                  key=lambda w: (w[0], -w[2]))
    total = 0.0
    for lo, hi in _step_spans(events, steps):
        busy = _union([(max(s, lo), min(e, hi)) for s, e, _, _ in work if e > lo and s < hi])
        at = lo
        for s, e in [*busy, (hi, hi)]:
            a, b, at = at, s, max(at, e)
            ending = next((w for w in work if w[0] >= b), None)
            if b <= a or ending is None or ending[2] < a:
                continue
            total += sum(max(0.0, min(y, ending[2]) - max(x, a)) for x, y in ranges.get(ending[3], []))
    return total / 1e3 / len(steps)
