"""Starting real jobs in tests: two CPU ranks under torchrun, ``python -m fsdpviz``, the
environment they run in, a port for jobs that must meet, and PyTorch's known abort at exit.

Jobs are started with ``python -m torch.distributed.run --standalone``: the rendezvous binds a port
the kernel picks, so jobs started back to back never race for a port chosen in advance. Tests that
need a fixed port (several "nodes" that must meet) take it from :func:`unused_port`.
"""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "train.py"
NO_OUTPUT = ("--no-report", "--no-summary")

# PyTorch on gloo now and then aborts a rank at interpreter exit, after training and
# destroy_process_group, with no Python code left running: seen with FSDP1, FSDP2 on an HSDP mesh and
# the HF Trainer, recorded or not (how often and why: docs/testing.md).
TEARDOWN_CRASH = "terminate called without an active exception"
TRIES = 3  # attempts of a job that fails only by that abort


def torchrun(script: Path, *args: str, nproc: int = 2) -> list[str]:
    """``nproc`` (two) CPU ranks of ``script`` on one machine (a rendezvous port of their own)."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc), str(script),
            *args]


def deepspeed_launch(script: Path, *args: str, nproc: int = 2) -> list[str]:
    """``deepspeed --num_gpus NPROC script ARGS``: DeepSpeed's own launcher starts the ranks (with its
    CPU accelerator, ``DS_ACCELERATOR=cpu``, two CPU processes) and passes them ``--local_rank``."""
    return [sys.executable, "-m", "deepspeed.launcher.runner", "--num_gpus", str(nproc), str(script), *args]


def record_env(**extra: str) -> dict[str, str]:
    """The test process's environment for a job: one OpenMP thread per rank (two ranks share two
    cores), no run folder inherited from an outer ``fsdpviz record``."""
    env = dict(os.environ, OMP_NUM_THREADS="1", **extra)
    env.pop("FSDPVIZ_RUN_DIR", None)
    return env


# Every process a job starts inherits this variable with the job's own value: how a timed-out job's
# processes are all found, even those in sessions of their own (torchrun starts each worker with
# start_new_session) or orphaned when their launcher died first.
JOB_MARKER = "FSDPVIZ_TEST_JOB"


def _marked(marker: str) -> list[int]:
    """The pids whose environment holds ``JOB_MARKER=marker``."""
    needle = f"{JOB_MARKER}={marker}".encode()
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if needle in (entry / "environ").read_bytes().split(b"\0"):
                    pids.append(int(entry.name))
            except OSError:  # gone meanwhile, or not ours to read
                continue
    return pids


def run_job(argv: list[str], *, env: dict[str, str] | None = None, cwd: Path = REPO,
            timeout: float = 300, finished: Callable[[], bool] | None = None,
            grace: float = 60) -> subprocess.CompletedProcess:
    """Run ``argv`` to its end; after ``timeout`` seconds every process of the job is killed (the
    launcher, its workers, anything they started) and the result says so: exit code -9, what was
    printed so far, ``(killed after N s)`` on stderr. A hung job can never hold the suite.

    ``finished``: polled every second; once it says the job's work is done (e.g. every rank wrote
    its last loss), the job gets ``grace`` more seconds to exit, not the rest of ``timeout``."""
    marker = uuid.uuid4().hex
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=cwd,
                            env={**(env or record_env()), JOB_MARKER: marker}, start_new_session=True)
    started = time.monotonic()
    deadline = started + timeout
    try:
        while True:
            try:  # a TimeoutExpired here loses no output: communicate() resumes where it stopped
                out, err = proc.communicate(timeout=max(0.0, min(1.0, deadline - time.monotonic())))
                break
            except subprocess.TimeoutExpired:
                if time.monotonic() >= deadline:
                    raise
                if finished is not None and finished():
                    deadline = min(deadline, time.monotonic() + grace)
                    finished = None
    except subprocess.TimeoutExpired:
        timeout = time.monotonic() - started
        for pid in _marked(marker):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        out, err = proc.communicate()
        err += f"\n(killed after {timeout:.0f} s)"
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


def fsdpviz(*args: str, env: dict[str, str] | None = None, timeout: float = 300,
            finished: Callable[[], bool] | None = None) -> subprocess.CompletedProcess:
    """``python -m fsdpviz ARGS`` from the repository root (see :func:`run_job`)."""
    return run_job([sys.executable, "-m", "fsdpviz", *args], env=env, timeout=timeout, finished=finished)


def record_argv(run_dir: Path, command: list[str], *options: str) -> list[str]:
    """``fsdpviz record --out RUN_DIR OPTIONS -- COMMAND`` without report or summary unless OPTIONS ask."""
    return [sys.executable, "-m", "fsdpviz", "record", "--out", str(run_dir), *NO_OUTPUT, *options, "--", *command]


def teardown_crash(proc: subprocess.CompletedProcess) -> bool:
    """The job failed only by PyTorch's abort at exit (see TEARDOWN_CRASH): worth one more try."""
    return proc.returncode != 0 and TEARDOWN_CRASH in (proc.stderr or "")


def retried(attempt: Callable[[], subprocess.CompletedProcess], *,
            again: Callable[[subprocess.CompletedProcess], bool] = teardown_crash,
            tidy: Callable[[], None] = lambda: None, tries: int = TRIES) -> subprocess.CompletedProcess:
    """``attempt()`` until its result is not worth another try (``again``; by default PyTorch's abort
    at exit), at most ``tries`` times; ``tidy()`` before each retry removes what the failed attempt
    left (a run folder ``fsdpviz record`` would refuse to reuse). Returns the last result."""
    done = attempt()
    for _ in range(tries - 1):
        if not again(done):
            break
        tidy()
        done = attempt()
    return done


def unused_port() -> int:
    """A free TCP port below the kernel's ephemeral range, for jobs that must agree on a port.

    A port from ``bind(('', 0))`` lies in the ephemeral range, where the kernel may hand it to any
    outgoing connection (gloo opens many) before the job binds it again; a port below that range
    is only ever taken by an explicit bind.
    """
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    candidates = list(range(max(1025, low - 8000), low))
    random.shuffle(candidates)
    for port in candidates:
        with socket.socket() as sock:
            try:
                sock.bind(("", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free TCP port below the ephemeral range")
