"""How far the replay without the profiler misses each recording's unprofiled steps, and what two
recordings of one setting predict: the tables of docs/whatif.md ("One clock", "The replay's error").

For every bundled sample, every shared H100 recording and the H200 recordings of model B it prints the
profiler's slowdown, the clock, and ``clock.replay_error_pct``: the replay of the traced steps, taken
off the profiler by the one de-profiler's measured factor (CPU) or per-event cost (GPU), against the
timers' clean steps. On CPU that factor is the clean step over the traced one, so this figure is the
replay's miss of the traced steps carried to the clean clock, not a check on anything the trace does
not hold; on a GPU the excess is the clean steps' too, and only how much of it the step loses is the
replay's. Beside it, the replay of the traced steps against the traced steps themselves (whatif's
``traced_replay_error_pct``).

Out of sample, per phase: where the replay took the profiler's share out, against the timers'
phases in unprofiled steps (``clock.phase_miss_pct``, :mod:`fsdpviz.replay.phases`), in % of the
unprofiled step; null where no unprofiled step timed its phases (a GPU's clean steps, or a folder
recorded before the clean steps timed theirs).

On a GPU, the bound against the replay: the time the bound takes out of the traced step (the measured
excess) beside the replay's own drop without the profiler, and exposed communication beside the
replay's move of it (docs/whatif.md, "The bound and the replay on a GPU"); and the replay's own parts
of the step against the bound's (docs/whatif.md, "Why the bound is not the replay's own split"), its
idle time split as the bound splits it (host wait, FSDP's host work, other idle), and the same on CPU.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
from pathlib import Path
from typing import Any

from fsdpviz.analysis.pipeline import analyse
from fsdpviz.errors import FsdpvizError
from fsdpviz.replay.settings import Settings, Wrap
from fsdpviz.whatif.gains import completed_summary, summary_model
from fsdpviz.whatif.predict import predict

ROOT = Path(__file__).resolve().parents[1]
SETTINGS = {"root": Settings().with_(wrap=Wrap("root")), "merge:2": Settings().with_(wrap=Wrap("merge", k=2)),
            "reshard false": Settings().with_(reshard_after_forward=False)}
# ../shared/traces/gpu-h200/README.md: ratios of the medians of 9 in-process interleaved bare rounds
H200_BARE = {"root": 0.67, "merge:2": 0.84, "reshard false": 0.84}


def phase_row(name: str, clock: Any) -> str:
    """The out-of-sample table's row: the clock's per-phase misses (``fsdpviz.replay.phases``)."""
    if clock.phase_miss_pct is None:  # the clock's note says why
        why = re.search(r"its phases are not checked out of sample \((.*)\)", clock.note)
        return f"| {name} | 0 | | | | not checked: {why[1] if why else 'no replay without the profiler'} |"
    cells = " | ".join(f"{clock.phase_miss_pct[p]:+.1f} %" if p in clock.phase_miss_pct else "not timed"
                       for p in ("forward", "backward", "optimizer"))
    return f"| {name} | {clock.phase_steps} | {cells} | {clock.phase_error_pct:.1f} % |"


def row(folder: Path) -> tuple[str, dict[str, float] | None]:
    """One table row for ``folder``, and its predicted step ratios (None where it cannot be read)."""
    result = analyse([folder], cache=False, progress=False)
    summary = completed_summary(result)
    clock, cost = summary.clock, summary.profiler
    model, why = summary_model(result)
    if model is None or clock is None:
        return f"| {folder.name} | | | | | {why} |", None
    base = predict(model, Settings())
    ratios: dict[str, float] = {}
    for name, settings in SETTINGS.items():
        try:
            p = predict(model, settings)
        except FsdpvizError:
            continue
        ratios[name] = p.predicted.step_time_ms / p.baseline.step_time_ms
    slowdown = f"{cost.slowdown:.2f}x" if cost is not None else "n/a"
    clean = f"{clock.replay_error_pct:.1f} %" if clock.replay_error_pct is not None else "n/a"
    PHASE_ROWS.append(phase_row(folder.name, clock))
    if summary.device == "gpu" and model.net is not None and summary.bound is not None:
        GPU_ROWS.append(gpu_row(folder.name, summary.bound, model))
        PARTS_ROWS.append(parts_row(folder.name, summary.bound, model))
        IDLE_ROWS.append(idle_row(folder.name, summary.bound, model))
    if summary.device == "cpu" and model.net is not None and summary.bound is not None:
        CPU_PARTS_ROWS.append(cpu_parts_row(folder.name, summary.bound, model))
    return (f"| {folder.name} | {summary.device} | {slowdown} | {clock.basis} | {clean} | "
            f"{base.traced_replay_error_pct:.1f} % |"), ratios


PHASE_ROWS: list[str] = []
GPU_ROWS: list[str] = []
PARTS_ROWS: list[str] = []
IDLE_ROWS: list[str] = []
CPU_PARTS_ROWS: list[str] = []


def _median_ms(replays: Any, get: Any) -> float:
    """The median over ``replays`` (simulated steps) of ``get`` (ns), in ms."""
    return statistics.median(get(r) for r in replays) / 1e6


def cpu_parts_row(name: str, bound: Any, model: Any) -> str:
    """The bound's parts of a CPU step against the replay's own without the profiler (medians over ranks
    and steps, ms): compute, communication and exposed communication."""
    net = model.net.replays
    return (f"| {name} | {bound.compute_ms:,.2f} / {_median_ms(net, lambda r: r.compute_ns):,.2f} | "
            f"{bound.comm_ms:,.2f} / {_median_ms(net, lambda r: r.comm_ns):,.2f} | "
            f"{bound.exposed_comm_ms:,.2f} / {_median_ms(net, lambda r: r.exposed_comm_ns):,.2f} |")


def parts_row(name: str, bound: Any, model: Any) -> str:
    """The bound's parts of a GPU step against the replay's own without the profiler (medians over ranks
    and steps, ms): compute, FSDP's copy kernels (also the replay's of the traced steps: the profiler's
    host, as the trace's own split), exposed communication."""
    net = model.net.replays
    return (f"| {name} | {bound.compute_ms:,.2f} / {_median_ms(net, lambda r: r.compute_ns):,.2f} | "
            f"{bound.fsdp_kernels_ms or 0.0:,.2f} / {_median_ms(net, lambda r: r.fsdp_copy_ns):,.2f} | "
            f"{_median_ms(model.replays, lambda r: r.fsdp_copy_ns):,.2f} | "
            f"{bound.exposed_comm_ms:,.2f} / {_median_ms(net, lambda r: r.exposed_comm_ns):,.2f} |")


def idle_row(name: str, bound: Any, model: Any) -> str:
    """The bound's split of a GPU step's idle time against the replay's own without the profiler (medians
    over ranks and steps, ms): host wait, FSDP's host work (the GPU waiting on FSDP's hooks), other idle,
    and the three together (the step less the device's work)."""
    net = model.net.replays
    fsdp_host = bound.fsdp_overhead_ms - (bound.fsdp_kernels_ms or 0.0)
    host = bound.host_wait_ms
    parts = [(host, _median_ms(net, lambda r: r.host_wait_ns)), (fsdp_host, _median_ms(net, lambda r: r.fsdp_host_ns)),
             (bound.other_idle_ms, _median_ms(net, lambda r: r.other_idle_ns)),
             ((host or 0.0) + fsdp_host + bound.other_idle_ms,
              _median_ms(net, lambda r: r.host_wait_ns + r.fsdp_host_ns + r.other_idle_ns))]
    cells = " | ".join(f"{'n/a' if b is None else f'{b:,.2f}'} / {r:,.2f}" for b, r in parts)
    return f"| {name} | {cells} |"


def gpu_row(name: str, bound: Any, model: Any) -> str:
    """The bound against the replay on a GPU recording: the time each takes out of the traced step (the
    bound: the measured excess, traced less clean step; the replay: its traced steps' median less its
    steps' without the profiler) and what the replay moves exposed communication by (ms)."""
    traced, net = model.replays, model.net.replays
    drop = _median_ms(traced, lambda r: r.step_ns) - _median_ms(net, lambda r: r.step_ns)
    moved = _median_ms(net, lambda r: r.exposed_comm_ns) - _median_ms(traced, lambda r: r.exposed_comm_ns)
    return (f"| {name} | {bound.traced_step_ms - bound.step_ms:.1f} | {drop:.1f} | "
            f"{bound.exposed_comm_ms:,.1f} / {moved:+.1f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shared", type=Path, default=ROOT.parent / "shared" / "traces")
    parser.add_argument("--also", type=Path, nargs="*", default=[], metavar="RUN",
                        help="more run folders to put in the tables (e.g. recordings a benchmark kept)")
    args = parser.parse_args()
    folders = [p for p in sorted((ROOT / "sample_traces").iterdir()) if (p / "run.json").is_file()]
    folders += [p for p in sorted((args.shared / "gpu-fsdp").glob("h100-*")) if p.is_dir()]
    h200 = [args.shared / "gpu-h200" / name for name in ("B", "Bl", "Broot")]
    folders += [p for p in h200 if p.is_dir()]
    folders += [p for p in args.also if (p / "run.json").is_file()]
    print("| recording | device | slowdown | clock | replay vs clean steps | replay vs traced |")
    print("|---|---|---:|---|---:|---:|")
    predicted: dict[str, dict[str, float]] = {}
    errors = []
    for folder in folders:
        line, ratios = row(folder)
        print(line, flush=True)
        if ratios is not None:
            predicted[folder.name] = ratios
        cell = line.split("|")[5].strip()
        if cell.endswith("%"):
            errors.append(float(cell.removesuffix(" %")))
    if errors:
        print(f"\nreplay vs clean steps: median {statistics.median(errors):.1f} %, largest {max(errors):.1f} %")
    print("\nOut of sample, per phase: the profiler's share the replay took out less the share the timers saw "
          "leave it, in % of the unprofiled step (clock.phase_miss_pct; medians over ranks):\n")
    print("| recording | unprofiled steps timed | forward | backward | optimizer | largest |")
    print("|---|---:|---:|---:|---:|---:|")
    for line in PHASE_ROWS:
        print(line)
    if GPU_ROWS:
        print("\nOn a GPU, the bound and the replay: what each takes out of the traced step (ms), and exposed "
              "communication (the bound's, ms) against the replay's move of it:\n")
        print("| recording | the bound takes out (traced less clean step) | the replay's own drop | "
              "exposed communication: the bound's / the replay's move |")
        print("|---|---:|---:|---|")
        for line in GPU_ROWS:
            print(line)
        print("\nThe bound's parts of the step against the replay's own without the profiler (ms; medians):\n")
        print("| recording | compute: bound / replay | FSDP's copy kernels: bound / replay | "
              "FSDP's copy kernels: replay of the traced steps | exposed communication: bound / replay |")
        print("|---|---|---|---:|---|")
        for line in PARTS_ROWS:
            print(line)
        print("\nThe bound's split of the step's idle time against the replay's own without the profiler (ms; "
              "medians; the replay's by the bound's rule on its simulated streams):\n")
        print("| recording | host wait: bound / replay | FSDP's host work: bound / replay | other idle: bound / replay | "
              "the three: bound / replay |")
        print("|---|---|---|---|---|")
        for line in IDLE_ROWS:
            print(line)
    if CPU_PARTS_ROWS:
        print("\nOn CPU, the bound's parts of the step against the replay's own without the profiler (ms; "
              "medians):\n")
        print("| recording | compute: bound / replay | communication: bound / replay | "
              "exposed communication: bound / replay |")
        print("|---|---|---|---|")
        for line in CPU_PARTS_ROWS:
            print(line)
    if "B" in predicted and "Bl" in predicted:
        print("\n| setting | bare (in-process) | predicted from B | from Bl | B − Bl |")
        print("|---|---:|---:|---:|---:|")
        for name, bare in H200_BARE.items():
            b, bl = predicted["B"].get(name), predicted["Bl"].get(name)
            if b is None or bl is None:
                continue
            print(f"| {name} | {bare:.2f} | {b:.3f} | {bl:.3f} | {b - bl:+.3f} |")
    print(json.dumps({"predicted_ratios": predicted}, indent=None))


if __name__ == "__main__":
    main()
