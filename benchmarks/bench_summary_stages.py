"""Where one ``fsdpviz summary`` spends its time, stage by stage, and the whole command cold and warm.

For each input (the bundled samples, ``sample_traces/*``; a shared H100 recording; a ~35 MB real GPU
trace, the one ``bench_load.py`` calls trace_diff/control), a fresh process runs what ``fsdpviz
summary`` runs -- ``analyse`` (fsdpviz/analysis/pipeline.py), ``completed_summary``
(fsdpviz/whatif/gains.py), the JSON and the terminal tables of fsdpviz/commands/summary.py -- and
times each stage by wrapping the functions those call (the wrappers only read the clock; nothing of
the pipeline is copied here):

- ``start-up + imports``: from the parent's spawn to the end of what the command has imported when
  it starts (``fsdpviz.cli`` with its commands registered, typer's parameter layer);
- ``read + decode``: ``trace.loader.parse_all`` (gunzip + JSON -> columns, pandas imported meanwhile);
- ``tables``: the rest of ``trace.loader.load_run`` (columns -> typed tables, timers, run.json);
- ``structure``: ``pipeline.analyse_traces`` (steps, whole-step overlap, framework);
- ``figures: per-unit analysis`` and ``figures: summary``: ``RunResult.analysis`` and ``.summary``;
- ``replay: model read``: ``whatif.gains.summary_model`` (the recording read for prediction);
- ``price: SETTING``: each ``whatif.predict.predict`` that ``completed_summary`` runs, by setting
  (a setting predicted twice shows ``x2``);
- ``clock``: ``replay.clock.clock_of``, and ``summary: the rest`` of ``completed_summary``;
- ``render: JSON`` / ``render: text``: ``summary --json``'s dump and ``print_summary``'s tables;
- ``summary cache: code digest`` / ``write`` / ``read``: the digest of the package's sources (once
  per process), storing the completed summary in the run folder's cache and reading it back (the key
  of the inputs, then the entry), as the commands do (``fsdpviz/cache.py``), where that exists.

Each stage's share of the in-process total is printed beside it. The traces' own Parquet cache is
off (``cache=False``) so that the split is a cold summary's; the median over ``--repeat`` fresh
processes is given.

Then the whole command, ``fsdpviz summary --json PATH`` as a fresh process, interleaved, ``--repeat``
times: ``cold`` (``--no-cache``: no parse cache, no summary cache) and ``warm`` (after one run
that filled the caches), and, with ``--baseline CHECKOUT``, the same two of another checkout of
fsdpviz (its package first on ``PYTHONPATH``) in the same rounds.

With ``--baseline`` and ``--in-process ROUNDS``, also the analysis alone, beside the baseline: in
each round one fresh process per checkout (alternating which goes first) summarises every input once
to warm its imports, then ``analyse`` + ``completed_summary`` of each input ``--in-process-n`` times
(the parse cache off) and prints the seconds per summary; then the per-round ratios. This leaves out
the start-up and the imports, which neither checkout changes and whose noise hides a tenth of the
analysis on a shared machine.

    python benchmarks/bench_summary_stages.py [PATH ...] [--repeat 3] [--no-big] [--no-shared] [--shared DIR]
                                              [--baseline OLD_CHECKOUT] [--no-commands]
                                              [--in-process ROUNDS] [--in-process-n 4]

Results: docs/performance.md ("Where a summary's time goes").
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from harness import describe_machine, load_average, median, run_measured, spread

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "sample_traces"
SHARED = ROOT.parent / "shared" / "traces"  # the shared recordings beside the checkout, as bench_load.py reads them
SHARED_H100 = Path("gpu-fsdp") / "h100-fsdp2-fake8-block"
BIG_TRACE = Path("gpu-real") / "trace_diff" / "control"  # 35 MB of JSON (1.8 MB gzip), 74,936 events

# The child: what `fsdpviz summary --json PATH` and its text form run, with clocks around the calls.
STAGES = r"""
import sys, time
T = time.perf_counter
spawned_at, path = float(sys.argv[1]), sys.argv[2]
t0 = T()
import fsdpviz.cli, typer._adapters  # what the command has imported when it starts
fsdpviz.cli._register_commands()
from fsdpviz.commands.summary import print_summary
from fsdpviz.analysis import pipeline
import fsdpviz.trace.loader as loader
stages = {"start-up + imports": time.time() - spawned_at}
counts = {}
def add(label, seconds):
    stages[label] = stages.get(label, 0.0) + seconds
    counts[label] = counts.get(label, 0) + 1
def timed(module, name, label):
    inner = getattr(module, name)
    def wrapper(*a, **k):
        t = T(); out = inner(*a, **k); add(label(*a, **k) if callable(label) else label, T() - t); return out
    setattr(module, name, wrapper)
timed(loader, "parse_all", "read + decode")
timed(loader, "load_run", "load_run")
timed(pipeline, "analyse_traces", "structure")
t = T(); result = pipeline.analyse([path], cache=False, progress=False)
stages["analyse (other)"] = T() - t - stages["load_run"] - stages.get("structure", 0.0)
stages["tables"] = stages.pop("load_run") - stages["read + decode"]
counts.pop("load_run")
t = T(); result.analysis if result.has_units else None; stages["figures: per-unit analysis"] = T() - t
t = T(); result.summary; stages["figures: summary"] = T() - t
from fsdpviz.whatif import gains
t = T(); gains.summary_model(result); stages["replay: model read"] = T() - t
timed(gains, "predict", lambda model, settings: "price: " + settings.describe())
timed(gains, "clock_of", "clock")
t = T(); summary = gains.completed_summary(result); whole = T() - t
stages["summary: the rest"] = whole - sum(v for k, v in stages.items() if k.startswith("price: ") or k == "clock")
import json, io, contextlib
t = T(); text = json.dumps(summary.to_json(), indent=2) + "\n"; stages["render: JSON"] = T() - t
t = T()
with contextlib.redirect_stdout(io.StringIO()):
    print_summary(summary)
stages["render: text"] = T() - t
try:
    from fsdpviz import cache as summary_cache
except ImportError:  # a checkout without the summary cache
    summary_cache = None
if summary_cache is not None:
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        t = T(); summary_cache.code_version(); stages["summary cache: code digest (once per process)"] = T() - t
        key = summary_cache.SummaryKey.of([path], steps=None, include_last_step=False)
        store = summary_cache.SummaryStore(key, folders=[__import__("pathlib").Path(tmp)])
        t = T(); store.write(summary, []); stages["summary cache: write"] = T() - t
        t = T(); found = summary_cache.SummaryStore(summary_cache.SummaryKey.of([path], steps=None,
                  include_last_step=False), folders=[__import__("pathlib").Path(tmp)]).read()
        stages["summary cache: read (key + decode)"] = T() - t
        assert found is not None and found.summary == summary
print(json.dumps({"stages": stages, "counts": counts, "events": int(result.traces.ranks["n_events"].sum()),
                  "ranks": len(result.traces.rank_ids)}), flush=True)
"""


def stages_of(path: Path, repeat: int, pythonpath: str) -> tuple[dict[str, float], dict[str, int], dict[str, int]]:
    """Median seconds per stage of a summary of ``path`` over ``repeat`` fresh processes, how many
    calls each stage made, and the input's ranks and events."""
    runs: list[dict[str, float]] = []
    counts: dict[str, int] = {}
    info: dict[str, int] = {}
    env = dict(os.environ, PYTHONPATH=pythonpath, FSDPVIZ_NO_CACHE="1")
    for _ in range(repeat):
        spawned = time.time()
        proc = subprocess.run([sys.executable, "-P", "-c", STAGES, str(spawned), str(path)], check=False,
                              capture_output=True, text=True, env=env)
        if proc.returncode != 0:
            raise SystemExit(f"stages of {path} failed:\n{proc.stderr[-3000:]}")
        found = json.loads(proc.stdout.strip().splitlines()[-1])
        runs.append(found["stages"])
        counts = found["counts"]
        info = {"ranks": found["ranks"], "events": found["events"]}
    names = list(dict.fromkeys(name for run in runs for name in run))
    return {n: statistics.median(run.get(n, 0.0) for run in runs) for n in names}, counts, info


def print_stages(path: Path, repeat: int, pythonpath: str) -> None:
    """One Markdown table: stage, ms, share of the in-process total."""
    stages, counts, info = stages_of(path, repeat, pythonpath)
    cache_rows = {k: v for k, v in stages.items() if k.startswith("summary cache")}
    timed = {k: v for k, v in stages.items() if k not in cache_rows}
    total = sum(timed.values())
    print(f"\n### {path} ({info['ranks']} rank(s), {info['events']:,} events; median of {repeat} fresh processes, "
          f"parse cache off; load average {load_average()})\n")
    print("| stage | ms | share |")
    print("|---|---:|---:|")
    for name, seconds in timed.items():
        calls = counts.get(name, 1)
        label = f"{name} x{calls}" if calls > 1 else name
        print(f"| {label} | {1000 * seconds:.0f} | {100 * seconds / total:.0f} % |")
    print(f"| **total (a cold summary)** | **{1000 * total:.0f}** | 100 % |")
    for name, seconds in cache_rows.items():
        print(f"| {name} (not in the total) | {1000 * seconds:.1f} | |")


def commands(paths: list[Path], repeat: int, checkouts: dict[str, str]) -> None:
    """``fsdpviz summary --json PATH`` cold and warm, each checkout, interleaved rounds."""
    variants: dict[str, tuple[list[str], dict[str, str]]] = {}
    for name, checkout in checkouts.items():
        env = dict(os.environ, PYTHONPATH=checkout)
        env.pop("FSDPVIZ_NO_CACHE", None)
        for path in paths:
            # -P: not the working folder first on the path, so that PYTHONPATH picks the checkout
            base = [sys.executable, "-P", "-m", "fsdpviz", "summary", "--json"]
            variants[f"{path.name}|{name}|cold"] = ([*base, "--no-cache", str(path)], env)
            variants[f"{path.name}|{name}|warm"] = ([*base, str(path)], env)
            run_measured([*base, str(path)], env=env)  # fills the caches the warm runs read
    loads = load_average()
    results: dict[str, list] = {k: [] for k in variants}
    for _ in range(repeat):
        for key, (argv, env) in variants.items():
            m = run_measured(argv, env=env)
            if m.returncode != 0:
                raise SystemExit(f"{' '.join(argv)} failed:\n{m.stderr[-2000:]}")
            results[key].append(m)
    print(f"\n### `fsdpviz summary --json` as a fresh process (median (min-max) of {repeat}, wall / CPU s; "
          f"load average {loads} .. {load_average()})\n")
    names = list(checkouts)
    head = " | ".join(f"{n} cold | {n} warm" for n in names)
    print(f"| input | {head} |")
    print("|---" + "|---:" * (2 * len(names)) + "|")
    for path in paths:
        cells = []
        for n in names:
            for how in ("cold", "warm"):
                runs = results[f"{path.name}|{n}|{how}"]
                cells.append(f"{spread([m.wall_s for m in runs])} / {median([m.cpu_s for m in runs]):.2f}")
        print(f"| {path.name} | " + " | ".join(cells) + " |")


# The in-process child: warm every input once, then time `n` summaries of each (the analysis alone).
IN_PROCESS = r"""
import sys, time
from pathlib import Path
from fsdpviz.trace.schema import own_this_process
own_this_process()  # the string storage a command's process uses
from fsdpviz.analysis.pipeline import analyse
from fsdpviz.whatif.gains import completed_summary
paths, n = [Path(p) for p in sys.argv[2:]], int(sys.argv[1])
for p in paths:
    completed_summary(analyse([p], cache=False))
t = time.perf_counter()
for _ in range(n):
    for p in paths:
        completed_summary(analyse([p], cache=False))
print((time.perf_counter() - t) / n / len(paths))
"""


def in_process(paths: list[Path], rounds: int, n: int, checkouts: dict[str, str]) -> None:
    """Seconds per in-process summary of ``paths`` (imports warm), each checkout, interleaved rounds."""
    per: dict[str, list[float]] = {name: [] for name in checkouts}
    loads = load_average()
    for i in range(rounds):
        order = list(checkouts) if i % 2 == 0 else list(reversed(checkouts))
        for name in order:
            env = dict(os.environ, PYTHONPATH=checkouts[name])
            done = subprocess.run([sys.executable, "-P", "-c", IN_PROCESS, str(n), *map(str, paths)], env=env,
                                  capture_output=True, text=True, check=False)
            if done.returncode != 0:
                raise SystemExit(f"the in-process summaries of {name} failed:\n{done.stderr[-2000:]}")
            per[name].append(float(done.stdout.split()[-1]))
    print(f"\n### In process: `analyse` + `completed_summary`, imports warm, parse cache off (s per summary over "
          f"{', '.join(p.name for p in paths)}; {rounds} rounds of {n}; load average {loads} .. {load_average()})\n")
    names = list(checkouts)
    print("| round | " + " | ".join(names) + (f" | {names[0]} / {names[1]} |" if len(names) == 2 else " |"))
    print("|---" + "|---:" * (len(names) + (len(names) == 2)) + "|")
    for i in range(rounds):
        cells = [f"{per[name][i]:.3f}" for name in names]
        if len(names) == 2:
            cells.append(f"{per[names[0]][i] / per[names[1]][i]:.2f}")
        print(f"| {i + 1} | " + " | ".join(cells) + " |")
    cells = [spread(per[name], "{:.3f}") for name in names]
    if len(names) == 2:
        cells.append(spread([a / b for a, b in zip(per[names[0]], per[names[1]])]))
    print("| median (min-max) of the rounds | " + " | ".join(cells) + " |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="*", type=Path, help="inputs (default: the samples, the shared H100 "
                        "recording and the 35 MB trace)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--no-big", action="store_true", help="leave out the 35 MB trace")
    parser.add_argument("--no-shared", action="store_true", help="leave out the shared H100 recording")
    parser.add_argument("--no-commands", action="store_true", help="only the stage split")
    parser.add_argument("--baseline", type=Path, help="another checkout of fsdpviz, timed beside this one")
    parser.add_argument("--shared", type=Path, default=SHARED, help=f"the shared traces (default {SHARED})")
    parser.add_argument("--in-process", type=int, default=0, metavar="ROUNDS",
                        help="with --baseline: this many interleaved rounds of in-process summaries")
    parser.add_argument("--in-process-n", type=int, default=4, help="summaries of each input per round")
    args = parser.parse_args()
    if args.in_process < 0 or args.in_process_n < 1:
        parser.error("--in-process takes a number of rounds (0: none) and --in-process-n one of summaries (1 or more)")
    if args.in_process and args.baseline is None:
        parser.error("--in-process compares with --baseline")
    paths = list(args.paths) or sorted(p for p in SAMPLES.iterdir() if p.is_dir())
    if not args.paths:
        for name, skip in ((SHARED_H100, args.no_shared), (BIG_TRACE, args.no_big)):
            if skip:
                continue
            extra = args.shared / name
            if extra.exists():
                paths.append(extra)
            else:
                print(f"# {extra} not found: left out", file=sys.stderr)
    print(f"# machine: {describe_machine()}")
    print(f"# command: {' '.join([Path(sys.executable).name, *sys.argv])}")
    for path in paths:
        print_stages(path, args.repeat, str(ROOT))
    if not args.no_commands:
        checkouts = {"this": str(ROOT)}
        if args.baseline is not None:
            checkouts["baseline"] = str(args.baseline.resolve())
        commands([p for p in paths if p.is_relative_to(SAMPLES)] or paths, args.repeat, checkouts)
    if args.in_process:
        in_process([p for p in paths if p.is_relative_to(SAMPLES)] or paths, args.in_process, args.in_process_n,
                   {"this": str(ROOT), "baseline": str(args.baseline.resolve())})


if __name__ == "__main__":
    main()
