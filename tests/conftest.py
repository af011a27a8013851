"""Shared fixtures: where the real GPU traces live, the repository root, results computed once per
session, tmpfs mounts, and an environment free of the user's ``FSDPVIZ_*`` settings."""

from __future__ import annotations

import gc
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Hashable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from fsdpviz.cache import NO_CACHE_ENV
from fsdpviz.record import options
from fsdpviz.record.launcher import ENV_MIN_FREE_MB
from fsdpviz.trace.dask_engine import ENV_SCHEDULER
from fsdpviz.trace.loader import KEEP_EVENTS_ENV

T = TypeVar("T")

REPO_ROOT = Path(__file__).resolve().parents[1]
# Real GPU traces (not part of this repository) live beside the checkout; see docs/testing.md.
GPU_REAL_DIR = REPO_ROOT.parent / "shared" / "traces" / "gpu-real"
# Real FSDP recordings on an H100 (fsdpviz run folders) with the truth of uninstrumented runs.
GPU_FSDP_DIR = REPO_ROOT.parent / "shared" / "traces" / "gpu-fsdp"
GPU_H200_DIR = REPO_ROOT.parent / "shared" / "traces" / "gpu-h200"
SAMPLE_TRACES_DIR = REPO_ROOT / "sample_traces"
# fsdpviz settings a user may have in the shell (FSDPVIZ_TEST_* are the suite's own): how a run is loaded
# (FSDPVIZ_KEEP_EVENTS: whole or rank by rank), the recorder's disk check and time-window fallback; a test
# that reads one sets it itself. The names are fsdpviz's own constants (none of these modules imports torch
# or pandas).
USER_SETTINGS = (NO_CACHE_ENV, options.ENV_RUN_DIR, options.ENV_OWNER_PID, ENV_SCHEDULER, KEEP_EVENTS_ENV,
                 ENV_MIN_FREE_MB, options.ENV_FALLBACK_AFTER_S, options.ENV_WINDOW_S)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The files that run real jobs or a browser (a test marked ``slow`` or ``browser``) first, each file's
    tests in their own order:
    under ``pytest -n N --dist loadfile`` (``make test``) a worker takes a whole file at a time, so the
    long files start while the short ones fill the gaps, instead of one long file running alone at the
    end of the session."""
    slow_files = {item.nodeid.split("::")[0] for item in items
                  if item.get_closest_marker("slow") or item.get_closest_marker("browser")}
    items.sort(key=lambda item: item.nodeid.split("::")[0] not in slow_files)


@pytest.fixture(scope="session")
def gpu_real_dir() -> Path:
    """The folder of real GPU traces; tests that need it skip with a reason when it is missing."""
    if not GPU_REAL_DIR.is_dir():
        pytest.skip(f"real GPU traces not found at {GPU_REAL_DIR}")
    return GPU_REAL_DIR


@pytest.fixture(scope="session")
def gpu_fsdp_dir() -> Path:
    """The folder of real FSDP recordings on an H100; tests that need it skip when it is missing."""
    if not GPU_FSDP_DIR.is_dir():
        pytest.skip(f"real FSDP GPU recordings not found at {GPU_FSDP_DIR}")
    return GPU_FSDP_DIR


@pytest.fixture(scope="session")
def gpu_h200_dir() -> Path:
    """Model B recorded on an H200 beside bare runs of the same machine; tests that need it skip when
    it is missing."""
    if not GPU_H200_DIR.is_dir():
        pytest.skip(f"H200 recordings not found at {GPU_H200_DIR}")
    return GPU_H200_DIR


@pytest.fixture(scope="session")
def gpu_fsdp_run(gpu_fsdp_dir: Path, session_memo: Callable[..., Any]) -> Callable[[str], Any]:
    """``gpu_fsdp_run(name)``: the pipeline's result for one of those recordings, once per session, on
    its clock as every view reads it (``whatif.gains.on_replay_split``: its bound the replay's split), so
    that no test's figures depend on whether another test of the session read the run's model first."""
    from fsdpviz.analysis.pipeline import analyse
    from fsdpviz.whatif.gains import on_replay_split

    return lambda name: session_memo(("gpu-fsdp", name),
                                     lambda: on_replay_split(analyse([gpu_fsdp_dir / name], cache=False)))


@pytest.fixture(scope="session")
def gpu_h200_run(gpu_h200_dir: Path, session_memo: Callable[..., Any]) -> Callable[[str], Any]:
    """``gpu_h200_run(name)``: the pipeline's result for one of the H200 recordings, as ``gpu_fsdp_run``."""
    from fsdpviz.analysis.pipeline import analyse
    from fsdpviz.whatif.gains import on_replay_split

    return lambda name: session_memo(("gpu-h200", name),
                                     lambda: on_replay_split(analyse([gpu_h200_dir / name], cache=False)))


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO_ROOT


@pytest.fixture(autouse=True)
def _no_user_fsdpviz_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    """The suite's answers must not depend on the shell it runs in (e.g. ``FSDPVIZ_NO_CACHE=1``)."""
    for name in USER_SETTINGS:
        monkeypatch.delenv(name, raising=False)


def pytest_configure(config: pytest.Config) -> None:
    # The session's shared fixtures (an analysed sample, a built report) are made before any test's
    # own fixtures run: the user's settings leave the whole session, not only each test.
    for name in USER_SETTINGS:
        os.environ.pop(name, None)
    # Summaries of read-only folders are kept in the user's cache folder (fsdpviz/cache.py): the
    # suite's go to a folder of its own, never the user's home (XDG_CACHE_HOME stays: other tools'
    # caches, pip's and Hugging Face's, live there).
    if not os.environ.get("FSDPVIZ_CACHE_HOME"):
        # made by the controller (its workers inherit it) and removed by it when the session ends
        os.environ["FSDPVIZ_CACHE_HOME"] = tempfile.mkdtemp(prefix="fsdpviz-test-cache-")
        config.stash[_MADE_CACHE_HOME] = Path(os.environ["FSDPVIZ_CACHE_HOME"])
    # ... and off for every test but its own (tests/unit/test_summary_cache.py): a test that holds two
    # views of a run to one answer (summary and the notebook, report and compare) computes both, rather
    # than one reading what the other kept.
    os.environ["FSDPVIZ_NO_SUMMARY_CACHE"] = "1"
    # The suite's analyses run as the command line's do, in a process fsdpviz owns (its tables' strings,
    # fsdpviz/trace/schema.py); tests/unit/test_string_storage.py checks a notebook's process apart.
    from fsdpviz.trace.schema import own_this_process

    own_this_process()
    # A worker holds a session's worth of analysed runs (the session memos, modules' fixtures; the GPU
    # recordings' what-if models are many small Python objects) beside torch's and pandas' modules, and
    # every analysis allocates millions of objects: at CPython's default thresholds (700, 10, 10; 3.10 to
    # 3.13) the collector ran 9,500 times in tests/unit/test_one_clock.py and test_whatif_honesty.py beside
    # the shared traces, 15 % of their CPU. Young collections about a seventieth as often, full ones far
    # rarer, free the same cycles: 3-18 % less CPU round by round, the peak memory 0-11 % higher
    # (benchmarks/bench_collector.py; docs/testing.md, 2026-12-06).
    gc.set_threshold(50_000, 20, 100)


SHARED_DIR = REPO_ROOT.parent / "shared"
_SHARED_CACHES = pytest.StashKey[dict[Path, int]]()
_MADE_CACHE_HOME = pytest.StashKey[Path]()


def _caches_in_shared() -> dict[Path, int]:
    """Every cache folder under ../shared and every file in one, with when it was last written."""
    if not SHARED_DIR.is_dir():
        return {}
    out = {}
    for folder in SHARED_DIR.rglob(".fsdpviz-cache"):
        for path in (folder, *folder.rglob("*")):
            try:
                out[path] = path.stat().st_mtime_ns
            except OSError:  # removed meanwhile
                pass
    return out


_OWN_CACHES = pytest.StashKey[set[Path]]()
# The checkout's own recordings, which tests analyse with the parse cache on (as a user's command
# does): the cache folders a session makes there are its own, removed when it ends.
CHECKOUT_RECORDINGS = (SAMPLE_TRACES_DIR, REPO_ROOT / "tests" / "recorded")


def _caches_in_checkout() -> set[Path]:
    return {folder for top in CHECKOUT_RECORDINGS if top.is_dir() for folder in top.rglob(".fsdpviz-cache")}


def pytest_sessionstart(session: pytest.Session) -> None:
    if not hasattr(session.config, "workerinput"):  # the controller, or a run without xdist
        session.config.stash[_SHARED_CACHES] = _caches_in_shared()
        session.config.stash[_OWN_CACHES] = _caches_in_checkout()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """The recordings beside the checkout (../shared) are read, never written: a test that analyses them
    passes ``cache=False`` (the command line: ``--no-cache``). A session in which a test made a parse or
    summary cache there, or wrote into one that was there, fails, naming what was written. The cache
    folders the session made in the checkout's own recordings are removed."""
    made = session.config.stash.get(_MADE_CACHE_HOME, None)
    if made is not None:
        shutil.rmtree(made, ignore_errors=True)
    own = session.config.stash.get(_OWN_CACHES, None)
    if own is not None:  # the controller, after its workers: the checkout left with the caches it had
        for folder in _caches_in_checkout() - own:
            shutil.rmtree(folder, ignore_errors=True)
    before = session.config.stash.get(_SHARED_CACHES, None)
    if before is None:
        return
    written = sorted(path for path, mtime in _caches_in_shared().items() if before.get(path) != mtime)
    if written:
        writer = session.config.get_terminal_writer()
        writer.line()
        writer.line("tests wrote caches into ../shared (pass cache=False or --no-cache): "
                    + ", ".join(str(p) for p in written[:5]) + (f" and {len(written) - 5} more" if len(written) > 5 else ""),
                    red=True)
        if session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.fixture(scope="session")
def session_memo() -> Callable[[Hashable, Callable[[], Any]], Any]:
    """``memo(key, make)``: ``make()`` computed once per test session (loaded traces, analyses of
    recordings); callers must not change what it returns."""
    store: dict[Hashable, Any] = {}

    def memo(key: Hashable, make: Callable[[], T]) -> T:
        if key not in store:
            store[key] = make()
        return store[key]  # type: ignore[no-any-return]

    return memo


@pytest.fixture(scope="session")
def sample_run(session_memo: Callable[..., Any]) -> Callable[[str], Any]:
    """``sample_run(name)``: the pipeline's result for ``sample_traces/NAME`` (without the Parquet
    cache), once per session; tests only read it."""
    from fsdpviz.analysis.pipeline import analyse

    return lambda name: session_memo(("sample-run", name),
                                     lambda: analyse([SAMPLE_TRACES_DIR / name], cache=False))


@pytest.fixture(scope="session")
def load_real(session_memo: Callable[..., Any]) -> Callable[[Path], Any]:
    """``load_real(path)``: a real GPU trace loaded without the Parquet cache, once per session."""
    from fsdpviz.trace import load_traces

    return lambda path: session_memo(("real-trace", path), lambda: load_traces([path], cache=False))


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Callable[..., Path]]:
    """``mount(name, size_kib, read_only=False)``; unmounted afterwards; skips without the right to mount."""
    mounted: list[Path] = []

    def mount(name: str, size_kib: int, read_only: bool = False) -> Path:
        point = tmp_path / name
        point.mkdir()
        options = f"size={size_kib}k" + (",ro" if read_only else "")
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(point)],
                              capture_output=True, text=True, check=False)
        if done.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here (needs root or CAP_SYS_ADMIN): {done.stderr.strip()}")
        mounted.append(point)
        return point

    yield mount
    for point in mounted:
        subprocess.run(["umount", "-l", str(point)], check=False)
