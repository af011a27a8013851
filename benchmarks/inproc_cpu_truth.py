"""Step-time ratios of the example trainer's FSDP2 settings, measured bare inside one process per rank.

Separate runs on a shared 2-core machine drift by 20-30 % from process to process, more than some of
the effects a prediction is checked against. Here each of 2 gloo ranks builds the example trainer's
model (``examples/train.py``) once per setting and round, in an order that alternates from round to
round, and times each of its steady steps (no profiler, no recorder). A setting's step in a round is
the median of its steps' times on each rank, then the median over the ranks: the statistic fsdpviz's
own step is (the median of the clean steps, then over ranks), so that one slow step -- a rank waiting for a core
or for gloo's threads on a shared machine -- moves the truth no more than it moves a recording's step.
Each round's ratios are to that round's per-block step, and the median over rounds is printed as JSON
by rank 0 (``ratios``, ``per_round``; ``per_round_mean`` holds the same ratios of the mean step, the
time of all the steps over their count, which results in docs/whatif.md before the fifteenth run of
``bench_replay_clock.py`` read; ``statistic`` says which ``per_round`` holds: files written before it was
kept hold the mean there and neither ``statistic`` nor ``per_round_mean``, which :func:`rounds_of` reads
as such).

    python benchmarks/inproc_cpu_truth.py --dim 32 --layers 8 [--rounds 5] [--steps 8] [--framework fsdp1]

Settings: ``block`` (every block a unit), ``pair`` (blocks in pairs, one unit each), ``root`` (one unit),
``noreshard`` (per block, no resharding after forward) -- the settings ``bench_replay_clock.py`` predicts.
``--framework fsdp1``: the same model under FSDP1 (the trainer's ``shard_fsdp1``), block, pair and root.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SETTINGS = {"block": ("block", True), "pair": ("pair", True), "root": ("root", True), "noreshard": ("block", False)}
WARM_STEPS = 3
MEDIAN_STEP = "median"  # a setting's step in a round: its steps' median (``per_round``)
MEAN_STEP = "mean"  # all its steps' time over their count (``per_round_mean``; ``per_round`` in older files)


def rounds_of(measured: dict[str, Any], statistic: str) -> dict[str, list[float]] | None:
    """The per-round ratios of a measurement's JSON (as :func:`measure` returns it, or a kept file) read
    as ``statistic`` (:data:`MEDIAN_STEP` or :data:`MEAN_STEP`); None where it does not hold them (a
    file written before the median step was kept holds only the mean)."""
    # the mean was kept beside the median from the first file that held the median
    held = measured.get("statistic", MEDIAN_STEP if "per_round_mean" in measured else MEAN_STEP)
    if held == statistic:
        return dict(measured["per_round"])
    if statistic == MEAN_STEP and "per_round_mean" in measured:
        return dict(measured["per_round_mean"])
    return None


def common_statistic(measured: list[dict[str, Any]]) -> str:
    """The statistic every measurement of ``measured`` holds: the median step where all do, else the mean
    (which every one holds), so that truths of two statistics are never pooled."""
    return MEDIAN_STEP if all(rounds_of(m, MEDIAN_STEP) is not None for m in measured) else MEAN_STEP


def pooled_rounds(paths: list[Path]) -> tuple[str, dict[str, list[float]]]:
    """Every round of the kept measurements at ``paths`` (``inproc-N.json``), per setting, as one statistic
    (:func:`common_statistic`), and that statistic."""
    measured = [json.loads(p.read_text()) for p in paths]
    statistic = common_statistic(measured)
    pooled: dict[str, list[float]] = {}
    for m in measured:
        for name, values in (rounds_of(m, statistic) or {}).items():
            pooled.setdefault(name, []).extend(values)
    return statistic, pooled


def start_rank(dim: int, layers: int, steps: int, framework: str = "fsdp2") -> tuple[Any, Any, Any, list[Any]]:
    """A rank of a measurement on the example trainer (CPU): its module, its arguments for the model
    (``WARM_STEPS + steps`` steps), the process group and the batches."""
    sys.path.insert(0, str(ROOT / "examples"))
    import train

    warnings.simplefilter("ignore")
    args = train.parse_args(["--framework", framework, "--layers", str(layers), "--dim", str(dim),
                             "--steps", str(WARM_STEPS + steps), "--seed", "0"])
    ddp = train.init_distributed("cpu")
    return train, args, ddp, train.make_batches(args, ddp)


def launch(script: str, options: list[str], nproc: int = 2, what: str = "in-process truth") -> dict[str, Any]:
    """Run ``script`` with ``options`` on ``nproc`` gloo ranks (torchrun, one thread each, the
    ``FSDPVIZ_INPROC_RANK`` variable set); the JSON line rank 0 prints."""
    env = {**os.environ, "FSDPVIZ_INPROC_RANK": "1", "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc),
               script, *options]
    try:
        proc = subprocess.run(command, check=False, capture_output=True, text=True, env=env, timeout=900)
    except subprocess.TimeoutExpired as exc:
        raise SystemExit(f"{what} ran past {exc.timeout:g} s") from exc
    if proc.returncode != 0:
        raise SystemExit(f"{what} failed:\n{proc.stderr[-2000:]}")
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if not lines:
        raise SystemExit(f"{what} printed no result:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    return json.loads(lines[0])


def time_steps(optimizer: Any, steps: int, step: Callable[[int], None], each: list[float] | None = None) -> float:
    """ms per step over ``steps`` steps after ``WARM_STEPS`` untimed ones: ``step(i)`` runs step i's
    forwards and backwards, then the optimizer steps; the clock starts and stops at a barrier of every
    rank. ``each``, when given, receives every timed step's own ms on this rank (from the end of the
    step before, so that they add up to the whole but for the closing barrier)."""
    import torch.distributed as dist

    start = last = time.perf_counter()
    for i in range(WARM_STEPS + steps):
        if i == WARM_STEPS:
            dist.barrier()
            start = last = time.perf_counter()
        step(i)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if each is not None and i >= WARM_STEPS:
            now = time.perf_counter()
            each.append((now - last) * 1e3)
            last = now
    dist.barrier()
    return (time.perf_counter() - start) * 1e3 / steps


def rank_main(dim: int, layers: int, rounds: int, steps: int, framework: str = "fsdp2") -> None:
    """One rank: every setting in every round, alternating the order; rank 0 prints the ratios."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    train, args, ddp, batches = start_rank(dim, layers, steps, framework)
    settings = {n: s for n, s in SETTINGS.items() if framework == "fsdp2" or n != "noreshard"}
    shard = train.shard_fsdp2 if framework == "fsdp2" else train.shard_fsdp1
    per_round: dict[str, list[float]] = {name: [] for name in settings}
    per_round_mean: dict[str, list[float]] = {name: [] for name in settings}
    step_ms: dict[str, list[float]] = {name: [] for name in settings}
    mean_ms: dict[str, list[float]] = {name: [] for name in settings}
    names = list(settings)
    for r in range(rounds):
        order = names if r % 2 == 0 else names[::-1]
        timed: dict[str, float] = {}
        typical: dict[str, float] = {}
        for name in order:
            args.wrap, args.reshard_after_forward = settings[name]
            model = shard(train.build_model(args), args, ddp)

            def step(i: int, model: Any = model) -> None:
                logits = model(batches[i][:, :-1])
                F.cross_entropy(logits.reshape(-1, train.VOCAB_SIZE), batches[i][:, 1:].reshape(-1)).backward()

            each: list[float] = []
            timed[name] = time_steps(torch.optim.AdamW(model.parameters(), lr=train.LEARNING_RATE), steps, step,
                                     each)
            ranks: list[Any] = [None] * dist.get_world_size()
            dist.all_gather_object(ranks, statistics.median(each))
            typical[name] = statistics.median(ranks)
            del model, step
            gc.collect()  # the next setting starts clean
        for name in names:
            per_round[name].append(typical[name] / typical["block"])
            per_round_mean[name].append(timed[name] / timed["block"])
            step_ms[name].append(typical[name])
            mean_ms[name].append(timed[name])
    if ddp.rank == 0:
        print(json.dumps({"statistic": MEDIAN_STEP, "ratios": {n: statistics.median(v) for n, v in per_round.items()},
                          "per_round": per_round, "step_ms": step_ms,
                          "ratios_mean": {n: statistics.median(v) for n, v in per_round_mean.items()},
                          "per_round_mean": per_round_mean, "mean_ms": mean_ms, "dim": dim, "layers": layers}))
    dist.destroy_process_group()
    time.sleep(0.1)  # gloo's threads release the last collective (examples/train.py)


def measure(dim: int, layers: int, rounds: int = 5, steps: int = 8, framework: str = "fsdp2") -> dict[str, Any]:
    """Run the measurement on 2 gloo ranks; its JSON (``ratios``: setting -> median ratio to block)."""
    return launch(__file__, ["--dim", str(dim), "--layers", str(layers), "--rounds", str(rounds),
                             "--steps", str(steps), "--framework", framework])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dim", type=int, default=32)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--framework", choices=["fsdp2", "fsdp1"], default="fsdp2")
    args = parser.parse_args()
    if min(args.dim, args.layers, args.rounds, args.steps) < 1:
        parser.error("--dim, --layers, --rounds and --steps must be at least 1")
    if os.environ.get("FSDPVIZ_INPROC_RANK"):
        rank_main(args.dim, args.layers, args.rounds, args.steps, args.framework)
    else:
        print(json.dumps(measure(args.dim, args.layers, args.rounds, args.steps, args.framework), indent=1))


if __name__ == "__main__":
    main()
