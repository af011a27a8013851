"""Where a CPU rank's time goes, per FSDP2 setting, bare: the training thread and gloo's threads.

On a CPU machine, gloo runs every collective on threads of its own: ``pt_gloo_runloop`` (the process
group's work) and ``gloo_tcp_loop`` (the transport's event loop). None of them is in a trace, so a
recording cannot show what they take from the training thread when the ranks have no core to spare.
Here each of the example trainer's ranks (``examples/train.py``, FSDP2) runs every setting bare, in
one process per rank, the settings interleaved round by round (as ``inproc_cpu_truth.py``, no
profiler and no recorder, but with a barrier before each step, so that the ranks' steps start
together), and reads per step:

- each thread group's CPU time, and its time runnable but waiting for a core (the run queue), from
  ``/proc/self/task/*/schedstat`` (Linux); the training thread's CPU time from
  ``time.thread_time_ns`` (its schedstat can lag by a scheduler tick);
- the wall time of the blocks' MLP ``Linear`` forwards (``fc_in``, ``fc_out``; forward hooks on those
  modules, inside FSDP's unit), and of the activation between them (from ``fc_in``'s end to
  ``fc_out``'s start: ``F.gelu``): model compute the settings share, op for op.

    python benchmarks/bench_thread_cpu.py --dim 32 --layers 8 [--rounds 3] [--steps 6] [--nproc 2]
    python benchmarks/bench_thread_cpu.py --dim 32 --layers 8 --profiled DIR

Prints one table, a row per setting: medians over every timed step of every round, every rank pooled.

``--profiled DIR`` also runs every setting under ``torch.profiler`` (CPU, input shapes recorded, as
``fsdpviz record --no-memory`` profiles), interleaved with the bare ones in each round, and writes each
round's traces to ``DIR/<setting>-r<round>/`` (gzipped). In this mode no run has the barrier before
each step, bare or profiled (a profiler step spans the time between two steps, and would hold it), so
that the two differ by the profiler alone; a profiler step also holds this script's reads of
``/proc`` between the timed steps. A second table then gives, per round, the ratio ``fsdpviz whatif``
predicts for each setting from the per-block traces on the traced clock (no clean steps: nothing is
taken out), beside the ratio the same round's traces of that setting ran at.
Results are recorded in docs/whatif.md ("One clock").
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_replay_clock import PREDICT, step_ratio, whatif
from inproc_cpu_truth import SETTINGS, WARM_STEPS, launch, start_rank

GROUPS = ("training thread", "gloo_tcp_loop", "pt_gloo_runloop", "other")
PROFILED = " (profiled)"


def thread_times() -> dict[str, tuple[int, int]]:
    """CPU time and run-queue wait (ns) so far, summed per thread group of this process."""
    main = threading.main_thread().native_id
    totals = {group: [0, 0] for group in GROUPS}
    seen = False
    for tid in os.listdir("/proc/self/task"):
        try:
            run, wait, _ = (int(v) for v in Path(f"/proc/self/task/{tid}/schedstat").read_text().split())
            name = Path(f"/proc/self/task/{tid}/comm").read_text().strip()
        except (OSError, ValueError):  # the thread ended between the listing and the read
            continue
        group = ("training thread" if int(tid) == main else
                 next((g for g in GROUPS[1:3] if name.startswith(g)), "other"))
        totals[group][0] += run
        totals[group][1] += wait
        seen = True
    if not seen:
        raise SystemExit("no thread's /proc/self/task/*/schedstat could be read "
                         "(a kernel without schedstats?)")
    return {group: (run, wait) for group, (run, wait) in totals.items()}


class MlpClock:
    """Wall time of the blocks' MLP ``Linear`` forwards, and of the activation between them (from
    ``fc_in``'s end to ``fc_out``'s start), by forward hooks on those modules."""

    def __init__(self, blocks: list[Any]) -> None:
        self.linear_ns = 0
        self.activation_ns = 0
        self._started: list[int] = []
        self._ended = 0
        linears = [getattr(block, part) for block in blocks for part in ("fc_in", "fc_out")]
        self._hooks = [m.register_forward_pre_hook(self._before) for m in linears]
        self._hooks += [m.register_forward_hook(self._after) for m in linears]

    def _before(self, module: Any, _inputs: Any) -> None:
        now = time.perf_counter_ns()
        if module.out_features < module.in_features:  # fc_out: the activation ran since fc_in ended
            self.activation_ns += now - self._ended
        self._started.append(now)

    def _after(self, _module: Any, _inputs: Any, _output: Any) -> None:
        self._ended = time.perf_counter_ns()
        self.linear_ns += self._ended - self._started.pop()

    def remove(self) -> None:
        for hook in self._hooks:
            hook.remove()


def rank_main(dim: int, layers: int, rounds: int, steps: int, profiled: Path | None) -> None:
    """One rank: every setting in every round (and each profiled, with ``profiled``), alternating the
    order; rank 0 prints every rank's steps."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.profiler import ProfilerActivity, profile, schedule

    train, args, ddp, batches = start_rank(dim, layers, steps)
    names = list(SETTINGS) + ([name + PROFILED for name in SETTINGS] if profiled else [])
    rows: dict[str, list[dict[str, float]]] = {name: [] for name in names}
    for r in range(rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            setting = name.removesuffix(PROFILED)
            args.wrap, args.reshard_after_forward = SETTINGS[setting]
            model = train.shard_fsdp2(train.build_model(args), args, ddp)
            optimizer = torch.optim.AdamW(model.parameters(), lr=train.LEARNING_RATE)
            # isinstance: FSDP2 renames a sharded block's class
            clock = MlpClock([m for m in model.modules() if isinstance(m, train.Block)])
            prof = None
            if profiled and name.endswith(PROFILED):
                folder = profiled / f"{setting}-r{r}"
                folder.mkdir(parents=True, exist_ok=True)
                prof = profile(activities=[ProfilerActivity.CPU], record_shapes=True,
                               schedule=schedule(wait=0, warmup=WARM_STEPS, active=steps, repeat=1),
                               on_trace_ready=lambda p, f=folder: p.export_chrome_trace(
                                   str(f / f"rank{ddp.rank}.trace.json.gz")))
                prof.start()
            for i, batch in enumerate(batches):
                if profiled is None:  # with --profiled, no run has it (the module docstring)
                    dist.barrier()
                clock.linear_ns = clock.activation_ns = 0
                before_step = thread_times()
                start, thread_start = time.perf_counter_ns(), time.thread_time_ns()
                logits = model(batch[:, :-1])
                F.cross_entropy(logits.reshape(-1, train.VOCAB_SIZE), batch[:, 1:].reshape(-1)).backward()
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                wall, own_cpu = time.perf_counter_ns() - start, time.thread_time_ns() - thread_start
                after_step = thread_times()
                if prof is not None:
                    prof.step()
                if i >= WARM_STEPS:
                    row = {"step": wall / 1e6, "MLP linear forwards": clock.linear_ns / 1e6,
                           "MLP activation forwards": clock.activation_ns / 1e6}
                    for group in GROUPS:
                        row[f"{group} CPU"] = (after_step[group][0] - before_step[group][0]) / 1e6
                        row[f"{group} run-queue wait"] = (after_step[group][1] - before_step[group][1]) / 1e6
                    row["training thread CPU"] = own_cpu / 1e6
                    rows[name].append(row)
            if prof is not None:
                prof.stop()
            clock.remove()
            del model, optimizer, prof
            gc.collect()
    gathered: list[Any] = [None] * ddp.world_size
    dist.all_gather_object(gathered, rows)
    if ddp.rank == 0:
        print(json.dumps({"rows": gathered, "dim": dim, "layers": layers, "world": ddp.world_size}))
    dist.destroy_process_group()
    time.sleep(0.1)  # gloo's threads release the last collective (examples/train.py)


def measure(dim: int, layers: int, rounds: int, steps: int, nproc: int, profiled: Path | None = None) -> dict[str, Any]:
    """Run the measurement on ``nproc`` gloo ranks; its JSON (``rows``: per rank, setting -> steps)."""
    return launch(__file__, ["--dim", str(dim), "--layers", str(layers), "--rounds", str(rounds),
                             "--steps", str(steps), *(["--profiled", str(profiled)] if profiled else [])],
                  nproc, what="the measurement")


def print_traced(profiled: Path, rounds: int) -> None:
    """Per setting, each round's ratio predicted from its per-block traces against the ratio its own
    traces ran at, both on the traced clock; and their medians."""
    print("\nOn the traced clock, per round: predicted from the per-block traces / the setting's own traces "
          "(step ratios to per block)\n")
    print("| setting | " + " | ".join(f"round {r}" for r in range(rounds)) + " | median predicted | median traced |")
    print("|---|" + "---:|" * (rounds + 2))
    block = [whatif(profiled / f"block-r{r}", [])["baseline"]["step_time_ms"] for r in range(rounds)]
    for name, options in PREDICT.items():
        cells, predicted, traced = [], [], []
        for r in range(rounds):
            predicted.append(step_ratio(profiled / f"block-r{r}", options))
            traced.append(whatif(profiled / f"{name}-r{r}", [])["baseline"]["step_time_ms"] / block[r])
            cells.append(f"{predicted[-1]:.3f} / {traced[-1]:.3f}")
        print(f"| {name} | " + " | ".join(cells) +
              f" | {statistics.median(predicted):.3f} | {statistics.median(traced):.3f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dim", type=int, default=32)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--nproc", type=int, default=2, help="ranks (processes) on this machine")
    parser.add_argument("--profiled", type=Path, default=None, metavar="DIR",
                        help="also run every setting profiled, write its traces under DIR, and compare "
                             "fsdpviz whatif's predictions from the per-block traces with them")
    args = parser.parse_args()
    if min(args.dim, args.layers, args.rounds, args.steps, args.nproc) < 1:
        parser.error("--dim, --layers, --rounds, --steps and --nproc must be at least 1")
    if not Path("/proc/self/task").is_dir():
        parser.error("needs Linux's /proc/self/task/*/schedstat")
    if os.environ.get("FSDPVIZ_INPROC_RANK"):
        rank_main(args.dim, args.layers, args.rounds, args.steps, args.profiled)
        return
    if args.profiled is not None:
        if args.profiled.exists() and (not args.profiled.is_dir() or any(args.profiled.iterdir())):
            parser.error(f"--profiled {args.profiled} is not empty: give a new folder")
        args.profiled = args.profiled.resolve()
    from harness import describe_machine

    started = time.perf_counter()
    result = measure(args.dim, args.layers, args.rounds, args.steps, args.nproc, args.profiled)
    print(describe_machine())
    kind = "bare and profiled" if args.profiled else "bare"
    print(f"\ndim {args.dim}, {args.layers} blocks, {result['world']} rank(s), {kind}; ms per step, "
          f"medians over {args.rounds} rounds x {args.steps} steps x every rank")
    columns = ["step", "MLP linear forwards", "MLP activation forwards",
               *(f"{g} {kind}" for g in GROUPS for kind in ("CPU", "run-queue wait"))]
    print("\n| setting | " + " | ".join(columns) + " |")
    print("|---|" + "---:|" * len(columns))
    for name in result["rows"][0]:
        pooled = [row for per_rank in result["rows"] for row in per_rank[name]]
        cells = " | ".join(f"{statistics.median(row[c] for row in pooled):.2f}" for c in columns)
        print(f"| {name} | {cells} |")
    if args.profiled is not None:
        print_traced(args.profiled, args.rounds)
    print(f"\n({time.perf_counter() - started:.0f} s, load average {os.getloadavg()[0]:.2f})")


if __name__ == "__main__":
    main()
