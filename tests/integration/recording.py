"""Real 2-rank CPU/gloo jobs of the example trainer for the integration tests, and ``fsdpviz record``
on them (how jobs start: ``helpers/jobs.py``).

A recording costs seconds of two busy cores, so the same configuration is recorded once per test
session: :class:`Recordings` (the session fixture ``recordings`` of ``conftest.py``) records a
:class:`Config` the first time a test asks for it, in whichever xdist worker that test runs, and
hands the same run folder to every later test of every worker. Tests only read that folder (copy it to change it). The example trainer's configurations
that modules check from different sides are in :data:`EXAMPLE_RUNS`.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from helpers.committed import REPO, copy_is_read, recorded_once
from helpers.jobs import (
    EXAMPLE,
    NO_OUTPUT,
    deepspeed_launch,
    fsdpviz,
    record_env,
    retried,
    run_job,
    torchrun,
)
from helpers.once import shared_processes

from fsdpviz.analysis.pipeline import RunResult
from fsdpviz.replay.model import read_model

SCRIPTS = Path(__file__).resolve().parent / "record_scripts"


def record(run_dir: Path, command: list[str], *options: str, env: dict[str, str] | None = None
           ) -> subprocess.CompletedProcess:
    """``fsdpviz record --out RUN_DIR OPTIONS -- COMMAND`` (no report or summary unless OPTIONS ask),
    once more into a clean folder if PyTorch aborted a rank at exit (helpers.jobs.TEARDOWN_CRASH)."""
    return retried(lambda: fsdpviz("record", "--out", str(run_dir), *NO_OUTPUT, *options, "--", *command, env=env),
                   tidy=lambda: shutil.rmtree(run_dir, ignore_errors=True))


@dataclass(frozen=True)
class Config:
    """One recording of the example trainer: its flags and ``fsdpviz record``'s options."""

    train_args: tuple[str, ...]
    record_options: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    script: Path = EXAMPLE
    output_flag: str = "--log-losses"  # the script's flag for its per-rank output (a ``{rank}`` template)
    launcher: str = "torchrun"  # or "deepspeed": DeepSpeed's own launcher starts the ranks
    # For tests that only analyse the recording: the name of its committed copy under tests/recorded/
    # (helpers/committed.py); "": always recorded (what the recorder itself makes is under test)
    committed: str = ""

    def command(self, *extra: str) -> list[str]:
        """The job's command line: the launcher, the script, its arguments and ``extra``."""
        launch = deepspeed_launch if self.launcher == "deepspeed" else torchrun
        return launch(self.script, *self.train_args, *extra)

    def environment(self) -> dict[str, str]:
        return record_env(**dict(self.env))

    def identity(self) -> dict[str, object]:
        """What the recording depends on besides its script's content (helpers/committed.py)."""
        return {"train_args": self.train_args, "record_options": self.record_options, "env": self.env,
                "script": str(self.script.resolve().relative_to(REPO)), "output_flag": self.output_flag,
                "launcher": self.launcher}

    def folder_name(self) -> str:
        """A folder name that is the same for this configuration in every worker of the session."""
        readable = "-".join(a.lstrip("-").replace("+", "-") for a in self.train_args[:4])
        digest = hashlib.sha256(repr(self).encode()).hexdigest()[:10]
        return f"{readable}-{digest}"


@dataclass(frozen=True)
class Recording:
    """A recorded job: its run folder, what ``fsdpviz record`` printed, the losses each rank logged."""

    config: Config
    run_dir: Path
    proc: subprocess.CompletedProcess
    losses: Path  # a ``--log-losses`` template with ``{rank}`` (the script's ``output_flag``)
    from_copy: bool = False  # read from its committed copy (helpers/committed.py), not recorded in this session

    def unrecorded_losses(self, out: Path) -> Path:
        """Run the same job without fsdpviz; its ``--log-losses`` template under ``out``."""
        template = out / "plain-{rank}.txt"
        done = retried(lambda: run_job(self.config.command("--log-losses", str(template)),
                                       env=self.config.environment()))
        assert done.returncode == 0, done.stderr[-3000:]
        return template


@dataclass(frozen=True)
class MeshRecording:
    """A 4-rank recording of ``record_scripts/mesh_train.py``: its run folder and the truth the
    script wrote about itself (mesh sizes, each unit's parameter bytes via ``DTensor.to_local()``)."""

    run_dir: Path
    truth: dict


MESH_RANKS = 4
MESH_STEPS = 5
MESH_RECORD = ("--warmup", "2", "--steps", "2")  # fsdpviz record's options for the meshes


class MeshRecordings:
    """Each mode of ``mesh_train.py`` (``tp``: TP x FSDP2, ``hsdp``) recorded once per session, on first
    use, whichever xdist worker asks (``helpers/once.py``)."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.done: dict[str, MeshRecording] = {}

    def get(self, mode: str) -> MeshRecording:
        if mode not in self.done:
            folder = self.base / mode
            truth = folder / "truth.json"

            # tp: a barrier and an all_gather_object every step too, communication that is not FSDP's
            extras = ("--extras",) if mode == "tp" else ()

            def make() -> dict[str, subprocess.CompletedProcess | None]:
                command = torchrun(SCRIPTS / "mesh_train.py", "--mode", mode, "--steps", str(MESH_STEPS),
                                   "--truth", str(truth), *extras, nproc=MESH_RANKS)
                return {"proc": retried(lambda: fsdpviz("record", "--out", str(folder / "run"), *NO_OUTPUT,
                                                        *MESH_RECORD, "--", *command,
                                                        env=record_env(), timeout=600),
                                        tidy=lambda: shutil.rmtree(folder / "run", ignore_errors=True))}

            identity = {"mode": mode, "ranks": MESH_RANKS, "steps": MESH_STEPS, "extras": list(extras),
                        "record": list(MESH_RECORD)}
            proc = recorded_once(folder, f"mesh-{mode}", identity, [SCRIPTS / "mesh_train.py"], make)["proc"]
            assert proc is not None and proc.returncode == 0, proc.stderr[-3000:] if proc else ""
            self.done[mode] = MeshRecording(folder / "run", json.loads(truth.read_text()))
        return self.done[mode]


class Recordings:
    """Each :class:`Config` recorded once per session, into its own folder under ``base``: the
    first test to ask records it, on whichever xdist worker it runs (``helpers/once.py``)."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.done: dict[Config, Recording] = {}

    def get(self, config: Config) -> Recording:
        if config not in self.done:
            folder = self.base / config.folder_name()
            losses = folder / "losses-{rank}.txt"
            run_dir = folder / "run"

            def make() -> dict[str, subprocess.CompletedProcess | None]:
                return {"proc": retried(lambda: fsdpviz("record", "--out", str(run_dir), *config.record_options, "--",
                                                        *config.command(config.output_flag, str(losses)),
                                                        env=config.environment(), timeout=600),
                                        tidy=lambda: shutil.rmtree(run_dir, ignore_errors=True))}

            if config.committed:
                procs = recorded_once(folder, config.committed, config.identity(), [config.script], make)
            else:
                procs = shared_processes(folder, make)
            proc = procs["proc"]
            assert proc is not None
            from_copy = bool(config.committed) and copy_is_read(config.committed, config.identity(), [config.script])
            self.done[config] = Recording(config, run_dir, proc, losses, from_copy)
        return self.done[config]


# The example trainer's recordings of test_record.py (each run folder against the model, the
# frameworks' labels and an unrecorded run's losses) and test_unit_analysis_cpu.py (the per-unit
# analysis of explicit prefetch), which share the FSDP1 and the ZeRO-3 leaf-module recordings. Three
# blocks, so that every block but the first is gathered by a prefetch; the default schedule: 0 warms up,
# 1 is the profiler's warm-up, 2-5 profiled and analysed, 6 right after the trace export, 7-10 timed
# unprofiled (the headline step time). FSDP2's default run is recorded in every session (`make test`
# holds the recorder to it, and to the same job's losses run bare); the FSDP1 and ZeRO-3 ones are read
# from their committed copies (helpers/committed.py: current with the recorder's sources, or recorded
# now), and recorded afresh by `make test-recordings`.
LAYERS = 3
# How far whatif's replay of the recorded setting may miss each traced step's own span (%): the replay
# runs the host's time as read, so only what the reading loses or counts twice shows
STEP_REPLAY_PCT = 0.05


def step_replay_misses(run: RunResult) -> list[float]:
    """Per traced step of ``run``: how far (%) whatif's replay of the recorded setting misses the step's
    own ProfilerStep span."""
    model = read_model(run)
    return [abs(r.step_ns - s.step_ns) / s.step_ns * 100 for s, r in zip(model.recording.steps, model.replays)]


STEPS = 11
PROFILED = [2, 3, 4, 5]
UNPROFILED = [7, 8, 9, 10]
MODEL = ("--layers", str(LAYERS), "--dim", "32", "--seed", "0", "--steps", str(STEPS))
PROFILE = ("--steps", str(len(PROFILED)))
ZERO3_ENV = (("DS_ACCELERATOR", "cpu"),)
EXAMPLE_RUNS = {
    # FSDP2's implicit prefetch; also the terminal summary and report.html, as `fsdpviz record` does by default
    "fsdp2": Config(("--framework", "fsdp2", "--wrap", "block", *MODEL), (*PROFILE, "--summary")),
    # explicit prefetch one unit ahead (set_modules_to_forward_prefetch / set_modules_to_backward_prefetch)
    "fsdp2-prefetch": Config(("--framework", "fsdp2", "--wrap", "block", "--prefetch", "1", *MODEL),
                             (*NO_OUTPUT, *PROFILE), committed="fsdp2-prefetch"),
    # forward_prefetch=True (and BACKWARD_PRE)
    "fsdp1": Config(("--framework", "fsdp1", "--wrap", "block", "--prefetch", "1", *MODEL), (*NO_OUTPUT, *PROFILE),
                    committed="example-fsdp1"),
    # DeepSpeed's own default: every submodule with parameters fetched on its own
    "zero3-submodule": Config(("--framework", "zero3", "--wrap", "submodule", *MODEL), (*NO_OUTPUT, *PROFILE),
                              ZERO3_ENV, committed="example-zero3-submodule"),
    # blocks as ZeRO-3 leaf modules, a prefetch bucket of one block; started by DeepSpeed's own launcher
    # (`deepspeed --num_gpus 2`), as DeepSpeed users start their jobs
    "zero3-block": Config(("--framework", "zero3", "--wrap", "block", "--prefetch", "1", *MODEL),
                          (*NO_OUTPUT, *PROFILE), ZERO3_ENV, launcher="deepspeed", committed="example-zero3-block"),
}


# The memory variations of record_scripts/memory_train.py (FSDP2, 3 layers of dim 32, 7 steps; steps
# 2-4 profiled: --warmup 2), two or three to a recording: each prints its own truth (``--truth``),
# test_memory_truth.py holds fsdpviz to it.
MEMORY_SCRIPT = SCRIPTS / "memory_train.py"
MEMORY_RUNS = {
    name: Config(args, (*NO_OUTPUT, "--steps", "3", *options), script=MEMORY_SCRIPT, output_flag="--truth",
                 committed=f"memory-{name}")
    for name, (args, options) in {
        # Adam with amsgrad (three states), the gradients zeroed by model.zero_grad() (no Optimizer range),
        # two micro-batches per optimizer step (gradient accumulation)
        "adam-amsgrad+model-zero-grad+2-micro": (("--optimizer", "adam-amsgrad", "--zero-grad", "model",
                                                  "--micro-batches", "2"), ("--warmup", "2")),
        # SGD with momentum (one state), the gradients kept from step to step (set_to_none=False)
        "sgd-momentum+keep-grads": (("--optimizer", "sgd-momentum", "--zero-grad", "keep"), ("--warmup", "2")),
        # two optimizers, one of the script's own class; profiled from the first step, so the
        # optimizers make their state inside the trace
        "own+sgd": (("--optimizer", "own+sgd"), ("--warmup", "0")),
    }.items()
}


# The example trainer with gradient accumulation (two micro-batches per optimizer step), 2 blocks of
# dim 64 (parameters large enough beside the activations for the memory predictions), steps 2-4 profiled (test_grad_accum_cpu.py; test_whatif_memory_cpu.py also records FSDP2
# under other settings, ``extra``, to hold the memory predictions to).
GRAD_ACCUM_MODEL = ("--layers", "2", "--dim", "64", "--steps", "5", "--seed", "0", "--grad-accum", "2")


def grad_accum_config(framework: str, *extra: str) -> Config:
    """The grad-accumulation recording of ``framework`` with the trainer's ``extra`` flags."""
    name = "-".join(["grad-accum", framework, *(a.lstrip("-") for a in extra)])
    return Config(("--framework", framework, "--wrap", "block", *GRAD_ACCUM_MODEL, *extra),
                  (*NO_OUTPUT, "--warmup", "1", "--steps", "3"), ZERO3_ENV if framework == "zero3" else (),
                  committed=name)


# Gradient accumulation as training stacks run it: record_scripts/nested_moe_train.py (six blocks, the
# last two blocks' experts units inside them) with two micro-batches per optimizer step, the gradients
# reduced in the second only (FSDP2's set_requires_gradient_sync(False), FSDP1's no_sync()); one step
# profiled, which keeps each trace file small (test_whatif_no_sync.py).
NO_SYNC_RUNS = {
    framework: Config(("--framework", framework, "--micro-batches", "2", "--steps", "5"),
                      (*NO_OUTPUT, "--warmup", "1", "--steps", "1"), script=SCRIPTS / "nested_moe_train.py",
                      committed=f"nested-moe-no-sync-{framework}")
    for framework in ("fsdp2", "fsdp1")
}
# The same, FSDP2 keeping the units unsharded from the first micro-batch's backward into the second's
# forward (set_reshard_after_backward(False) beside the sync setting): the second forward gathers nothing.
NO_SYNC_KEPT_RUN = Config(("--framework", "fsdp2", "--micro-batches", "2", "--keep-unsharded-between-micro-batches",
                           "--steps", "5"), (*NO_OUTPUT, "--warmup", "1", "--steps", "1"),
                          script=SCRIPTS / "nested_moe_train.py", committed="nested-moe-no-sync-kept-fsdp2")


# The example trainer at dim 256 with four blocks, per block, in pairs and as one root unit: gloo stages
# each gather's transfer in buffers of the gather's size, made and freed before the unit's copy-out, and
# at this size they weigh beside the model's parameters, so where a merged unit copies out, and where
# the next unit's prefetch is issued, decide its peak. The peak steps open on the sharded parameters,
# the optimizer's state and the gradients, the same bytes in every process (FSDP2's collectives on CPU
# are synchronous: no buffer of theirs outlives a step), so peaks are compared whole
# (test_whatif_memory_cpu.py); test_whatif_cpu.py moves merged units' exposure from the per-block one.
WIDE = ("--framework", "fsdp2", "--layers", "4", "--dim", "256", "--seed", "0", "--steps", "10")
WIDE_RUNS = {wrap: Config((*WIDE, "--wrap", wrap), (*NO_OUTPUT, "--steps", "3"), committed=f"fsdp2-d256-{wrap}")
             for wrap in ("block", "pair", "root")}
