"""whatif on gradient accumulation without sync, against bare runs of each setting in one process per rank.

Records ``tests/integration/record_scripts/nested_moe_train.py`` (FSDP2, six blocks, the last two blocks'
experts units inside them) with ``--micro-batches 2``: two forwards and backwards per optimizer step,
the gradients reduced in the second only (``set_requires_gradient_sync(False)`` before the first), as
training stacks accumulate. From that recording ``fsdpviz whatif`` predicts one root unit, pairs
(``merge:2``) and no resharding after forward, each as a share of the recorded step, and writes each as
code (``--code``). The truth: each of 2 gloo ranks builds the model once per setting and round, sharded
as recorded or by that code, in an order that alternates from round to round, and times its steady
steps bare (no profiler, no recorder); each round's ratios are to that round's recorded setting, and the
median over rounds is the bare ratio (separate processes on a shared 2-core machine drift by 20-30 %).

    python benchmarks/bench_no_sync_truth.py [--rounds 5] [--steps 6] [--out DIR] [--keep-unsharded]

``--keep-unsharded``: the units also keep their parameters from the first micro-batch's backward into the
second's forward (``set_reshard_after_backward(False)`` beside the sync setting, the script's
``--keep-unsharded-between-micro-batches``), recorded and run bare so.

Prints per setting the predicted ratio beside the bare one, and the bare ratios' range over rounds.
Results are recorded in docs/whatif.md ("Gradient accumulation without sync").
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import types
import warnings
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tests" / "integration" / "record_scripts" / "nested_moe_train.py"
FSDPVIZ = [sys.executable, "-m", "fsdpviz"]
MICRO = 2
SETTINGS = {"wrap root": ("--wrap", "root"), "wrap merge:2": ("--wrap", "merge:2"),
            "no reshard after forward": ("--reshard-after-forward", "false")}


def record(out: Path, keep: bool) -> Path:
    """The recording (kept in ``out`` and read again when there); ``keep``: parameters kept unsharded
    between micro-batches."""
    run = out / "run"
    if (run / "run.json").exists():
        return run
    command = [*FSDPVIZ, "record", "--out", str(run), "--no-report", "--no-summary", "--warmup", "2", "--steps", "2",
               "--", sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
               str(SCRIPT), "--micro-batches", str(MICRO), "--steps", "12",
               *(["--keep-unsharded-between-micro-batches"] if keep else [])]
    proc = subprocess.run(command, capture_output=True, text=True, check=False, timeout=1200)
    if proc.returncode != 0:
        raise SystemExit(f"recording failed:\n{proc.stderr[-3000:]}")
    return run


def predictions(run: Path, out: Path) -> dict[str, dict[str, Any]]:
    """Per setting: whatif's predicted ratio to the recorded step, its reliability, and its code's file."""
    found = {}
    for name, flags in SETTINGS.items():
        answer = json.loads(subprocess.run([*FSDPVIZ, "whatif", str(run), *flags, "--json", "--no-cache"],
                                           capture_output=True, text=True, check=True).stdout)
        code = subprocess.run([*FSDPVIZ, "whatif", str(run), *flags, "--code", "--no-cache"],
                              capture_output=True, text=True, check=True).stdout
        path = out / f"shard-{name.replace(' ', '-').replace(':', '')}.py"
        path.write_text(code)
        found[name] = {"ratio": answer["predicted"]["step_time_ms"] / answer["baseline"]["step_time_ms"],
                       "reliable": answer["reliable"], "code": str(path)}
    return found


def rank_main(codes: dict[str, str], rounds: int, steps: int, keep: bool) -> None:
    """One rank: every setting in every round, alternating the order; rank 0 prints the ratios."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from inproc_cpu_truth import WARM_STEPS, time_steps

    warnings.simplefilter("ignore")
    spec = importlib.util.spec_from_file_location("nested_moe_train", SCRIPT)
    assert spec is not None and spec.loader is not None
    train = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(train)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    recorded = types.SimpleNamespace(reshard_after_forward=True, forward_prefetch=0, backward_prefetch=0)
    generator = torch.Generator().manual_seed(1000 + rank)
    batches = [torch.randint(train.VOCAB, (train.BATCH, train.SEQ + 1), generator=generator)
               for _ in range((WARM_STEPS + steps) * MICRO)]
    names = ["recorded", *codes]
    per_round: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        timed: dict[str, float] = {}
        for name in names if r % 2 == 0 else names[::-1]:
            torch.manual_seed(0)
            model = train.Model(6, 32)
            if name == "recorded":
                train.shard(model, recorded)
            else:
                namespace: dict[str, Any] = {}
                exec(compile(Path(codes[name]).read_text(), codes[name], "exec"), namespace)  # noqa: S102
                model = namespace["shard_model"](model)

            def step(i: int, model: Any = model) -> None:
                for micro in range(MICRO):
                    model.set_requires_gradient_sync(micro == MICRO - 1)
                    if keep:
                        model.set_reshard_after_backward(micro == MICRO - 1)
                    tokens = batches[i * MICRO + micro]
                    logits = model(tokens[:, :-1])
                    loss = F.cross_entropy(logits.reshape(-1, train.VOCAB), tokens[:, 1:].reshape(-1))
                    (loss / MICRO).backward()

            timed[name] = time_steps(torch.optim.AdamW(model.parameters(), lr=3e-3), steps, step)
            del model, step
            gc.collect()  # the next setting starts clean
        for name in names:
            per_round[name].append(timed[name] / timed["recorded"])
    if rank == 0:
        print(json.dumps({"per_round": per_round}))
    dist.destroy_process_group()
    time.sleep(0.1)  # gloo's threads release the last collective


def bare(codes: dict[str, str], rounds: int, steps: int, keep: bool) -> dict[str, list[float]]:
    """Each setting's per-round ratio to the recorded one, measured on 2 gloo ranks in one process each
    (started as inproc_cpu_truth.py starts its own)."""
    sys.path.insert(0, str(Path(__file__).parent))
    from inproc_cpu_truth import launch

    result = launch(__file__, ["--codes", json.dumps(codes), "--rounds", str(rounds), "--steps", str(steps),
                               *(["--keep-unsharded"] if keep else [])], what="bare runs")
    return dict(result["per_round"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--out", type=Path, default=None, help="keep the recording here (default: a temp folder)")
    parser.add_argument("--keep-unsharded", action="store_true",
                        help="parameters kept unsharded from one micro-batch's backward into the next forward")
    parser.add_argument("--codes", default=None, help=argparse.SUPPRESS)  # a rank of the bare runs
    args = parser.parse_args()
    if min(args.rounds, args.steps) < 1:
        parser.error("--rounds and --steps must be at least 1")
    if os.environ.get("FSDPVIZ_INPROC_RANK"):
        rank_main(json.loads(args.codes), args.rounds, args.steps, args.keep_unsharded)
        return
    out = args.out or Path(tempfile.mkdtemp(prefix="fsdpviz-no-sync-"))
    out.mkdir(parents=True, exist_ok=True)
    run = record(out, args.keep_unsharded)
    predicted = predictions(run, out)
    per_round = bare({name: p["code"] for name, p in predicted.items()}, args.rounds, args.steps, args.keep_unsharded)
    print(f"recording: {run}")
    print("| setting | predicted ratio | reliable | bare ratio (median over rounds) | bare, range over rounds | "
          "predicted - bare |")
    print("|---|---:|---|---:|---|---:|")
    for name, p in predicted.items():
        rounds = per_round[name]
        truth = statistics.median(rounds)
        print(f"| {name} | {p['ratio']:.3f} | {p['reliable']} | {truth:.3f} | {min(rounds):.3f}-{max(rounds):.3f} | "
              f"{p['ratio'] - truth:+.3f} |")


if __name__ == "__main__":
    main()
