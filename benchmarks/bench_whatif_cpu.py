"""Accuracy of ``fsdpviz whatif`` on real CPU recordings of the example trainer (2 ranks, gloo).

Records ``examples/train.py`` (FSDP2, 4 blocks of dim 256) per block, per pair, as one root unit,
with explicit prefetch of one unit and with ``--no-reshard-after-forward``, ``--repeat`` times each
(interleaved: the machine's load drifts), predicts every other setting from each per-block
recording, and compares the median prediction with the median recorded truth. Memory is compared
as the rise of the allocated level within a step (peak - level at the step's start): on CPU the
level at a step's start also holds what the allocator had before the profiler started, which
differs between processes; the absolute peaks, predicted and recorded, are printed too.

    python benchmarks/bench_whatif_cpu.py [--repeat 3] [--out DIR]

Results are recorded in docs/whatif.md.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import describe_machine

MODEL = ["--framework", "fsdp2", "--layers", "4", "--dim", "256", "--steps", "8"]
RUNS = {
    "block": ["--wrap", "block"],
    "pair": ["--wrap", "pair"],
    "root": ["--wrap", "root"],
    "prefetch1": ["--wrap", "block", "--prefetch", "1"],
    "noreshard": ["--wrap", "block", "--no-reshard-after-forward"],
}
# setting recorded -> the whatif options that predict it from the per-block recording
OPTIONS = {"pair": ["--wrap", "merge:2"], "root": ["--wrap", "root"], "prefetch1": ["--prefetch", "1"],
           "noreshard": ["--reshard-after-forward", "false"]}


@contextmanager
def recordings_folder(out: Path | None) -> Iterator[Path]:
    """``out`` (created if needed, kept), or a temporary folder removed afterwards."""
    with tempfile.TemporaryDirectory() as tmp:
        base = out or Path(tmp)
        base.mkdir(parents=True, exist_ok=True)
        yield base


def record(out: Path, args: list[str], model: list[str] = MODEL, env: dict[str, str] | None = None,
           options: tuple[str, ...] = ()) -> None:
    """``fsdpviz record OPTIONS`` of the example trainer (``model`` then ``args``) on 2 CPU ranks into ``out``."""
    cmd = [sys.executable, "-m", "fsdpviz", "record", "--out", str(out), "--no-report", "--no-summary", *options, "--",
           sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           str(ROOT / "examples" / "train.py"), *model, *args]
    proc = subprocess.run(cmd, check=False, capture_output=True, text=True,
                          env=dict(os.environ, OMP_NUM_THREADS="1", **(env or {})), timeout=900)
    if proc.returncode != 0:
        raise SystemExit(f"recording {out.name} failed:\n{proc.stderr[-2000:]}")


def measured(run: Path) -> tuple[float, float, float]:
    """Mean step (ms), highest peak (bytes) and highest rise within a step (bytes) of a recording."""
    from fsdpviz.analysis.pipeline import analyse
    from fsdpviz.replay.model import read_model

    model = read_model(analyse([run], cache=False, progress=False))
    steps = model.recording.steps
    return (model.result.summary.step_time_ms or 0.0, float(max(s.peak_bytes for s in steps)),
            float(max(s.memory.peak_bytes - s.memory.start_bytes for s in steps if s.memory is not None)))


def predicted(run: Path, options: list[str]) -> tuple[float, float, float, float]:
    """Predicted step (ms), peak, rise; and the replay error (%)."""
    from fsdpviz.analysis.pipeline import analyse
    from fsdpviz.replay.model import read_model
    from fsdpviz.replay.settings import Settings, parse_bool, parse_prefetch, parse_wrap
    from fsdpviz.whatif.predict import predict

    settings = Settings()
    for option, value in zip(options[::2], options[1::2]):
        if option == "--wrap":
            settings = settings.with_(wrap=parse_wrap(value))
        elif option == "--prefetch":
            settings = settings.with_(prefetch=parse_prefetch(value))
        elif option == "--reshard-after-forward":
            settings = settings.with_(reshard_after_forward=parse_bool(value, option))
    model = read_model(analyse([run], cache=False, progress=False))
    p = predict(model, settings)
    rise = max(m.peak_bytes - s.memory.start_bytes for s, m in zip(p.steps, p.memory)
               if m is not None and s.memory is not None)
    return p.predicted.step_time_ms, float(p.predicted.peak_allocated_bytes or 0), float(rise), p.traced_replay_error_pct


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None, help="keep the recordings here (default: a temp folder)")
    args = parser.parse_args()
    started = time.perf_counter()
    with recordings_folder(args.out) as base:
        folders: dict[str, list[Path]] = {name: [] for name in RUNS}
        for i in range(args.repeat):
            for name, extra in RUNS.items():
                folder = base / f"{name}-{i}"
                if not (folder / "run.json").is_file():
                    record(folder, extra)
                folders[name].append(folder)
                print(f"recorded {folder.name}", file=sys.stderr, flush=True)
        truth = {name: [measured(f) for f in fs] for name, fs in folders.items()}
        print(describe_machine())
        block_steps = [t[0] for t in truth["block"]]
        replays = [predicted(f, [])[3] for f in folders["block"]]
        print(f"\nper-block recordings: step {statistics.median(block_steps):.2f} ms "
              f"(range {min(block_steps):.2f}-{max(block_steps):.2f}); replay error "
              f"{', '.join(f'{r:.2f} %' for r in replays)}\n")
        print("| setting | predicted step (ms) | recorded step (ms), median (range) | error | predicted rise (MiB) "
              "| recorded rise (MiB) | error | predicted peak (MiB) | recorded peak (MiB) | error |")
        print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for name, options in OPTIONS.items():
            preds = [predicted(f, options) for f in folders["block"]]
            p_step = statistics.median(p[0] for p in preds)
            p_rise = statistics.median(p[2] for p in preds)
            steps = [t[0] for t in truth[name]]
            t_step = statistics.median(steps)
            t_rise = statistics.median(t[2] for t in truth[name])
            p_peak = statistics.median(p[1] for p in preds)
            t_peak = statistics.median(t[1] for t in truth[name])
            print(f"| {' '.join(options)} | {p_step:.2f} | {t_step:.2f} ({min(steps):.2f}-{max(steps):.2f}) "
                  f"| {100 * (p_step - t_step) / t_step:+.1f} % | {p_rise / 2**20:.2f} | {t_rise / 2**20:.2f} "
                  f"| {100 * (p_rise - t_rise) / t_rise:+.1f} % | {p_peak / 2**20:.2f} | {t_peak / 2**20:.2f} "
                  f"| {100 * (p_peak - t_peak) / t_peak:+.1f} % |")
    print(f"\n({time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    main()
