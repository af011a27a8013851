"""FSDP's per-unit work in a predicted CPU step's split, against several recordings of each setting.

``whatif --wrap root`` and ``--wrap merge:2`` from a per-block recording split their predicted step into
the model's compute, the exposed communication, FSDP's per-unit work (its hooks, each gather's issue and
copy-out, a reduction's host work) and other idle (explore.predicted_bound). The truth for the split is a
recording of the setting, and one recording of it moves with its process: FSDP's work and other idle are
both host time, which a loaded core stretches unevenly. So each round here records the three wraps of the
example trainer (one process as rank 0 of 8 under torch's fake group, FSDP2 and FSDP1) back to back,
predicts the coarser two from that round's per-block recording, and the rounds give the spread.

Two measures per prediction, each the predicted figure over the recorded setting's:
- *idle share*: FSDP's work as a share of FSDP's work and other idle (what
  tests/integration/test_whatif_fake_group.py held one recording to before it read the rounds' spread);
- *per compute*: FSDP's work per millisecond of the model's compute, which the pace of the process moves
  less (both are the same thread's work);
- *reduction labels* (a truth, not a prediction): the host time in FSDP's reduction labels per
  millisecond of compute in the recording of the setting, over the per-block recording's. Near 1: a merged
  unit's reduction costs what its members' did together (it copies all their gradients); near a fifth
  (one root unit) or a half (pairs): it costs one member's.

    python benchmarks/bench_fsdp_work_split.py [--rounds 6] [--parallel 1] [--out DIR]

``--parallel K`` runs K rounds at once (K recordings on the machine's cores, as ``make test-recordings``
does). Prints one row per round and prediction, and the median, least and most per measure; results are
recorded in docs/whatif.md.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import describe_machine

# the model of tests/integration/test_whatif_fake_group.py and its recording options
MODEL = ["--bf16", "--fake-world", "8", "--layers", "4", "--dim", "128", "--steps", "6"]
RECORD = ["--warmup", "2", "--steps", "2"]
WRAPS = ("block", "pair", "root")
FRAMEWORKS = ("fsdp2", "fsdp1")


def record(out: Path, framework: str, wrap: str) -> None:
    """``fsdpviz record`` of the example trainer in one process under the fake group."""
    cmd = [sys.executable, "-m", "fsdpviz", "record", "--out", str(out), "--no-report", "--no-summary", *RECORD,
           "--", sys.executable, str(ROOT / "examples" / "train.py"), *MODEL, "--framework", framework,
           "--wrap", wrap]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop("FSDPVIZ_RUN_DIR", None)
    proc = subprocess.run(cmd, check=False, capture_output=True, text=True, env=env, timeout=900)
    if proc.returncode != 0:
        raise SystemExit(f"recording {out} failed:\n{proc.stderr[-2000:]}")


def record_round(base: Path) -> Path:
    """One round: every framework's three wraps, back to back (kept where already recorded)."""
    for framework in FRAMEWORKS:
        for wrap in WRAPS:
            folder = base / f"{framework}-{wrap}"
            if not (folder / "run.json").is_file():
                record(folder, framework, wrap)
    return base


def reduction_work(model: object) -> float:
    """The host time in FSDP's reduction labels (each backward pass's ``reduce_host_ns``) per ms of the
    model's compute in its passes, over the recording's steps."""
    from fsdpviz.replay.model import Model

    assert isinstance(model, Model)
    labelled = compute = 0.0
    for step in model.recording.steps:
        for mb in step.micro:
            labelled += sum(p.reduce_host_ns for p in mb.backward)
            compute += sum(p.compute_ns for p in (*mb.forward, *mb.backward))
    return labelled / compute if compute else float("nan")


def measures(base: Path) -> list[tuple[str, str, float, float, float]]:
    """(framework, predicted wrap, idle share ratio, per compute ratio, the recorded setting's reduction
    labels per compute over the per-block recording's) of one round's predictions."""
    from fsdpviz.analysis.pipeline import analyse
    from fsdpviz.replay.model import read_model
    from fsdpviz.replay.settings import Settings, Wrap
    from fsdpviz.whatif.explore import split_of
    from fsdpviz.whatif.predict import predict

    out = []
    for framework in FRAMEWORKS:
        source = read_model(analyse([base / f"{framework}-block"], cache=False, progress=False))
        for wrap, recorded in ((Wrap("root"), "root"), (Wrap("merge", k=2), "pair")):
            split = split_of(source, predict(source, Settings().with_(wrap=wrap)))
            setting = read_model(analyse([base / f"{framework}-{recorded}"], cache=False, progress=False))
            truth = setting.result.summary.bound
            if split is None or truth is None:
                raise SystemExit(f"{base}: no split for {framework} {recorded}")
            fsdp, idle, compute = split["fsdp_overhead_ms"], split["other_idle_ms"], split["compute_ms"]
            share = (fsdp / (fsdp + idle)) / (truth.fsdp_overhead_ms / (truth.fsdp_overhead_ms + truth.other_idle_ms))
            per_compute = (fsdp / compute) / (truth.fsdp_overhead_ms / truth.compute_ms)
            out.append((framework, recorded, share, per_compute, reduction_work(setting) / reduction_work(source)))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--parallel", type=int, default=1, help="rounds recorded at once")
    parser.add_argument("--out", type=Path, default=None, help="keep the recordings here (default: a temp folder)")
    args = parser.parse_args()
    started = time.perf_counter()
    print(describe_machine())
    with tempfile.TemporaryDirectory() as tmp:
        base = args.out or Path(tmp)
        folders = [base / f"round{i + 1}" for i in range(args.rounds)]
        with ThreadPoolExecutor(max(1, args.parallel)) as pool:
            for done in pool.map(record_round, folders):
                print(f"recorded {done.name}", file=sys.stderr, flush=True)
        rows: dict[tuple[str, str], list[tuple[float, float, float]]] = {(f, w): [] for f in FRAMEWORKS
                                                                         for w in ("root", "pair")}
        print(f"\n{args.rounds} rounds, {args.parallel} at once: predicted / recorded; the recorded setting's "
              "reduction labels per compute / the per-block recording's\n")
        print("| round | framework | predicted | idle share | per compute | reduction labels |")
        print("|---|---|---|---:|---:|---:|")
        for folder in folders:
            for framework, wrap, share, per_compute, reduction in measures(folder):
                rows[framework, wrap].append((share, per_compute, reduction))
                print(f"| {folder.name} | {framework} | {wrap} | {share:.2f}x | {per_compute:.2f}x | {reduction:.2f}x |",
                      flush=True)
        print("\n| framework | predicted | idle share: median (least-most) | per compute: median (least-most) "
              "| reduction labels: median (least-most) |")
        print("|---|---|---:|---:|---:|")
        for (framework, wrap), values in rows.items():
            cells = []
            for i in (0, 1, 2):
                xs = [v[i] for v in values]
                cells.append(f"{statistics.median(xs):.2f}x ({min(xs):.2f}-{max(xs):.2f})")
            print(f"| {framework} | {wrap} | {' | '.join(cells)} |")
    print(f"\n({time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    main()
