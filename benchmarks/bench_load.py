"""Parse + whole-step analysis, whole process: fsdpviz against the JSON decode floor and HTA 0.5.0.

For each input (a folder of one run's trace files), every variant runs as a fresh process
(``jobs.py``), interleaved, ``--repeat`` times; the table gives the median wall time and CPU time
(process + workers) with their ranges, and the peak memory (see ``harness.py``):

- ``floor``: read + gunzip + ``orjson.loads`` of every file, one after the other (only decoding
  the JSON into Python objects; target: fsdpviz cold <= 1.0x of it, and less memory);
- ``cold``: ``load_traces(cache=False)`` + ``compute_overlap`` (JSON -> typed tables -> overlap);
- ``warm``: the same with the Parquet cache written by an earlier run;
- ``summary``: the command itself, ``fsdpviz summary --json --no-cache FOLDER`` (everything a user
  waits for: start-up, parse, the whole analysis, the JSON);
- ``HTA``: HTA 0.5.0 ``TraceAnalysis(trace_dir=...)`` + ``get_comm_comp_overlap`` (target:
  fsdpviz cold >= 10x faster). HTA runs from its own venv (it needs pandas < 3): ``--hta-venv``
  (default ``benchmarks/.hta-venv``) is created with pip when missing; when that fails the HTA
  column is skipped with a message.

Inputs: the real GPU traces beside the checkout (``../shared/traces/gpu-real``, one run per
folder) and a synthetic FSDP2 run (``--synthetic RANKSxEVENTS``, default 8 ranks x 1M events,
written by ``tests/synth``). The overlap % of fsdpviz and HTA is printed side by side as a check
that both measured the same thing.

    python benchmarks/bench_load.py [FOLDER ...] [--repeat 3] [--synthetic 8x1000000 | --no-synthetic]
                                    [--hta-venv DIR | --no-hta] [--jobs N] [--baseline OLD_CHECKOUT]

Results: docs/performance.md.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from harness import (
    Measurement,
    describe_machine,
    load_average,
    median,
    python_of,
    run_measured,
    spread,
    versions,
)

ROOT = Path(__file__).resolve().parents[1]
JOBS = Path(__file__).resolve().parent / "jobs.py"
GPU_REAL = ROOT.parent / "shared" / "traces" / "gpu-real"
DEFAULT_HTA_VENV = Path(__file__).resolve().parent / ".hta-venv"
HTA_REQUIREMENTS = ["holistictraceanalysis==0.5.0", "pandas<3"]


def ensure_hta(venv: Path) -> Path | None:
    """The Python of a venv with HTA 0.5.0, created when missing; None (with a message) if impossible."""
    python = python_of(venv)
    check = [str(python), "-c", "import hta"]
    if python.exists() and subprocess.run(check, capture_output=True, check=False).returncode == 0:
        return python
    print(f"# creating {venv} with {' '.join(HTA_REQUIREMENTS)} (once)", file=sys.stderr, flush=True)
    try:
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, capture_output=True)
        subprocess.run([str(python), "-m", "pip", "install", "--quiet", *HTA_REQUIREMENTS], check=True,
                       capture_output=True, timeout=1800)
        subprocess.run(check, check=True, capture_output=True)
    except (subprocess.SubprocessError, OSError) as exc:
        print(f"# HTA column skipped: could not set up HTA 0.5.0 in {venv} ({exc})", file=sys.stderr)
        return None
    return python


def real_inputs() -> list[Path]:
    """One folder per run of the real GPU traces (trace_filter holds two ranks of one run)."""
    return sorted({p.parent for p in GPU_REAL.rglob("*.json.gz")})


def synthetic_input(spec: str, out: Path) -> Path:
    """Write a synthetic FSDP2 run with ``tests/synth`` in a child process (this process stays small:
    a child's peak RSS as reported by the kernel starts from its parent's at fork)."""
    ranks, events = (int(x) for x in spec.lower().split("x"))
    code = (f"import sys; sys.path.insert(0, {str(ROOT / 'tests')!r}); from synth import generate_large_run; "
            f"run = generate_large_run({str(out)!r}, world_size={ranks}, n_units=80, events_per_rank={events}); "
            "print(run.n_events)")
    started = time.perf_counter()
    n_events = int(subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout)
    print(f"# synthetic run: {ranks} ranks x {n_events:,} events written in "
          f"{time.perf_counter() - started:.0f} s to {out}", file=sys.stderr, flush=True)
    return out


def _check(m: Measurement, what: str) -> dict:
    if m.returncode != 0:
        raise SystemExit(f"{what} failed (exit {m.returncode}):\n{m.stderr[-3000:]}")
    if m.stdout.lstrip().startswith("{\n"):  # `fsdpviz summary --json`: one indented document
        return json.loads(m.stdout)
    return json.loads(m.stdout.strip().splitlines()[-1])


def measure(folder: Path, repeat: int, hta_python: Path | None, jobs: int | None,
            baseline: Path | None = None) -> dict:
    """Interleaved fresh-process runs of every variant on one run folder."""
    files = sorted(str(p) for p in folder.iterdir() if p.name.endswith((".json", ".json.gz")))
    me = [sys.executable, str(JOBS)]
    job_args = [] if jobs is None else ["--jobs", str(jobs)]
    cold_env = dict(os.environ, FSDPVIZ_NO_CACHE="1")
    variants = {
        "floor": (me + ["floor", *files], None),
        "cold": (me + ["fsdpviz", *job_args, str(folder)], cold_env),
        "warm": (me + ["fsdpviz", "--cache", *job_args, str(folder)], None),
        "summary": ([sys.executable, "-m", "fsdpviz", "summary", "--json", "--no-cache", str(folder)], None),
    }
    if hta_python is not None:
        variants["hta"] = ([str(hta_python), str(JOBS), "hta", str(folder)], None)
    if baseline is not None:  # another fsdpviz checkout, for before/after numbers under the same load
        variants["before"] = (variants["cold"][0], dict(cold_env, PYTHONPATH=str(baseline)))
        variants["summary before"] = (variants["summary"][0], dict(os.environ, PYTHONPATH=str(baseline)))
    _check(run_measured(variants["warm"][0]), "cache warm-up")  # writes .fsdpviz-cache/
    runs: dict[str, list[Measurement]] = {name: [] for name in variants}
    info: dict[str, dict] = {}
    loads = [load_average()]
    for _ in range(repeat):
        for name, (argv, env) in variants.items():
            m = run_measured(argv, env=env)
            info[name] = _check(m, f"{name} on {folder}")
            runs[name].append(m)
        loads.append(load_average())
    return {"files": files, "runs": runs, "info": info, "loads": loads}


def _row(name: str, r: dict) -> str:
    runs, info = r["runs"], r["info"]
    wall = {k: [m.wall_s for m in v] for k, v in runs.items()}
    cpu = {k: [m.cpu_s for m in v] for k, v in runs.items()}
    has_hta = "hta" in wall
    mem = {k: (median([m.max_rss_mb for m in v]), median([m.tree_rss_mb for m in v])) for k, v in runs.items()}
    ours = info["cold"]["overlap"]
    theirs = info.get("hta", {}).get("overlap", {})
    agree = " ".join(f"r{k}: {v:.2f}" + (f" / {theirs[k]:.2f}" if k in theirs else "") for k, v in ours.items())

    def both(key: str) -> str:
        return f"{spread(wall[key])} / {spread(cpu[key])}" if key in wall else "skipped"

    def ratio(a: str, b: str) -> str:
        if a not in wall or b not in wall:
            return "-"
        return f"{median(wall[a]) / median(wall[b]):.2f}x / {median(cpu[a]) / median(cpu[b]):.2f}x"

    cold, summary = both("cold"), both("summary")
    if "before" in wall:
        cold += f" (before: {both('before')}; RSS {mem['before'][0]:.0f} MB)"
        summary += f" (before: {both('summary before')}; RSS {mem['summary before'][0]:.0f} MB)"
    cells = [
        name, str(len(r["files"])), f"{info['cold']['events']:,}",
        both("floor"), cold, both("warm"), summary, both("hta"),
        ratio("cold", "floor"), ratio("hta", "cold"), ratio("summary", "floor"), ratio("hta", "summary"),
        f"{mem['floor'][0]:.0f}", f"{mem['cold'][0]:.0f} / {mem['cold'][1]:.0f}",
        f"{mem['summary'][0]:.0f} / {mem['summary'][1]:.0f}",
        f"{mem['hta'][0]:.0f} / {mem['hta'][1]:.0f}" if has_hta else "-",
        agree, r["loads"][0] + " .. " + r["loads"][-1],
    ]
    return "| " + " | ".join(cells) + " |"


HEADER = ("| input | files | events tabled | floor s (wall / CPU) | fsdpviz cold s (wall / CPU) "
          "| fsdpviz warm s (wall / CPU) | `summary --json` cold s (wall / CPU) | HTA s (wall / CPU) "
          "| cold / floor (wall / CPU) | HTA / cold (wall / CPU) | summary / floor (wall / CPU) "
          "| HTA / summary (wall / CPU) | floor RSS MB | cold RSS MB (largest / tree) "
          "| summary RSS MB (largest / tree) | HTA RSS MB (largest / tree) "
          "| overlap % fsdpviz / HTA | load avg before .. after |\n"
          "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folders", nargs="*", type=Path, help="run folders (default: the real GPU traces)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--synthetic", default="8x1000000", help="RANKSxEVENTS per rank (default 8x1000000)")
    parser.add_argument("--no-synthetic", action="store_true")
    parser.add_argument("--no-real", action="store_true", help="skip the real GPU traces")
    parser.add_argument("--hta-venv", type=Path, default=Path(os.environ.get("FSDPVIZ_HTA_VENV", DEFAULT_HTA_VENV)))
    parser.add_argument("--no-hta", action="store_true")
    parser.add_argument("--jobs", type=int, help="fsdpviz parser processes (default: one per CPU)")
    parser.add_argument("--baseline", type=Path, help="an older fsdpviz checkout: also time its cold load "
                        "and its summary (e.g. from `git worktree add /tmp/old COMMIT`; run from outside "
                        "the checkouts, or `python -m fsdpviz` finds the one in the current folder)")
    args = parser.parse_args()

    hta_python = None if args.no_hta else ensure_hta(args.hta_venv)
    print(f"# machine: {describe_machine()}")
    print(f"# {versions('msgspec', 'orjson', 'isal', 'numpy', 'pandas', 'pyarrow')}; "
          f"median (min-max) of {args.repeat} fresh processes per variant, interleaved")
    print(HEADER, flush=True)
    with tempfile.TemporaryDirectory(prefix="fsdpviz-bench-") as tmp:
        inputs: list[tuple[str, Path]] = []
        if not args.no_real:
            for folder in args.folders or real_inputs():
                copy = Path(tmp) / folder.name  # writable, so that the cache can be written beside it
                shutil.copytree(folder, copy, ignore=shutil.ignore_patterns(".fsdpviz-cache"))
                inputs.append((folder.name, copy))
            if not inputs:
                print(f"# no real traces found in {GPU_REAL}", file=sys.stderr)
        if not args.no_synthetic:
            inputs.append((f"synthetic {args.synthetic}", synthetic_input(args.synthetic, Path(tmp) / "synthetic")))
        for name, folder in inputs:
            print(_row(name, measure(folder, args.repeat, hta_python, args.jobs, args.baseline)), flush=True)
    print(f"# load average at the end: {load_average()}")


if __name__ == "__main__":
    main()
