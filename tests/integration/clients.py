"""Training programs written the way users of other stacks write them, recorded with ``fsdpviz record``.

Each :class:`Client` is one program of ``tests/clients/`` with its launcher: a Hugging Face ``Trainer``
(DDP, as accelerate runs it without GPUs, and FSDP2 with accelerate's state forced, its embeddings apart
and tied), an ``accelerate
launch`` loop (DDP, and processes that never connect), Lightning Fabric with ``ModelParallelStrategy``, an
``mp.spawn`` program, a torchtitan-shaped model (also with every block compiled) and FSDP1 with
``checkpoint_wrapper`` outside and inside its units. Tiny models from configs, a few steps each.

A client is recorded once per test session (:class:`ClientRuns`, the ``client_runs`` fixture), shared by
every xdist worker, and run once without fsdpviz for the losses it must reproduce bit for bit.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from helpers.jobs import REPO, fsdpviz, record_env, retried, run_job, teardown_crash, torchrun, unused_port
from helpers.once import shared_processes

CLIENTS = REPO / "tests" / "clients"
STEPS = 6  # optimizer steps; fsdpviz profiles 2-4 (--warmup 2: the clients are slow to start, 6 steps do)
PROFILED = [2, 3, 4]
ACCELERATE = [sys.executable, "-m", "accelerate.commands.launch"]
RUN_TIMEOUT_S = 300  # a client trains in well under a minute; longer is a hang
# the clients run as their users write them (no pause before exit): PyTorch's abort at exit is more
# frequent than in the test scripts (the HF Trainer's bare DDP run: 3 of 10, docs/testing.md)
CLIENT_TRIES = 5


@dataclass(frozen=True)
class Client:
    """One program and how it is launched; ``{losses}`` / ``{port}`` / ``{out}`` are filled per run."""

    name: str
    command: tuple[str, ...]
    framework: str
    units: tuple[str, ...] | None  # the units it wraps, by construction (None: read off FSDP2's own labels)
    ranks: int = 2
    compare_losses: bool = True
    report: bool = False  # also write report.html (fsdpviz record's default), checked for a few clients
    losses_per_step: int = 1  # the losses it logs an optimizer step (one a micro-batch)

    def argv(self, losses: str, out: Path) -> list[str]:
        port = str(unused_port())
        return [w.replace("{losses}", losses).replace("{port}", port).replace("{out}", str(out))
                for w in self.command]


def _torchrun(script: str, *args: str) -> tuple[str, ...]:
    return tuple(torchrun(CLIENTS / script, *args, "--log-losses", "{losses}"))


TORCHTITAN_UNITS = ("(root)", "layers.0", "layers.1", "layers.2", "[norm, output]")
FSDP1_UNITS = ("(root)", "blocks.0", "blocks.1")
CLIENT_LIST = (
    Client("hf-trainer-ddp", _torchrun("hf_trainer.py", "--steps", str(STEPS), "--out", "{out}"), "ddp", ()),
    Client("hf-trainer-fsdp", _torchrun("hf_trainer.py", "--steps", str(STEPS), "--out", "{out}", "--force-fsdp"),
           "fsdp2", None, report=True),
    # tied input and output embeddings: accelerate shards (final norm, embedding, output) as one unit, in that
    # order, where FSDP2's labels name its modules in the model's order
    Client("hf-trainer-fsdp-tied", _torchrun("hf_trainer.py", "--steps", str(STEPS), "--out", "{out}", "--force-fsdp",
                                             "--tie-embeddings"), "fsdp2", None),
    Client("accelerate-ddp", (*ACCELERATE, "--num_processes", "2", "--main_process_port", "{port}", "--use_fsdp",
                              "--fsdp_version", "2", "--fsdp_transformer_layer_cls_to_wrap", "Block",
                              str(CLIENTS / "accelerate_loop.py"), "--steps", str(STEPS), "--log-losses", "{losses}"),
           "ddp", ()),
    Client("accelerate-unconnected", (*ACCELERATE, "--multi_gpu", "--num_processes", "2", "--main_process_port",
                                      "{port}", str(CLIENTS / "accelerate_loop.py"), "--no-cpu", "--steps",
                                      str(STEPS), "--log-losses", "{losses}"),
           "unknown", (), compare_losses=False),
    Client("fabric-fsdp2", (sys.executable, str(CLIENTS / "fabric_fsdp2.py"), "--devices", "2", "--steps", str(STEPS),
                            "--log-losses", "{losses}"), "fsdp2", ("(root)", "blocks.0", "blocks.1")),
    # automatic optimization: the training step's forward and backward run in optimizer.step(closure)
    Client("lightning-trainer", (sys.executable, str(CLIENTS / "lightning_trainer.py"), "--devices", "2", "--steps",
                                 str(STEPS), "--log-losses", "{losses}"), "fsdp2", ("(root)", "blocks.0", "blocks.1")),
    # two micro-batches a step: the first's closure runs outside the optimizer's step, the second's inside
    Client("lightning-trainer-accum", (sys.executable, str(CLIENTS / "lightning_trainer.py"), "--devices", "2",
                                       "--steps", str(STEPS), "--accumulate", "2", "--log-losses", "{losses}"),
           "fsdp2", ("(root)", "blocks.0", "blocks.1"), losses_per_step=2),
    Client("mp-spawn", (sys.executable, str(CLIENTS / "mp_spawn.py"), "--port", "{port}", "--steps", str(STEPS),
                        "--log-losses", "{losses}"), "fsdp2", ("(root)", "1", "2")),
    Client("torchtitan", _torchrun("torchtitan_shape.py", "--steps", str(STEPS)), "fsdp2", TORCHTITAN_UNITS,
           report=True),
    # every block compiled before sharding, as torchtitan does; aot_eager: dynamo and AOTAutograd's graphs
    # as with inductor, without the C++ code generation that costs inductor ~35 CPU-seconds more here
    Client("torchtitan-compile", _torchrun("torchtitan_shape.py", "--compile", "aot_eager", "--steps", str(STEPS)),
           "fsdp2", TORCHTITAN_UNITS),
    Client("fsdp1-checkpoint-outside", _torchrun("fsdp1_checkpoint.py", "--checkpoint", "outside", "--steps", str(STEPS)),
           "fsdp1", FSDP1_UNITS),
    Client("fsdp1-checkpoint-inside", _torchrun("fsdp1_checkpoint.py", "--checkpoint", "inside", "--steps", str(STEPS)),
           "fsdp1", FSDP1_UNITS),
)
CLIENTS_BY_NAME = {c.name: c for c in CLIENT_LIST}


@dataclass(frozen=True)
class ClientRun:
    """A client recorded by ``fsdpviz record`` and run bare: exit codes, output, losses per rank."""

    client: Client
    run_dir: Path
    proc: subprocess.CompletedProcess
    bare: subprocess.CompletedProcess | None
    losses: dict[int, list[str]] = field(default_factory=dict)  # recorded run
    bare_losses: dict[int, list[str]] = field(default_factory=dict)


def _losses(template: str, ranks: int) -> dict[int, list[str]]:
    out = {}
    for rank in range(ranks):
        path = Path(template.format(rank=rank))
        out[rank] = path.read_text().splitlines() if path.is_file() else []
    return out


def _clear_losses(template: str, ranks: int) -> None:
    for rank in range(ranks):
        Path(template.format(rank=rank)).unlink(missing_ok=True)


def _hung_after_training(done: subprocess.CompletedProcess, template: str, ranks: int) -> bool:
    """Killed at its time limit although every rank had written its losses: the job hung on its way
    out. PyTorch's ~ProcessGroupGloo can wait forever for the GIL that the thread destroying it holds
    (a DDP reducer dropped at interpreter exit; seen in bare runs without fsdpviz too): worth a retry."""
    return done.returncode == -9 and all(len(v) > 0 for v in _losses(template, ranks).values())


def _trained(template: str, ranks: int) -> Callable[[], bool]:
    """Whether every rank has written the loss of its last step: after that a run that does not
    exit within a minute (fsdpviz's summary and report included) hung on its way out."""
    return lambda: all(len(v) >= STEPS for v in _losses(template, ranks).values())


def _worth_retry(losses: str, ranks: int) -> Callable[[subprocess.CompletedProcess], bool]:
    """PyTorch's abort at exit (helpers.jobs.TEARDOWN_CRASH) or its hang on the way out."""
    return lambda done: teardown_crash(done) or _hung_after_training(done, losses, ranks)


def _run(argv: list[str], cwd: Path, losses: str, ranks: int) -> subprocess.CompletedProcess:
    def attempt() -> subprocess.CompletedProcess:
        _clear_losses(losses, ranks)
        return run_job(argv, cwd=cwd, timeout=RUN_TIMEOUT_S, finished=_trained(losses, ranks))

    return retried(attempt, again=_worth_retry(losses, ranks), tries=CLIENT_TRIES)


class ClientRuns:
    """Each client recorded (and run bare) once per session, in its own folder under ``base``,
    whichever xdist worker asks first (``helpers/once.py``)."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.done: dict[str, ClientRun] = {}

    def get(self, name: str) -> ClientRun:
        if name not in self.done:
            client = CLIENTS_BY_NAME[name]
            folder = self.base / name
            run_dir = folder / "run"
            losses, bare_losses = str(folder / "losses-{rank}.txt"), str(folder / "bare-{rank}.txt")
            outputs = () if client.report else ("--no-report",)

            def attempt() -> subprocess.CompletedProcess:
                _clear_losses(losses, client.ranks)
                return fsdpviz("record", "--out", str(run_dir), "--warmup", str(PROFILED[0]), "--steps", str(len(PROFILED)),
                               *outputs, "--",
                               *client.argv(losses, folder / "trainer-out"), env=record_env(), timeout=RUN_TIMEOUT_S,
                               finished=_trained(losses, client.ranks))

            def make() -> dict[str, subprocess.CompletedProcess | None]:
                proc = retried(attempt, again=_worth_retry(losses, client.ranks), tries=CLIENT_TRIES,
                               tidy=lambda: shutil.rmtree(run_dir, ignore_errors=True))
                bare = None
                if client.compare_losses:
                    bare = _run(client.argv(bare_losses, folder / "bare-out"), folder, bare_losses, client.ranks)
                return {"proc": proc, "bare": bare}

            made = shared_processes(folder, make)
            proc = made["proc"]
            assert proc is not None
            self.done[name] = ClientRun(client, run_dir, proc, made["bare"],
                                        _losses(losses, client.ranks), _losses(bare_losses, client.ranks))
        return self.done[name]
