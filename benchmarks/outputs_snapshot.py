"""Every output fsdpviz writes for a set of runs, snapshotted to a folder, and two snapshots compared.

A change that must keep outputs byte-identical (a refactor) is checked by snapshotting before and
after: ``summary --json``, ``whatif --json`` under five settings and the CSV export of every bundled
sample and, where they are beside the checkout, the shared H100 recordings (187 files, about two
minutes; two snapshots of one checkout are identical). ``compare`` says which files differ and where.

    python benchmarks/outputs_snapshot.py snapshot DIR      # run in the checkout to snapshot
    python benchmarks/outputs_snapshot.py compare DIR_A DIR_B
"""

from __future__ import annotations

import argparse
import difflib
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = sorted(p for p in (ROOT / "sample_traces").iterdir() if p.is_dir())
GPU_FSDP = ROOT.parent / "shared" / "traces" / "gpu-fsdp"
WHATIF = [[], ["--prefetch", "2"], ["--world-size", "4"], ["--wrap", "merge:2"], ["--reshard-after-forward", "false"]]


def _runs() -> list[Path]:
    gpu = sorted(p for p in GPU_FSDP.iterdir() if p.is_dir()) if GPU_FSDP.is_dir() else []
    return SAMPLES + gpu


def _fsdpviz(*args: str) -> tuple[int, str]:
    proc = subprocess.run([sys.executable, "-m", "fsdpviz", *args], capture_output=True, text=True, cwd=ROOT,
                          check=False)
    return proc.returncode, proc.stdout if proc.returncode == 0 else proc.stderr.strip().splitlines()[-1:][0]


def snapshot(out: Path) -> None:
    """Write every output of every run under ``out`` (one folder per run)."""
    for run in _runs():
        folder = out / run.name
        folder.mkdir(parents=True, exist_ok=True)
        rc, text = _fsdpviz("summary", str(run), "--json")
        (folder / "summary.json").write_text(f"rc {rc}\n{text}")
        for options in WHATIF:
            name = "whatif" + "".join(f"_{o.strip('-').replace(':', '')}" for o in options) + ".json"
            rc, text = _fsdpviz("whatif", str(run), *options, "--json")
            (folder / name).write_text(f"rc {rc}\n{text}")
        rc, text = _fsdpviz("export", str(run), "--format", "csv", "-o", str(folder / "export-csv"))
        (folder / "export.rc").write_text(f"rc {rc}\n")
        print(f"{run.name}: done", flush=True)


def compare(a: Path, b: Path) -> int:
    """Print each file that differs between two snapshots (the first lines that differ); 1 if any."""
    names = sorted({p.relative_to(a) for p in a.rglob("*") if p.is_file()}
                   | {p.relative_to(b) for p in b.rglob("*") if p.is_file()})
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
    sub.add_parser("snapshot").add_argument("out", type=Path)
    cmp = sub.add_parser("compare")
    cmp.add_argument("a", type=Path)
    cmp.add_argument("b", type=Path)
    args = parser.parse_args()
    if args.command == "snapshot":
        snapshot(args.out)
    else:
        raise SystemExit(compare(args.a, args.b))


if __name__ == "__main__":
    main()
