"""An uncached summary with fsdpviz's tables holding Python strings against Arrow's: docs/performance.md,
"String storage".

pandas stores string columns in Arrow where pyarrow is installed; in a process fsdpviz owns (the
command line), fsdpviz sets Python objects instead (``fsdpviz.trace.schema.STRING_STORAGE``, where the
loader builds the tables). For each input, one
process per storage and round, interleaved: ``analyse`` (the parse cache off) and ``completed_summary``,
timed after one warm-up in the same process, median of ``--repeat`` in it; the ``summary --json`` text
of both storages must be the same to the byte (else the run stops).

    python benchmarks/bench_string_storage.py [PATH ...] [--rounds 3] [--repeat 3]

Without PATH: the bundled samples, and the shared H200 recording of model B where ../shared is beside
the checkout.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED_B = ROOT.parent / "shared" / "traces" / "gpu-h200" / "B"

# run in a fresh process: the storage to use, the input, how many timed repeats
CHILD = """
import hashlib, json, sys, time
from pathlib import Path
from fsdpviz.trace import schema
schema.STRING_STORAGE = sys.argv[1]
schema.own_this_process()  # as the command line does
from fsdpviz.analysis.pipeline import analyse
from fsdpviz.cache import summary_json_text
from fsdpviz.whatif.gains import completed_summary
path, repeat = Path(sys.argv[2]), int(sys.argv[3])
text = summary_json_text(completed_summary(analyse([path], cache=False, progress=False)))  # warm-up
times = []
for _ in range(repeat):
    started = time.perf_counter()
    completed_summary(analyse([path], cache=False, progress=False))
    times.append(time.perf_counter() - started)
print(json.dumps({"times": times, "digest": hashlib.sha256(text.encode()).hexdigest()}))
"""


def _once(storage: str, path: Path, repeat: int) -> dict:
    env = dict(os.environ, FSDPVIZ_NO_SUMMARY_CACHE="1", PYTHONPATH=str(ROOT))
    done = subprocess.run([sys.executable, "-c", CHILD, storage, str(path), str(repeat)], capture_output=True,
                          text=True, env=env, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{path} ({storage}) failed:\n{done.stderr[-2000:]}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="*", type=Path)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    paths = args.paths or [*sorted((ROOT / "sample_traces").glob("*-cpu-2rank*")),
                           *([SHARED_B] if SHARED_B.is_dir() else [])]
    load = " / ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"# command: python benchmarks/bench_string_storage.py --rounds {args.rounds} --repeat {args.repeat}; "
          f"load average {load}")
    print("\n| input | Arrow strings (s) | Python strings (s) | Python / Arrow | same summary --json |")
    print("|---|---:|---:|---:|---|")
    for path in paths:
        got: dict[str, list[float]] = {"pyarrow": [], "python": []}
        digests: dict[str, set[str]] = {"pyarrow": set(), "python": set()}
        for _ in range(args.rounds):  # interleaved, so that the machine's drift falls on both alike
            for storage, times in got.items():
                one = _once(storage, path, args.repeat)
                times.append(statistics.median(one["times"]))
                digests[storage].add(one["digest"])
        same = len(digests["pyarrow"] | digests["python"]) == 1
        if not same:
            raise SystemExit(f"{path}: the two storages gave different summaries: {digests}")
        arrow, python = statistics.median(got["pyarrow"]), statistics.median(got["python"])
        print(f"| {path.name} | {arrow:.3f} ({min(got['pyarrow']):.3f}-{max(got['pyarrow']):.3f}) | "
              f"{python:.3f} ({min(got['python']):.3f}-{max(got['python']):.3f}) | {python / arrow:.2f} | "
              f"yes ({hashlib.sha256(''.join(sorted(digests['python'])).encode()).hexdigest()[:8]}) |")


if __name__ == "__main__":
    main()
