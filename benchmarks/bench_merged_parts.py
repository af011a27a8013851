"""What one root unit costs, part by part: predicted from a per-block recording against a root recording.

Records the example trainer (FSDP2, 12 steps, 2 gloo ranks) per block and as one root unit under the
same light profiler (``--no-memory``), round by round, and reads both as the what-if model does, on
the traced clock (the profiler in both). Per round it prints, per step (medians over ranks and
steps), each part of the step that a merged unit costs differently:

- the host's work in the reduction labels (a unit's gradients' copy-in, the call, the sharded
  gradients): the per-block run's sum over its units, the root prediction's, the root run's;
- the gaps between unit windows (FSDP's hook dispatch at a unit boundary);
- the all-gathers and reduce-scatters, and the step's first all-gather on its own;
- the model's compute in forward and backward;

and, from the per-block recording, the all-gather line's cost per MB with each step's first gather
left out (as the model fits it) and kept in, and each collective size's median above its lower
quartile; and the model's own ops whose time per step differs most between the two runs (count per
step and median duration of each, from the traces: the same ops at another pace). docs/whatif.md
("Against bare runs, under two profiler loads") quotes these figures.

    python benchmarks/bench_merged_parts.py [--dim 256 --layers 4] [--rounds 2] [--out DIR]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_whatif_cpu import record, recordings_folder
from harness import describe_machine

from fsdpviz.analysis.pipeline import RunResult, analyse
from fsdpviz.replay import comm as comm_model
from fsdpviz.replay import program as prog
from fsdpviz.replay.model import Model, read_model
from fsdpviz.replay.recorded import Pass, StepProgram
from fsdpviz.replay.settings import Settings, Wrap
from fsdpviz.structure.intervals import union_intervals
from fsdpviz.trace import schema
from fsdpviz.vocabulary import BACKWARD, FORWARD

ROOT_WRAP = Settings(wrap=Wrap("root"))


def per_step(model: Model, part: Callable[[StepProgram], float]) -> float:
    """The median over ranks of each rank's median over its steps of ``part`` (ms)."""
    ranks: dict[int, list[float]] = {}
    for s in model.recording.steps:
        ranks.setdefault(s.rank, []).append(part(s))
    return statistics.median(statistics.median(v) for v in ranks.values()) / 1e6


def recorded_parts(model: Model) -> dict[str, float]:
    def passes(s: StepProgram, phase: str) -> list[Pass]:
        return [p for mb in s.micro for p in (mb.forward if phase == FORWARD else mb.backward)]
    return {
        "reduction host work": per_step(model, lambda s: sum(r.host_ns for r in s.reduces)),
        "gaps between windows": per_step(model, lambda s: sum(p.gap_ns for mb in s.micro
                                                                for p in (*mb.forward, *mb.backward))),
        "all-gathers": per_step(model, lambda s: sum(g.comm_ns for g in s.gathers)),
        "first all-gather": per_step(model, lambda s: s.gathers[0].comm_ns if s.gathers else 0.0),
        "reduce-scatters": per_step(model, lambda s: sum(r.comm_ns for r in s.reduces)),
        "forward compute": per_step(model, lambda s: sum(p.compute_ns for p in passes(s, FORWARD))),
        "backward compute": per_step(model, lambda s: sum(p.compute_ns for p in passes(s, BACKWARD))),
    }


def predicted_parts(model: Model) -> dict[str, float]:
    """The same parts in the programs the model plays for one root unit (the trace's clock)."""
    rec = model.recording
    programs: dict[int, list[prog.Program]] = {}
    for s in rec.steps:
        programs.setdefault(s.rank, []).append(prog.build(rec, s, ROOT_WRAP, model.comm, model.gathers))

    def part(f: Callable[[prog.Program], float]) -> float:
        return statistics.median(statistics.median(f(p) for p in ps) for ps in programs.values()) / 1e6

    def busy(p: prog.Program, what: str) -> float:
        return sum(op.ns for op in p.ops if isinstance(op, prog.BusyOp) and op.what == what)

    reduce_line = model.comm.lines.get(prog.REDUCE_HOST)
    return {
        "reduction host work": part(lambda p: sum(reduce_line.typical(r.bytes) for r in p.reduces))
        if reduce_line is not None else float("nan"),
        "gaps between windows": part(lambda p: busy(p, "gap")),
        "all-gathers": part(lambda p: sum(g.comm_ns for g in p.gathers)),
        "first all-gather": part(lambda p: p.gathers[0].comm_ns if p.gathers else 0.0),
        "reduce-scatters": part(lambda p: sum(r.comm_ns for r in p.reduces)),
        "forward compute": part(lambda p: sum(op.ns for op in p.ops if isinstance(op, prog.ComputeOp)
                                              and op.phase == FORWARD)),
        "backward compute": part(lambda p: sum(op.ns for op in p.ops if isinstance(op, prog.ComputeOp)
                                               and op.phase == BACKWARD)),
    }


def gather_line_us_per_mb(model: Model) -> tuple[float, float]:
    """The all-gather line's cost per MB from the per-block recording: each step's first gather left
    out (as the model fits it), and kept in as an ordinary sample."""
    rec = model.recording
    every = [("all_gather", g.bytes, g.comm_ns) for s in rec.steps for g in s.gathers]
    link = comm_model.NOMINAL_LINK.get(rec.device)
    kept = comm_model.fit(every, rec.world_size, rec.ranks_per_host, link=link)
    return model.comm.lines["all_gather"].per_byte_ns * 1e3, kept.lines["all_gather"].per_byte_ns * 1e3


def excess_by_size(model: Model) -> str:
    """Each reduce-scatter size's median above its lower quartile, in µs and in % of the quartile."""
    sizes: dict[int, list[float]] = {}
    for s in model.recording.steps:
        for r in s.reduces:
            sizes.setdefault(r.bytes, []).append(r.comm_ns)
    cells = []
    for nbytes, values in sorted(sizes.items()):
        q = float(np.quantile(values, 0.25))
        above = float(np.median(values)) - q
        cells.append(f"{nbytes / 1e3:,.0f} KB +{above / 1e3:.0f} us (+{100 * above / q:.0f} %)")
    return ", ".join(cells)


def model_ops(result: RunResult) -> tuple[int, dict[str, list[float]]]:
    """(profiled steps summed over ranks, each ``aten::`` op's durations in µs) of the model's own ops
    on every rank's training thread, outside FSDP's labels (its copies and calls are other parts)."""
    events, lanes = result.traces.events, result.traces.lanes
    steps, durations = 0, defaultdict(list)
    main = lanes[lanes["lane_kind"] == schema.LANE_CPU_MAIN]
    for rank, lane in main[["rank", "lane"]].itertuples(index=False):
        ev = events[((events["rank"] == rank) & (events["lane"] == lane)).to_numpy()]
        names = ev["name"].astype(str)
        starts = ev["start_ns"].to_numpy(np.int64)
        ends = starts + ev["dur_ns"].to_numpy(np.int64)
        fsdp = names.str.startswith("FSDP::").to_numpy()
        # FSDP's labels nest: their union
        label_starts, label_ends = union_intervals(starts[fsdp], ends[fsdp])
        steps += ev["step"].nunique()
        ops = ((ev["kind"] == schema.KIND_CPU_OP) & names.str.startswith("aten::")).to_numpy()
        k = np.searchsorted(label_starts, starts[ops], side="right") - 1
        inside = (k >= 0) & (starts[ops] < label_ends[np.maximum(k, 0)])
        for name, dur in zip(names[ops][~inside], ev["dur_ns"].to_numpy()[ops][~inside], strict=True):
            durations[name].append(dur / 1e3)
    return steps, durations


def ops_apart(block: RunResult, root: RunResult, top: int = 4) -> list[str]:
    """Table rows of the ``top`` ops whose time per step differs most between the two recordings."""
    (nb, b), (nr, r) = model_ops(block), model_ops(root)
    rows = sorted(((sum(b.get(n, [])) / nb - sum(r.get(n, [])) / nr) / 1e3, n) for n in set(b) | set(r))

    def median(values: list[float]) -> str:
        return f"{statistics.median(values):.1f}" if values else "-"

    return [f"| `{n}` | {len(b.get(n, [])) / nb:.0f} / {len(r.get(n, [])) / nr:.0f} | "
            f"{median(b.get(n, []))} / {median(r.get(n, []))} | {d:+.2f} |"
            for d, n in sorted(rows, key=lambda x: -abs(x[0]))[:top]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None, help="keep the recordings here (default: a temp folder)")
    args = parser.parse_args()
    trainer = ["--framework", "fsdp2", "--layers", str(args.layers), "--dim", str(args.dim), "--steps", "12"]
    print(describe_machine())
    with recordings_folder(args.out) as base:
        for i in range(args.rounds):
            models = {}
            for wrap in ("block", "root"):
                folder = base / f"{wrap}-{i}"
                if not (folder / "run.json").is_file():
                    record(folder, ["--wrap", wrap], model=trainer, options=("--no-memory",))
                models[wrap] = read_model(analyse([folder], cache=False, progress=False))
            block, root = recorded_parts(models["block"]), recorded_parts(models["root"])
            predicted = predicted_parts(models["block"])
            print(f"\nround {i} (dim {args.dim}, {args.layers} blocks), ms per step as traced\n")
            print("| part | per block, recorded | one root unit, predicted from it | one root unit, recorded |")
            print("|---|---:|---:|---:|")
            for name in block:
                print(f"| {name} | {block[name]:.2f} | {predicted[name]:.2f} | {root[name]:.2f} |")
            fitted, kept = gather_line_us_per_mb(models["block"])
            print(f"\nall-gather line from the per-block recording: {fitted:.0f} us/MB with each step's first "
                  f"gather left out, {kept:.0f} us/MB with it kept in")
            print(f"reduce-scatters' median above their lower quartile: {excess_by_size(models['block'])}")
            print("\n| op (model compute) | per step: per block / root | median µs: per block / root "
                  "| per block minus root, ms per step |")
            print("|---|---:|---:|---:|")
            print("\n".join(ops_apart(models["block"].result, models["root"].result)))


if __name__ == "__main__":
    main()
