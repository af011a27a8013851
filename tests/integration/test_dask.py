"""``--scheduler``: the ranks parsed on a real Dask cluster (a scheduler and two worker processes on
127.0.0.1), against the same commands run locally.

References: the local run's own ``summary --json`` (the cluster must give the same bytes, whether the
workers send each rank's digest or its whole tables, and so must the run loaded whole), a worker
killed while it parses (Dask gives its task to the other worker: the same answer, no hang), and a
port nothing listens on (one ``error:`` line within seconds).

One cluster serves the module (its tests stay in one xdist worker: ``tests/conftest.py``); the
commands whose answers are compared run in this process (``fsdpviz.cli.main``), each run's local answer
once for the module, the one whose worker is killed in a process of its own.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers.jobs import fsdpviz, unused_port
from synth import Scenario, generate_run, make_root, make_units

from fsdpviz.cli import main

pytest.importorskip("distributed", reason="the Dask tests need distributed (a test dependency: pip install -e '.[dev]')")

DASK = [sys.executable, "-m", "distributed.cli.dask_scheduler"]
WORKER = [sys.executable, "-m", "distributed.cli.dask_worker"]


class Cluster:
    def __init__(self, address: str, scheduler: subprocess.Popen, workers: list[subprocess.Popen]) -> None:
        self.address, self.scheduler, self.workers = address, scheduler, workers


def _start(argv: list[str], log: Path) -> subprocess.Popen:
    return subprocess.Popen(argv, stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True,
                            env=dict(os.environ, OMP_NUM_THREADS="1"))


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    from distributed import Client

    logs = tmp_path_factory.mktemp("dask-logs")
    port = unused_port()
    address = f"tcp://127.0.0.1:{port}"
    scheduler = _start([*DASK, "--host", "127.0.0.1", "--port", str(port), "--no-dashboard"], logs / "scheduler.log")
    workers = [_start([*WORKER, address, "--nthreads", "1", "--no-dashboard", "--name", f"w{i}",
                       "--death-timeout", "60"], logs / f"worker{i}.log") for i in range(2)]
    try:
        with Client(address, timeout=30, set_as_default=False) as client:
            client.wait_for_workers(2, timeout=60)
        yield Cluster(address, scheduler, workers)
    finally:
        for proc in [*workers, scheduler]:
            _stop(proc)


def _run_folder(tmp_path_factory: pytest.TempPathFactory, world_size: int) -> Path:
    """The tests' job (6 units, steps 3-5) on ``world_size`` ranks, as a run folder."""
    sc = Scenario(units=make_units(6, numel=2_000_000), root=make_root(), world_size=world_size, steps=(3, 4, 5),
                  kernels_per_unit=24, shared_timeline=True)
    return generate_run(sc, tmp_path_factory.mktemp(f"dask-run-{world_size}"), run_folder=True).folder


@pytest.fixture(scope="module")
def run_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """8 ranks, analysed rank by rank (FSDPVIZ_KEEP_EVENTS=0 in the tests below: the run is small
    enough to be loaded whole by default), so each rank is analysed on the worker that parses it and
    only its digest travels; four ranks to a worker, so that one can be killed while it parses."""
    return _run_folder(tmp_path_factory, 8)


@pytest.fixture(scope="module")
def small_run_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same job on 4 ranks, for the answers held to the local one: two ranks to a worker, so ranks
    still come back from both workers, in any order, to be put back in rank order, while its summaries
    and its report cost less than half the 8-rank run's (the report draws every rank's spans)."""
    return _run_folder(tmp_path_factory, 4)


RANK_BY_RANK = dict(os.environ, FSDPVIZ_KEEP_EVENTS="0")


def _here(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, *argv: str,
          keep_events: str = "0", scheduler_env: str | None = None) -> str:
    """``fsdpviz ARGV`` in this process (exit code 0: what it printed), with ``FSDPVIZ_KEEP_EVENTS``
    and ``FSDPVIZ_SCHEDULER`` as given."""
    monkeypatch.setenv("FSDPVIZ_KEEP_EVENTS", keep_events)
    if scheduler_env is None:
        monkeypatch.delenv("FSDPVIZ_SCHEDULER", raising=False)
    else:
        monkeypatch.setenv("FSDPVIZ_SCHEDULER", scheduler_env)
    capsys.readouterr()
    with pytest.raises(SystemExit) as done:
        main(list(argv))
    out, err = capsys.readouterr()
    assert done.value.code in (0, None), err[-2000:]
    return str(out)


def _json_here(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, *argv: str,
               keep_events: str = "0", scheduler_env: str | None = None) -> dict:
    """The ``--json`` answer of ``fsdpviz ARGV`` in this process (see :func:`_here`)."""
    return dict(json.loads(_here(capsys, monkeypatch, *argv, keep_events=keep_events, scheduler_env=scheduler_env)))


@pytest.fixture(scope="module")
def answers() -> dict[str, dict]:
    """Answers computed once for the module, by run folder."""
    return {}


def _local(folder: Path, answers: dict[str, dict], capsys: pytest.CaptureFixture[str],
           monkeypatch: pytest.MonkeyPatch) -> dict:
    """The run's ``summary --json`` parsed here, rank by rank, without a cluster (once for the module)."""
    if str(folder) not in answers:
        answers[str(folder)] = _json_here(capsys, monkeypatch, "summary", "--json", "--no-cache", str(folder))
    return answers[str(folder)]


@pytest.fixture
def local_answer(run_folder: Path, answers: dict[str, dict], capsys: pytest.CaptureFixture[str],
                 monkeypatch: pytest.MonkeyPatch) -> dict:
    """The 8-rank run's local answer (see :func:`_local`)."""
    return _local(run_folder, answers, capsys, monkeypatch)


@pytest.fixture
def small_local_answer(small_run_folder: Path, answers: dict[str, dict], capsys: pytest.CaptureFixture[str],
                       monkeypatch: pytest.MonkeyPatch) -> dict:
    """The 4-rank run's local answer (see :func:`_local`)."""
    return _local(small_run_folder, answers, capsys, monkeypatch)


@pytest.mark.slow
def test_the_cluster_gives_the_local_answer(cluster: Cluster, small_run_folder: Path, small_local_answer: dict,
                                            tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    folder, local = str(small_run_folder), small_local_answer
    summary = ("summary", "--json", "--no-cache")
    assert _json_here(capsys, monkeypatch, *summary, "--scheduler", cluster.address, folder) == local
    # the same as the run loaded whole, here or parsed on the cluster and sent back whole
    assert _json_here(capsys, monkeypatch, *summary, folder, keep_events="1") == local
    assert _json_here(capsys, monkeypatch, *summary, "--scheduler", cluster.address, folder, keep_events="1") == local
    # the environment variable does the same, for every command
    assert _json_here(capsys, monkeypatch, *summary, folder, scheduler_env=cluster.address) == local
    page = tmp_path / "report.html"
    _here(capsys, monkeypatch, "report", "--no-cache", "--scheduler", cluster.address, "-o", str(page), folder)
    assert page.stat().st_size > 100_000


@pytest.mark.slow
def test_a_killed_worker_costs_a_retry_not_the_job(cluster: Cluster, run_folder: Path, local_answer: dict) -> None:
    from distributed import Client

    local = local_answer
    job = subprocess.Popen([sys.executable, "-m", "fsdpviz", "summary", "--json", "--no-cache", "--scheduler",
                            cluster.address, str(run_folder)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True, env=RANK_BY_RANK)
    victim = cluster.workers[0]
    killed = False
    with Client(cluster.address, timeout=30, set_as_default=False) as client:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and job.poll() is None and not killed:
            busy = {addr: tasks for addr, tasks in client.processing().items() if tasks}
            names = {addr: info.get("name") for addr, info in client.scheduler_info()["workers"].items()}
            if any(names.get(addr) == "w0" for addr in busy):
                _stop(victim)  # in the middle of parsing a rank
                killed = True
            time.sleep(0.02)
    out, err = job.communicate(timeout=300)
    assert killed, "the job ended before a worker could be killed"
    assert job.returncode == 0, err[-2000:]
    assert json.loads(out) == local


@pytest.mark.slow
def test_an_unreachable_scheduler_is_one_error_line(run_folder: Path) -> None:
    started = time.monotonic()
    proc = fsdpviz("summary", "--scheduler", f"tcp://127.0.0.1:{unused_port()}", str(run_folder), timeout=60)
    assert proc.returncode == 2
    assert time.monotonic() - started < 20
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: --scheduler tcp://127.0.0.1:")
    assert "cannot reach the Dask scheduler" in lines[0]
