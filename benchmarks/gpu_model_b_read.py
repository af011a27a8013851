"""Read what ``benchmarks/gpu_model_b_check.sh`` brought back from a GPU: the recordings against the bare runs
and the in-process truth beside them.

    python benchmarks/gpu_model_b_read.py results.tgz [--keep DIR]

Prints markdown tables (results: docs/whatif.md, "Model B on a GPU at this release"):
- the bare truth: each in-process round's step times and ratios to the block wrap, their medians; the bare
  runs' own step times (median of steps >= 3) and ``max_memory_allocated``;
- per recording: what the recorded script printed about itself in the clean steps (``run.json``'s
  ``observer.clean_steps``) against the bare runs, the peaks it printed against the bare peak (a recorder
  that resets the CUDA peak statistics changes them), the headline step, the profiler's slowdown of the
  profiled steps, the clock's basis and its out-of-sample errors;
- per recording and setting: whatif's predicted step ratio against the in-process truth's ratio, and the
  recordings' predictions against each other.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tarfile
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_replay_clock import step_ratio, summary

RECORDINGS = ("light", "mem", "heavy")
# whatif's options for each setting of gpu_model_b.py truth
SETTINGS = {"root": ["--wrap", "root"], "pair": ["--wrap", "merge:2"], "reshard_false": ["--reshard-after-forward", "false"]}


def jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.startswith("{")]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("results", type=Path)
    p.add_argument("--keep", type=Path, help="extract here (kept) instead of a temporary folder")
    a = p.parse_args()
    where = a.keep or Path(tempfile.mkdtemp(prefix="gpu-model-b-"))
    with tarfile.open(a.results) as tar:
        tar.extractall(where, filter="data")
    w = where / "w"
    print((w / "progress.log").read_text().splitlines()[0])

    rounds = [line["ms"] for i in (1, 2) if (w / f"truth{i}.json").exists()
              for line in jsonl(w / f"truth{i}.json") if "round" in line]
    truth = {s: statistics.median(r[s] / r["block"] for r in rounds) for s in SETTINGS}
    print("\n| in-process round | block ms | " + " | ".join(SETTINGS) + " |")
    print("|---|---:|" + "---:|" * len(SETTINGS))
    for i, r in enumerate(rounds):
        print(f"| {i} | {r['block']:.1f} | " + " | ".join(f"{r[s]:.1f} ({r[s] / r['block']:.3f})" for s in SETTINGS) + " |")
    print(f"| median | {statistics.median(r['block'] for r in rounds):.1f} | "
          + " | ".join(f"{truth[s]:.3f}" for s in SETTINGS) + " |")

    bare = [jsonl(w / f"bare{i}.jsonl") for i in (1, 2) if (w / f"bare{i}.jsonl").exists()]
    bare_ms = [statistics.median(s["ms"] for s in b if s["step"] >= 3) for b in bare]
    bare_peaks = sorted({s["peak"] for b in bare for s in b if s["step"] >= 1})
    block_ms = sorted([r["block"] for r in rounds] + bare_ms)
    print(f"\nbare runs (separate processes): step {', '.join(f'{m:.1f}' for m in bare_ms)} ms; "
          f"peak (steps >= 1) {bare_peaks}; every bare block step figure: {block_ms[0]:.1f}-{block_ms[-1]:.1f} ms")

    print("\n| recording | clean steps | script's clean steps ms (median, range) | script's peaks | headline ms | "
          "traced ms | profiler slowdown | basis | replay error % | phase error % |")
    print("|---|---|---|---|---:|---:|---:|---|---:|---:|")
    ratios: dict[str, dict[str, float]] = {}
    for name in RECORDINGS:
        run = w / name
        if not (run / "run.json").exists():
            err = w / f"{name}.err"
            print(f"| {name} | not recorded: {err.read_text().strip()[-300:] if err.exists() else 'skipped'} |")
            continue
        clean = json.loads((run / "run.json").read_text())["ranks"][0]["observer"]["clean_steps"]
        own = {s["step"]: s for s in jsonl(w / f"{name}.jsonl")}
        clean_ms = [own[c]["ms"] for c in clean]
        peaks = sorted({own[c]["peak"] for c in clean})
        s = summary(run)
        clock = s["clock"]
        print(f"| {name} | {clean[0]}-{clean[-1]} | {statistics.median(clean_ms):.1f} ({min(clean_ms):.1f}-{max(clean_ms):.1f}) | "
              f"{peaks} | {s['step_time_ms']:.1f} | {s['traced_step_time_ms']:.1f} | "
              f"{s['traced_step_time_ms'] / s['step_time_ms']:.2f}x | {clock['basis']} | {clock['replay_error_pct']} | "
              f"{clock.get('phase_error_pct')} |")
        ratios[name] = {}
        for setting, options in SETTINGS.items():
            ratios[name][setting] = step_ratio(run, options)

    print("\n| setting | in-process truth | " + " | ".join(ratios) + " | worst miss | recordings apart |")
    print("|---|---:|" + "---:|" * len(ratios) + "---:|---:|")
    for setting in SETTINGS:
        got = [ratios[r][setting] for r in ratios]
        miss = max((g - truth[setting] for g in got), key=abs)
        print(f"| {setting} | {truth[setting]:.3f} | " + " | ".join(f"{g:.3f}" for g in got)
              + f" | {miss:+.3f} | {max(got) - min(got):.3f} |")


if __name__ == "__main__":
    main()
