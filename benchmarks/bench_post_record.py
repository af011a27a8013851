"""What ``fsdpviz record`` costs after the training command ends: the terminal summary and report.html.

A recording ends by loading its traces, printing the summary and writing the report page. For a
small job this must take a few seconds, not longer than the training (issue: real training stacks).
This benchmark records real 2-rank CPU runs once (the Hugging Face ``Trainer`` with FSDP2 from
``tests/clients/hf_trainer.py``, 8 steps, when transformers is installed; the bundled example
trainer), then times, in fresh processes, exactly what ``fsdpviz record`` runs after the command
(``fsdpviz.commands.record.summarise_and_report``), with no parse cache (a new recording has none),
``--repeat`` times. It also times the stages in one process: load, whole-step overlap, per-unit
analysis, summary, page data, page rendering + writing.

    python benchmarks/bench_post_record.py [--repeat 3] [--run RUN_DIR ...]

Results and the machine they were measured on are recorded in docs/performance.md.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import describe_machine, run_measured, spread, versions

STAGES = r"""
import json, sys, time
from pathlib import Path
T = time.perf_counter
times = {}
t = T()
from fsdpviz.trace import load_traces
traces = load_traces([sys.argv[1]], cache=False, progress=False); times["load"] = T() - t; t = T()
from fsdpviz.analysis.pipeline import analyse_traces
run = analyse_traces(traces); times["steps + overlap"] = T() - t; t = T()
run.analysis; times["per-unit analysis"] = T() - t; t = T()
run.summary; times["summary"] = T() - t; t = T()
from fsdpviz.report.data import prepare_report
data = prepare_report(run)
times["page data"] = T() - t; t = T()
from fsdpviz.report.html import write_page
from fsdpviz.report.page import build_page
size = write_page(build_page(data), Path(sys.argv[2])); times["render + write (imports included)"] = T() - t
from fsdpviz.replay.model import read_model
t = T(); read_model(run); what_if = T() - t  # again, alone: the part of the page data that predicts
print(json.dumps({"stages": times, "what_if_s": what_if, "html_mb": size / 1e6, "events": len(traces.events)}))
"""

AFTER_RECORD = ("import sys; from pathlib import Path; from fsdpviz.commands.record import summarise_and_report; "
                "summarise_and_report(Path(sys.argv[1]), summary=True, report=True)")


def record(out: Path, command: list[str], env: dict[str, str]) -> Path:
    """Record ``command`` into ``out`` without summary or report (the part measured here)."""
    done = subprocess.run([sys.executable, "-m", "fsdpviz", "record", "--out", str(out), "--no-summary",
                           "--no-report", "--", *command], check=False, env=env, capture_output=True, text=True,
                          timeout=900, cwd=out.parent)
    if done.returncode != 0:
        sys.exit(f"recording failed:\n{done.stderr[-3000:]}")
    return out


def recorded_runs(base: Path) -> list[Path]:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop("FSDPVIZ_RUN_DIR", None)
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    runs = [record(base / "example", [*torchrun, str(ROOT / "examples" / "train.py"), "--framework", "fsdp2"], env)]
    try:
        import transformers  # noqa: F401
    except ImportError:
        print("transformers not installed: the HF Trainer run is skipped", file=sys.stderr)
    else:
        runs.append(record(base / "hf-trainer", [*torchrun, str(ROOT / "tests" / "clients" / "hf_trainer.py"),
                                                 "--steps", "8", "--force-fsdp", "--out", str(base / "hf-out")], env))
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--run", type=Path, action="append", help="an existing run folder (else record them)")
    args = parser.parse_args()
    print(describe_machine())
    print(versions("fsdpviz", "torch", "pandas", "holoviews", "bokeh", "transformers"))
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        runs = args.run or recorded_runs(base)
        for run_dir in runs:
            walls, cpus = [], []
            for _ in range(args.repeat):
                shutil.rmtree(run_dir / "traces" / ".fsdpviz-cache", ignore_errors=True)
                m = run_measured([sys.executable, "-c", AFTER_RECORD, str(run_dir)])
                if m.returncode != 0:
                    sys.exit(m.stderr[-3000:])
                walls.append(m.wall_s)
                cpus.append(m.cpu_s)
            shutil.rmtree(run_dir / "traces" / ".fsdpviz-cache", ignore_errors=True)
            stages = run_measured([sys.executable, "-c", STAGES, str(run_dir), str(base / "stages.html")])
            if stages.returncode != 0:
                sys.exit(f"the stages of {run_dir.name} failed:\n{stages.stderr[-3000:]}")
            detail = json.loads(stages.stdout.strip().splitlines()[-1])
            print(f"\n{run_dir.name}: {detail['events']:,} events, page {detail['html_mb']:.1f} MB")
            print(f"  after the command (summary + report.html), fresh process: wall {spread(walls)} s, "
                  f"CPU {spread(cpus)} s")
            for stage, seconds in detail["stages"].items():
                print(f"    {stage:<36} {seconds:6.2f} s")
            print(f"    (of the page data: the what-if model read from the recording, read_model, "
                  f"{detail['what_if_s']:.2f} s)")


if __name__ == "__main__":
    main()
