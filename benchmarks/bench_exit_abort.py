"""How often PyTorch's gloo backend aborts a rank as its interpreter exits.

Runs ``torchrun --standalone --nproc_per_node 2 SCRIPT ARGS`` ``--runs`` times on this machine (one
OpenMP thread per rank), bare or under ``fsdpviz record`` (``--record``), and counts the runs that
ended well, those that failed only by the abort at exit (``terminate called without an active
exception``: a gloo work thread still releasing the last collective when the interpreter
finalizes; see docs/testing.md) and any other failure. Prints one markdown row.

    python benchmarks/bench_exit_abort.py [--runs 20] [--record] -- SCRIPT [ARGS...]

To measure an earlier fsdpviz under ``--record``, put its checkout first on ``PYTHONPATH`` and run
from outside the checkouts. Results are recorded in docs/testing.md.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import describe_machine

ABORT = "terminate called without an active exception"


def one_run(command: list[str], record: bool, folder: Path) -> str:
    """``ok``, ``abort`` or ``other`` for one run of ``command`` (recorded into ``folder``)."""
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", *command]
    argv = ([sys.executable, "-m", "fsdpviz", "record", "--out", str(folder), "--no-report", "--no-summary",
             "--", *torchrun] if record else torchrun)
    env = dict(os.environ, OMP_NUM_THREADS="1", DS_ACCELERATOR="cpu")
    env.pop("FSDPVIZ_RUN_DIR", None)
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=600, check=False)
    if done.returncode == 0:
        return "ok"
    return "abort" if ABORT in done.stderr else "other"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--record", action="store_true", help="run each under `fsdpviz record`")
    parser.add_argument("command", nargs="+", help="the training script and its arguments (after --)")
    args = parser.parse_args()
    started = time.perf_counter()
    counts = {"ok": 0, "abort": 0, "other": 0}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.runs):
            counts[one_run(args.command, args.record, Path(tmp) / f"run-{i}")] += 1
    print(describe_machine())
    print("\n| command | fsdpviz record | runs | ended well | aborted at exit | other failures |")
    print("|---|---|---:|---:|---:|---:|")
    print(f"| `{' '.join(args.command)}` | {'yes' if args.record else 'no'} | {args.runs} | {counts['ok']} "
          f"| {counts['abort']} | {counts['other']} |")
    print(f"\n({time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    main()
