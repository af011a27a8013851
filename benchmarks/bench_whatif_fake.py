"""Accuracy of ``fsdpviz whatif`` peak memory on every setting, against recordings of each setting.

Records ``examples/train.py`` (FSDP2 and FSDP1, bf16 parameters with fp32 reductions as on a GPU) on CPU
in one process under torch's fake process group (``--fake-world N``): FSDP shards over N for real, makes
every copy-in, all-gather output and reduce-scatter buffer, and the collectives move nothing. The
CPU allocator caches nothing and the profiler's CPU level counts from the trace's start the same
way in every recording (plus what ``fsdpviz record`` measured alive then), so each recording's peak
is exact and repeats to the byte: a truth for every setting, without a GPU. Every wrap policy (per
block, two blocks per unit, one root unit), resharding, explicit prefetch depth and world size is
recorded (FSDP1: the wrap policies and world sizes, the settings ``whatif`` covers for it), and
each recording is predicted from every other one of its framework whose units are not coarser
(``whatif`` cannot split a recorded unit). Targets (docs/whatif.md): the predicted peak within 3 %
of the recorded one, the predicted change (predicted peak - source peak) within 20 % of the true
change, or within 1 % of the source's peak where the true change is under 5 % of it.

    python benchmarks/bench_whatif_fake.py [--out DIR] [--models small,wide] [--frameworks fsdp2,fsdp1]

Prints one markdown table per model and framework and a summary line; results are recorded in docs/whatif.md.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import describe_machine

MIB = 1 << 20
PEAK_TARGET, CHANGE_TARGET, SMALL_CHANGE = 0.03, 0.20, 0.05
# the model: d 512 x 6 blocks (the reductions make the peak), and a wide batch (the activations do)
MODELS = {
    "small": ["--layers", "6", "--dim", "512", "--batch", "4"],
    "wide": ["--layers", "4", "--dim", "256", "--batch", "96"],
}


@dataclass(frozen=True, slots=True)
class Setting:
    """One recorded setting of the example trainer."""

    wrap: str = "block"  # block / pair / root
    reshard: bool = True
    prefetch: int = 0  # 0: FSDP2's implicit prefetch
    world: int = 8
    framework: str = "fsdp2"

    @property
    def name(self) -> str:
        parts = [self.wrap] if self.framework == "fsdp2" else [self.framework, self.wrap]
        if not self.reshard:
            parts.append("no-reshard")
        if self.prefetch:
            parts.append(f"prefetch {self.prefetch}")
        if self.world != 8:
            parts.append(f"world {self.world}")
        return ", ".join(parts)

    def train_args(self) -> list[str]:
        return ["--framework", self.framework, "--wrap", self.wrap, "--prefetch", str(self.prefetch),
                "--fake-world", str(self.world), *([] if self.reshard else ["--no-reshard-after-forward"])]


SETTINGS = [Setting(), Setting(wrap="pair"), Setting(wrap="root"), Setting(reshard=False), Setting(prefetch=1),
            Setting(prefetch=2), Setting(world=2), Setting(world=16)]
# FSDP1: whatif covers its wrap and world size (its resharding and prefetch are other knobs)
FSDP1_SETTINGS = [Setting(framework="fsdp1", **kw) for kw in ({}, {"wrap": "pair"}, {"wrap": "root"}, {"world": 2},
                                                                {"world": 16})]
FRAMEWORKS = {"fsdp2": SETTINGS, "fsdp1": FSDP1_SETTINGS}
COARSENESS = {"block": 0, "pair": 1, "root": 2}


def whatif_options(source: Setting, target: Setting) -> list[str] | None:
    """The ``whatif`` options that predict ``target`` from a recording of ``source`` (None: it
    would split the source's units)."""
    if COARSENESS[target.wrap] < COARSENESS[source.wrap]:
        return None
    options = []
    if target.wrap != source.wrap:
        options += ["--wrap", "root" if target.wrap == "root" else "merge:2"]
    if target.reshard != source.reshard and target.wrap != "root":  # the root unit never reshards
        options += ["--reshard-after-forward", str(target.reshard).lower()]
    if target.prefetch != source.prefetch and target.wrap != "root":  # one unit: nothing to prefetch
        options += ["--prefetch", str(target.prefetch) if target.prefetch else "implicit"]
    if target.world != source.world:
        options += ["--world-size", str(target.world)]
    return options


def record(out: Path, model: list[str], setting: Setting) -> None:
    """``fsdpviz record`` of the example trainer in one process under the fake group."""
    cmd = [sys.executable, "-m", "fsdpviz", "record", "--out", str(out), "--no-report", "--no-summary", "--",
           sys.executable, str(ROOT / "examples" / "train.py"), "--bf16", *model, *setting.train_args()]
    proc = subprocess.run(cmd, check=False, capture_output=True, text=True,
                          env=dict(os.environ, OMP_NUM_THREADS="1"), timeout=900)
    if proc.returncode != 0:
        raise SystemExit(f"recording {out.name} failed:\n{proc.stderr[-2000:]}")


def predicted_peak(model: object, options: list[str]) -> int:
    """The peak ``whatif OPTIONS`` predicts from a read recording."""
    from fsdpviz.replay.model import Model
    from fsdpviz.replay.settings import Settings, parse_bool, parse_prefetch, parse_wrap
    from fsdpviz.whatif.predict import predict

    assert isinstance(model, Model)
    settings = Settings()
    for option, value in zip(options[::2], options[1::2]):
        if option == "--wrap":
            settings = settings.with_(wrap=parse_wrap(value))
        elif option == "--prefetch":
            settings = settings.with_(prefetch=parse_prefetch(value))
        elif option == "--reshard-after-forward":
            settings = settings.with_(reshard_after_forward=parse_bool(value, option))
        elif option == "--world-size":
            settings = settings.with_(world_size=int(value))
    peak = predict(model, settings).predicted.peak_allocated_bytes
    assert peak is not None
    return peak


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None, help="keep the recordings here (default: a temp folder)")
    parser.add_argument("--models", default=",".join(MODELS), help=f"which of {', '.join(MODELS)}")
    parser.add_argument("--frameworks", default=",".join(FRAMEWORKS), help=f"which of {', '.join(FRAMEWORKS)}")
    args = parser.parse_args()
    from fsdpviz.analysis.pipeline import analyse
    from fsdpviz.replay.model import read_model

    started = time.perf_counter()
    print(describe_machine())
    failed = total = 0
    with tempfile.TemporaryDirectory() as tmp:
        base = args.out or Path(tmp)
        for name, framework in ((n, f) for n in args.models.split(",") for f in args.frameworks.split(",")):
            model_args = MODELS[name]
            settings = FRAMEWORKS[framework]
            models = {}
            for setting in settings:
                folder = base / name / setting.name.replace(", ", "-").replace(" ", "")
                if not (folder / "run.json").is_file():
                    record(folder, model_args, setting)
                models[setting] = read_model(analyse([folder], cache=False, progress=False))
                print(f"recorded {name}: {setting.name}", file=sys.stderr, flush=True)
            peaks = {s: m.recording.steps and max(st.memory.peak_bytes for st in m.recording.steps
                                                  if st.memory is not None) for s, m in models.items()}
            print(f"\nmodel {name}: examples/train.py --bf16 {' '.join(model_args)}, {framework.upper()}, fake group\n")
            print("| recorded | predicted | whatif options | predicted peak (MiB) | true peak (MiB) | error "
                  "| predicted change (MiB) | true change (MiB) | error | within targets |")
            print("|---|---|---|---:|---:|---:|---:|---:|---:|---|")
            for source in settings:
                for target in settings:
                    options = whatif_options(source, target)
                    if target == source or options is None:
                        continue
                    base_peak, true_peak = peaks[source], peaks[target]
                    peak = predicted_peak(models[source], options)
                    change, true_change = peak - base_peak, true_peak - base_peak
                    peak_err = (peak - true_peak) / true_peak
                    small = abs(true_change) < SMALL_CHANGE * base_peak
                    ok = abs(peak_err) <= PEAK_TARGET and (
                        abs(change - true_change) <= (0.01 * base_peak if small else CHANGE_TARGET * abs(true_change)))
                    change_err = (f"{100 * (change - true_change) / abs(true_change):+.1f} %" if true_change
                                  else ("exact" if change == 0 else "-"))
                    total += 1
                    failed += not ok
                    print(f"| {source.name} | {target.name} | {' '.join(options) or '(none)'} | {peak / MIB:,.2f} "
                          f"| {true_peak / MIB:,.2f} | {100 * peak_err:+.2f} % | {change / MIB:+,.2f} "
                          f"| {true_change / MIB:+,.2f} | {change_err}{' (small)' if small else ''} "
                          f"| {'yes' if ok else 'NO'} |", flush=True)
    print(f"\n{total - failed} of {total} predictions within the targets ({time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    main()
