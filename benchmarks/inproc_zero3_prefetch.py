"""ZeRO-3's prefetch bucket on CPU: whatif's predictions from a recording against bare step times
measured inside one process per rank.

``fsdpviz whatif RUN --prefetch none|1|2 --json`` names the ``stage3_prefetch_bucket_size`` each depth
writes and predicts its step. Here 2 gloo ranks build the recording's model (``examples/train.py``, the
options its run.json gives) once per bucket and round -- the recorded bucket, then the buckets the
depths write -- in an order that alternates from round to round, and time their steady steps (no
profiler, no recorder). Each round's step times are divided by that round's recorded-bucket step; the
medians over rounds are the bare ratios the predicted ones (predicted step / recorded step) are read
against.

    python benchmarks/inproc_zero3_prefetch.py [RUN] [--rounds 7] [--steps 10]

RUN defaults to the bundled ``sample_traces/zero3-cpu-2rank``. Prints one JSON object: per depth, the
bucket, the predicted and bare ratios and each round's bare ratio.
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
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from inproc_cpu_truth import WARM_STEPS, launch

DEPTHS = ("none", "1", "2")


def predictions(run: Path) -> dict[str, dict[str, Any]]:
    """depth -> the bucket whatif writes for it and its predicted step ratio (predicted / recorded)."""
    out: dict[str, dict[str, Any]] = {}
    for depth in DEPTHS:
        proc = subprocess.run([sys.executable, "-m", "fsdpviz", "whatif", str(run), "--prefetch", depth, "--json",
                               "-q", "--no-cache"], check=True, capture_output=True, text=True)
        data = json.loads(proc.stdout)
        out[depth] = {"bucket": data["predicted"]["settings"]["prefetch"]["arguments"]["stage3_prefetch_bucket_size"],
                      "predicted": data["predicted"]["step_time_ms"] / data["baseline"]["step_time_ms"]}
    return out


def trainer_options(run: Path) -> list[str]:
    """The example trainer's model and wrap options from the recording's command (run.json)."""
    command = json.loads((run / "run.json").read_text())["command"]
    keep = {"--framework", "--wrap", "--layers", "--dim", "--seed", "--batch"}
    options = []
    for i, word in enumerate(command):
        if word in keep and i + 1 < len(command):
            options += [word, command[i + 1]]
    if "--framework" not in options or options[options.index("--framework") + 1] != "zero3":
        raise SystemExit(f"{run}: not a ZeRO-3 run of examples/train.py (its command: {' '.join(command)})")
    return options


def rank_main(options: list[str], buckets: dict[str, int], rounds: int, steps: int) -> None:
    """One rank: every bucket in every round, alternating the order; rank 0 prints the step times."""
    import torch.distributed as dist
    import torch.nn.functional as F

    sys.path.insert(0, str(ROOT / "examples"))
    import deepspeed
    import torch
    import train
    from deepspeed.utils import set_z3_leaf_modules

    warnings.simplefilter("ignore")
    args = train.parse_args([*options, "--steps", str(WARM_STEPS + steps)])
    ddp = train.init_distributed("cpu")
    batches = train.make_batches(args, ddp)
    leaf = {"block": [train.Block], "pair": [train.BlockPair], "root": [train.GPT], "submodule": []}[args.wrap]
    step_ms: dict[str, list[float]] = {name: [] for name in buckets}
    names = list(buckets)
    for r in range(rounds):
        for name in (names if r % 2 == 0 else names[::-1]):
            model = train.build_model(args)
            if leaf:
                set_z3_leaf_modules(model, leaf)
            config = train.deepspeed_config(model, args)
            config["zero_optimization"]["stage3_prefetch_bucket_size"] = buckets[name]
            optimizer = torch.optim.AdamW(model.parameters(), lr=train.LEARNING_RATE)
            engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
            start = time.perf_counter()
            for i in range(WARM_STEPS + steps):
                if i == WARM_STEPS:
                    dist.barrier()
                    start = time.perf_counter()
                logits = engine(batches[i][:, :-1])
                loss = F.cross_entropy(logits.reshape(-1, train.VOCAB_SIZE), batches[i][:, 1:].reshape(-1))
                engine.backward(loss)
                engine.step()
            dist.barrier()
            step_ms[name].append((time.perf_counter() - start) * 1e3 / steps)
            engine.destroy()
            del engine, model, optimizer
            gc.collect()  # the next bucket starts clean
    if ddp.rank == 0:
        print(json.dumps({"step_ms": step_ms}))
    dist.destroy_process_group()
    time.sleep(0.1)  # gloo's threads release the last collective (examples/train.py)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", nargs="?", type=Path, default=ROOT / "sample_traces" / "zero3-cpu-2rank")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--rank-options", help=argparse.SUPPRESS)
    parser.add_argument("--buckets", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if os.environ.get("FSDPVIZ_INPROC_RANK"):
        rank_main(json.loads(args.rank_options), json.loads(args.buckets), args.rounds, args.steps)
        return
    if min(args.rounds, args.steps) < 1:
        parser.error("--rounds and --steps must be at least 1")
    options = trainer_options(args.run)
    predicted = predictions(args.run)
    recorded = json.loads((args.run / "run.json").read_text())["units"]
    recorded_bucket = next(u["forward_prefetch"] for u in recorded if isinstance(u.get("forward_prefetch"), int))
    buckets = {"recorded": recorded_bucket, **{d: p["bucket"] for d, p in predicted.items()}}
    os.environ["DS_ACCELERATOR"] = "cpu"
    measured = launch(__file__, ["--rank-options", json.dumps(options), "--buckets", json.dumps(buckets),
                                 "--rounds", str(args.rounds), "--steps", str(args.steps)],
                      what="ZeRO-3 in-process truth")["step_ms"]
    rounds = [{d: measured[d][r] / measured["recorded"][r] for d in DEPTHS} for r in range(args.rounds)]
    print(json.dumps({
        "run": str(args.run), "trainer": options, "recorded_bucket": recorded_bucket,
        "recorded_step_ms": statistics.median(measured["recorded"]),
        "depths": {d: {"bucket": predicted[d]["bucket"], "predicted": round(predicted[d]["predicted"], 3),
                       "bare": round(statistics.median(r[d] for r in rounds), 3),
                       "bare_rounds": [round(r[d], 3) for r in rounds]} for d in DEPTHS}}, indent=1))


if __name__ == "__main__":
    main()
