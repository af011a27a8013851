"""Time to first answer on small inputs, and the report of mid-sized runs, as a user meets them.

Fresh processes, interleaved, ``--repeat`` times; median (min-max) of wall and CPU time:

- ``fsdpviz --help``;
- ``fsdpviz summary --json --no-cache`` on one rank of the bundled FSDP2 example (a ~1 MB trace)
  and on its two ranks;
- ``fsdpviz report --no-cache`` of synthetic FSDP2 GPU runs of 32 ranks x 40 units and 64 ranks x
  80 units (``tests/synth``, every rank on one shared timeline, ``--events`` events per rank, three
  profiled steps), generated once before they are timed.

Then the imports ``fsdpviz summary --json`` of one rank pays for (``python -X importtime``,
cumulative, the largest top-level packages), and where a summary's time goes, stage by stage, in a
fresh process (best of ``--repeat``): for one rank of the example and each ``--stages PATH``.

    python benchmarks/bench_startup.py [--repeat 5] [--events 20000] [--no-report] [--both]

Results: docs/performance.md.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from harness import describe_machine, load_average, median, run_measured, spread

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "sample_traces" / "fsdp2-cpu-2rank"
FSDPVIZ = [sys.executable, "-m", "fsdpviz"]


def _generate(out: Path, ranks: int, units: int, events: int) -> int:
    """Write a synthetic run in a child process: this one stays small, since a child's peak RSS as the
    kernel reports it starts from its parent's at fork."""
    code = (f"import sys; sys.path.insert(0, {str(ROOT / 'tests')!r}); from synth import generate_large_run; "
            f"print(generate_large_run({str(out)!r}, world_size={ranks}, n_units={units}, "
            f"events_per_rank={events}).n_events)")
    return int(subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout)


def _imports(argv: list[str]) -> list[tuple[str, float]]:
    """Packages by cumulative import time (ms) of ``argv`` run with ``-X importtime``: each package
    counted where it was first imported (``pandas`` inside ``fsdpviz.trace.loader`` is pandas')."""
    proc = subprocess.run([sys.executable, "-X", "importtime", *argv], check=False, capture_output=True, text=True)
    out: dict[str, float] = {}
    for line in proc.stderr.splitlines():
        m = re.match(r"import time:\s+\d+ \|\s+(\d+) \|( *)(\S+)", line)
        if m and "." not in m.group(3) and m.group(3) not in out:  # a package's own top module
            out[m.group(3)] = int(m.group(1)) / 1000
    out.pop("fsdpviz", None)
    return sorted(out.items(), key=lambda kv: -kv[1])


STAGES = r"""
import json, sys, time
T = time.perf_counter
t0 = T()
import fsdpviz.cli, typer._adapters  # what the command has imported when it starts (typer's parameters)
from fsdpviz.analysis.pipeline import analyse
import fsdpviz.trace.loader as loader
stages = {"imports before the parse": T() - t0}
def timed(module, name, label):
    inner = getattr(module, name)
    def wrapper(*a, **k):
        t = T(); out = inner(*a, **k); stages[label] = stages.get(label, 0.0) + T() - t; return out
    setattr(module, name, wrapper)
timed(loader, "parse_all", "parse (pandas imported meanwhile)")
t = T(); result = analyse([sys.argv[1]], cache=False, progress=False)
stages["tables, steps, whole-step overlap"] = T() - t - stages["parse (pandas imported meanwhile)"]
from fsdpviz.analysis import run as run_module  # after the parse, as the command imports it
timed(run_module, "analyse_ranks", "per-unit analysis: per-rank half")
timed(run_module, "combine_parts", "per-unit analysis: cross-rank half")
t = T(); summary = result.summary
stages["summary (with the per-unit analysis)"] = T() - t
t = T(); text = json.dumps(summary.to_json(), indent=2); stages["JSON"] = T() - t
print(json.dumps({"stages": stages, "end": time.time()}), flush=True)
"""


def _stages(path: Path, repeat: int) -> dict[str, float]:
    """Seconds per stage of a summary of ``path`` (fresh processes, best of ``repeat``), and the
    interpreter's teardown after the answer (what ``fsdpviz.cli.run`` skips)."""
    best: dict[str, float] = {}
    for _ in range(repeat):
        proc = subprocess.run([sys.executable, "-c", STAGES, str(path)], check=True, capture_output=True, text=True)
        ended = time.time()
        found = json.loads(proc.stdout.strip().splitlines()[-1])
        found["stages"]["interpreter teardown"] = ended - found["end"]
        for name, seconds in found["stages"].items():
            best[name] = min(best.get(name, float("inf")), seconds)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--events", type=int, default=20_000)
    parser.add_argument("--no-report", action="store_true")
    parser.add_argument("--stages", type=Path, action="append", default=[],
                        help="also time the stages of a summary of this trace or run (repeatable)")
    parser.add_argument("--both", action="store_true",
                        help="each report twice: loaded whole into one process and analysed rank by rank "
                             "(FSDPVIZ_KEEP_EVENTS=1 / 0) instead of as fsdpviz decides")
    args = parser.parse_args()
    one_rank = min((EXAMPLE / "traces").glob("rank0.*"))
    with tempfile.TemporaryDirectory(prefix="fsdpviz-startup-") as tmp:
        envs: dict[str, dict[str, str] | None] = {}
        jobs: dict[str, list[str]] = {
            "fsdpviz --help": [*FSDPVIZ, "--help"],
            f"summary --json, 1 rank ({one_rank.stat().st_size / 1e6:.1f} MB gzip, "
            f"{len(gzip.decompress(one_rank.read_bytes())) / 1e6:.1f} MB JSON)":
                [*FSDPVIZ, "summary", "--json", "--no-cache", str(one_rank)],
            "summary --json, the example's 2 ranks": [*FSDPVIZ, "summary", "--json", "--no-cache", str(EXAMPLE)],
        }
        if not args.no_report:
            for ranks, units in ((32, 40), (64, 80)):
                run = Path(tmp) / f"run-{ranks}x{units}"
                n = _generate(run, ranks, units, args.events)
                name = f"report, {ranks} ranks x {units} units ({n:,} events per rank)"
                argv = [*FSDPVIZ, "report", "--no-cache", "-o", str(Path(tmp) / f"{ranks}.html"), str(run)]
                if not args.both:
                    jobs[name] = argv
                    continue
                for how, keep in (("loaded whole", "1"), ("rank by rank", "0")):
                    jobs[f"{name}, {how}"] = argv
                    envs[f"{name}, {how}"] = dict(os.environ, FSDPVIZ_KEEP_EVENTS=keep)
        results: dict[str, list] = {name: [] for name in jobs}
        loads = load_average()
        for _ in range(args.repeat):
            for name, argv in jobs.items():
                m = run_measured(argv, env=envs.get(name))
                if m.returncode != 0:
                    raise SystemExit(f"{name} failed:\n{m.stderr[-2000:]}")
                results[name].append(m)
    print(f"# machine: {describe_machine()}")
    print(f"# fresh processes, median (min-max) of {args.repeat}, load average {loads} .. {load_average()}")
    print("| command | wall s | CPU s | largest process RSS MB |")
    print("|---|---:|---:|---:|")
    for name, runs in results.items():
        print(f"| {name} | {spread([m.wall_s for m in runs])} | {spread([m.cpu_s for m in runs])} "
              f"| {median([m.max_rss_mb for m in runs]):.0f} |")
    print("\n# imports of `fsdpviz summary --json` of one rank (cumulative ms per package, where first imported)")
    imports = _imports(["-m", "fsdpviz", "summary", "--json", "--no-cache", str(one_rank)])
    for name, ms in imports[:10]:
        print(f"- {name}: {ms:.0f} ms")
    for path in [one_rank, *args.stages]:
        print(f"\n# stages of a summary of {path} (ms, best of {args.repeat}; the per-unit analysis is part of "
              "the summary's line)")
        for name, seconds in _stages(path, args.repeat).items():
            print(f"- {name}: {1000 * seconds:.0f}")


if __name__ == "__main__":
    main()
