"""Every output fsdpviz writes for a set of runs, snapshotted to a folder, and two snapshots compared.

A change that must keep outputs byte-identical (a refactor) is checked by snapshotting before and
after: ``summary --json``, ``whatif --json`` under five settings, the CSV and Perfetto exports and the
report's page data (:class:`fsdpviz.report.data.ReportData`, every table and number the page draws, as
JSON) of every bundled sample and, where they are beside the checkout, the shared H100 recordings
and a synthetic run whose rank clocks disagree (``tests/synth``; loaded whole and, as runs too large
to hold are, rank by rank), about four minutes; two snapshots of one checkout are identical. The
checkout's own path, its parent folder's and the synthetic run's are written as ``$CHECKOUT``,
``$PARENT`` and ``$INPUTS``, so snapshots of two checkouts compare. ``compare`` says which files
differ and where.

    python benchmarks/outputs_snapshot.py snapshot DIR      # run in the checkout to snapshot
    python benchmarks/outputs_snapshot.py compare DIR_A DIR_B
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = sorted(p for p in (ROOT / "sample_traces").iterdir() if p.is_dir())
GPU_FSDP = ROOT.parent / "shared" / "traces" / "gpu-fsdp"
WHATIF = [[], ["--prefetch", "2"], ["--world-size", "4"], ["--wrap", "merge:2"], ["--reshard-after-forward", "false"]]


def _skewed_run(out: Path) -> Path:
    """A synthetic 4-rank FSDP2 GPU run folder (``tests/synth``) whose ranks' clocks disagree by
    milliseconds, so that every output of it depends on moving ranks onto the reference clock."""
    sys.path.insert(0, str(ROOT / "tests"))
    from synth import Scenario, generate_run, make_root, make_units

    folder = out / "synth-skewed-clocks"
    generate_run(Scenario(units=make_units(4), root=make_root(), world_size=4,
                          clock_offset_ns={1: 7_000_000, 2: -3_000_000, 3: 12_500_000}), folder, run_folder=True)
    run_json = folder / "run.json"  # written with the time it was generated at: made the same every time
    info = json.loads(run_json.read_text())
    info["start_time"] = info["end_time"] = "2026-01-01T00:00:00+00:00"
    run_json.write_text(json.dumps(info, indent=2))
    return folder


RANK_BY_RANK = "-rank-by-rank"  # a run's outputs analysed rank by rank (FSDPVIZ_KEEP_EVENTS=0)


def _runs(out: Path) -> list[tuple[Path, str]]:
    """(run, the name of its snapshot folder): each run loaded whole, and the skewed one also analysed
    rank by rank, the path of runs too large to hold whole."""
    gpu = sorted(p for p in GPU_FSDP.iterdir() if p.is_dir()) if GPU_FSDP.is_dir() else []
    skewed = _skewed_run(out / "_inputs")
    return [(p, p.name) for p in [*SAMPLES, *gpu, skewed]] + [(skewed, skewed.name + RANK_BY_RANK)]


_PATHS: list[tuple[str, str]] = [(str(ROOT), "$CHECKOUT"), (str(ROOT.parent), "$PARENT")]


def _portable(text: str) -> str:
    """``text`` with this checkout's (and this snapshot's) absolute paths written alike everywhere."""
    for path, token in _PATHS:
        text = text.replace(path, token)
    return text


_ENV: dict[str, str] = {}  # set while a run is snapshotted rank by rank


def _run(*args: str) -> tuple[int, str]:
    # this checkout's fsdpviz, whichever one the environment has installed
    env = {**os.environ, "PYTHONPATH": str(ROOT), **_ENV}
    proc = subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=ROOT, check=False, env=env)
    text = proc.stdout if proc.returncode == 0 else (proc.stderr.strip().splitlines()[-1:] or [""])[0]
    return proc.returncode, _portable(text)


def _fsdpviz(*args: str) -> tuple[int, str]:
    return _run("-m", "fsdpviz", *args)


def _plain(value: Any) -> Any:
    """``value`` (the page data: dataclasses, frames, lists) as JSON-able values, every table whole."""
    import pandas as pd

    if isinstance(value, pd.DataFrame):
        return {"columns": [str(c) for c in value.columns], "dtypes": [str(t) for t in value.dtypes],
                "csv": value.to_csv(index=False).splitlines()}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, float):
        return repr(value)
    return value if value is None or isinstance(value, (bool, int, str)) else repr(value)


def report_data(run: Path) -> None:
    """Print the report page data of ``run`` as JSON (what ``snapshot`` keeps of the report)."""
    from fsdpviz.analysis.pipeline import analyse
    from fsdpviz.report.data import prepare_report

    data = prepare_report(analyse([run], cache=False))
    print(json.dumps(_plain(data), indent=1, sort_keys=True))


def snapshot(out: Path, only: str | None = None) -> None:
    """Write every output of every run under ``out`` (one folder per run); ``only``: of the runs
    whose folder name holds it."""
    out = out.resolve()
    _PATHS.insert(0, (str(out / "_inputs"), "$INPUTS"))  # where the synthetic run is written
    for run, name in _runs(out):
        if only and only not in name:
            continue
        _ENV.clear()
        if name.endswith(RANK_BY_RANK):
            _ENV["FSDPVIZ_KEEP_EVENTS"] = "0"
        folder = out / name
        folder.mkdir(parents=True, exist_ok=True)
        rc, text = _fsdpviz("summary", str(run), "--json")
        (folder / "summary.json").write_text(f"rc {rc}\n{text}")
        for options in WHATIF:
            file = "whatif" + "".join(f"_{o.strip('-').replace(':', '')}" for o in options) + ".json"
            rc, text = _fsdpviz("whatif", str(run), *options, "--json")
            (folder / file).write_text(f"rc {rc}\n{text}")
        rc, text = _fsdpviz("export", str(run), "--format", "csv", "-o", str(folder / "export-csv"))
        (folder / "export.rc").write_text(f"rc {rc}\n")
        for csv in (folder / "export-csv").glob("*"):
            csv.write_text(_portable(csv.read_text()))
        perfetto = folder / "perfetto.json"
        rc, text = _fsdpviz("export", str(run), "--format", "perfetto", "-o", str(perfetto))
        (folder / "perfetto.rc").write_text(f"rc {rc}\n")
        if perfetto.is_file():  # one event per line, so that a difference is shown where it is
            trace = json.loads(perfetto.read_text())
            perfetto.write_text(_portable(json.dumps(trace, indent=0, sort_keys=True)))
        rc, text = _run(__file__, "report-data", str(run))
        (folder / "report-data.json").write_text(f"rc {rc}\n{text}")
        print(f"{name}: done", flush=True)


def compare(a: Path, b: Path) -> int:
    """Print each file that differs between two snapshots (the first lines that differ); 1 if any."""
    def outputs(folder: Path) -> set[Path]:
        return {p.relative_to(folder) for p in folder.rglob("*") if p.is_file() and p.parts[len(folder.parts)] != "_inputs"}

    names = sorted(outputs(a) | outputs(b))
    differ = 0
    for name in names:
        fa, fb = a / name, b / name
        if not fa.is_file() or not fb.is_file():
            print(f"{name}: only in {'the second' if not fa.is_file() else 'the first'}")
            differ += 1
            continue
        if fa.read_bytes() == fb.read_bytes():
            continue
        differ += 1
        lines = list(difflib.unified_diff(fa.read_text(errors="replace").splitlines(),
                                          fb.read_text(errors="replace").splitlines(), lineterm="", n=0))
        print(f"{name}: differs\n  " + "\n  ".join(lines[2:8]))
    print(f"{len(names)} files, {differ} differ")
    return 1 if differ else 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    snap = sub.add_parser("snapshot")
    snap.add_argument("out", type=Path)
    snap.add_argument("--only", help="snapshot only the runs whose folder name holds this text")
    sub.add_parser("report-data").add_argument("run", type=Path)
    cmp = sub.add_parser("compare")
    cmp.add_argument("a", type=Path)
    cmp.add_argument("b", type=Path)
    args = parser.parse_args()
    if args.command == "snapshot":
        snapshot(args.out, args.only)
    elif args.command == "report-data":
        report_data(args.run)
    else:
        raise SystemExit(compare(args.a, args.b))


if __name__ == "__main__":
    main()
