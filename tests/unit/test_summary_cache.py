"""The completed summary kept in the run folder's cache (fsdpviz/cache.py): the second ``summary`` of
the same inputs and code is a read of what the first printed, and anything it depends on changing
makes it compute again.

That a warm summary does not run the analysis is shown without looking inside: the trace files are
overwritten with zeros of the same size and their modification times put back, so the key (sizes and
times, as the parse cache keys its entries) is unchanged while any analysis of them fails -- and the
entry's file keeps its modification time.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from fsdpviz.cache import CachedSummary, SummaryKey, SummaryStore, code_version, store_for, user_cache_dir
from fsdpviz.cli import main

REPO = Path(__file__).resolve().parents[2]
SAMPLE = REPO / "sample_traces" / "fsdp2-cpu-2rank"


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    out, err = capsys.readouterr()
    return int(exc.value.code or 0), out, err


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    """A writable copy of the bundled FSDP2 sample, without any cache."""
    run = tmp_path / "run"
    shutil.copytree(SAMPLE, run, ignore=shutil.ignore_patterns(".fsdpviz-cache", "report.html"))
    return run


@pytest.fixture(autouse=True)
def _user_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The summary cache on (the suite turns it off elsewhere, tests/conftest.py), and the user's cache
    folder of these tests: their own, empty."""
    monkeypatch.delenv("FSDPVIZ_NO_SUMMARY_CACHE", raising=False)
    home = tmp_path / "user-cache"
    monkeypatch.setenv("FSDPVIZ_CACHE_HOME", str(home))
    return home


def _entries(folder: Path) -> list[Path]:
    return sorted(folder.glob("summary.*.msgpack")) if folder.is_dir() else []


def _poison_traces(run: Path) -> None:
    """Zeros in place of every trace, same sizes and modification times: unreadable, same key."""
    for trace in sorted((run / "traces").glob("*.json.gz")):
        st = trace.stat()
        trace.write_bytes(b"\0" * st.st_size)
        os.utime(trace, ns=(st.st_atime_ns, st.st_mtime_ns))


def test_a_second_summary_is_a_read_of_the_first(run_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, first, _ = _run(["summary", "--json", str(run_dir)], capsys)
    assert code == 0
    [entry] = _entries(run_dir / ".fsdpviz-cache")
    written = entry.stat().st_mtime_ns
    _poison_traces(run_dir)
    shutil.rmtree(run_dir / "traces" / ".fsdpviz-cache")  # nor can the parse cache answer
    code, second, err = _run(["summary", "--json", str(run_dir)], capsys)
    assert (code, err) == (0, "") and second == first
    assert json.loads(second)["run_dir"] == str(run_dir)
    assert _entries(run_dir / ".fsdpviz-cache") == [entry] and entry.stat().st_mtime_ns == written
    # the same command without the cache runs the analysis, on traces that cannot be read any more
    code, _, err = _run(["summary", "--json", "--no-cache", str(run_dir)], capsys)
    assert code == 2 and "error:" in err


def test_the_cached_tables_are_the_computed_ones(run_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The terminal form, read back as the typed summary (notes with their codes), prints the same."""
    code, computed, _ = _run(["summary", str(run_dir)], capsys)
    assert code == 0
    _poison_traces(run_dir)
    code, cached, err = _run(["summary", str(run_dir)], capsys)
    assert (code, err) == (0, "") and cached == computed and "per FSDP unit" in cached
    read = SummaryStore(_key(run_dir)).read()
    assert isinstance(read, CachedSummary)
    assert [n.code for n in read.summary.notes] and all(n.code for n in read.summary.notes)
    assert json.loads(read.json_text) == read.summary.to_json()


def _key(run: Path, steps: list[int] | None = None) -> SummaryKey:
    key = SummaryKey.of([run], steps=steps, include_last_step=False)
    assert key is not None
    return key


def test_a_changed_source_or_option_is_computed_again(run_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, first, _ = _run(["summary", "--json", str(run_dir)], capsys)
    [old] = _entries(run_dir / ".fsdpviz-cache")
    # a timer file rewritten (a new modification time): a new entry replaces the old one
    timers = min((run_dir / "timers").glob("*.jsonl"))
    st = timers.stat()
    os.utime(timers, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    code, again, _ = _run(["summary", "--json", str(run_dir)], capsys)
    [new] = _entries(run_dir / ".fsdpviz-cache")
    assert code == 0 and new != old and again == first
    # another option is another summary, kept beside it
    steps = json.loads(first)["steps"][:1]
    code, one_step, _ = _run(["summary", "--json", "--steps", str(steps[0]), str(run_dir)], capsys)
    assert code == 0 and json.loads(one_step)["steps"] == steps
    assert len(_entries(run_dir / ".fsdpviz-cache")) == 2
    # an edited trace (here: zeros, with a new time) is read again, and found unreadable
    _poison_traces(run_dir)
    trace = min((run_dir / "traces").glob("*.json.gz"))
    st = trace.stat()
    os.utime(trace, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    code, _, err = _run(["summary", "--json", str(run_dir)], capsys)
    assert code == 2 and "error:" in err


def test_another_version_of_the_code_computes_again(run_dir: Path, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """A copy of the package with one comment added: its code digest differs, so it writes its own
    entry (replacing this code's) and prints the same."""
    package = tmp_path / "code"
    # with its bytecode: each .pyc names its source's size and modification time, which the copy keeps,
    # so the copy's process compiles only the module edited (the digest reads the .py files alone)
    shutil.copytree(REPO / "fsdpviz", package / "fsdpviz")
    # this code's entry, written here: the copy before its edit is this code (the digest is of the
    # sources' paths within the package and their bytes, not of where the package lies)
    code, first, _ = _run(["summary", "--json", str(run_dir)], capsys)
    assert code == 0
    [entry] = _entries(run_dir / ".fsdpviz-cache")
    with (package / "fsdpviz" / "formatting.py").open("a") as fh:
        fh.write("# an edit\n")
    env = dict(os.environ, PYTHONPATH=str(package))
    argv = [sys.executable, "-m", "fsdpviz", "summary", "--json", str(run_dir)]
    # cwd: `python -m` puts the working folder first on the path, before PYTHONPATH
    again = subprocess.run(argv, env=env, cwd=tmp_path, capture_output=True, text=True, check=True).stdout
    [other] = _entries(run_dir / ".fsdpviz-cache")
    assert other != entry and again == first
    probe = "from fsdpviz.cache import code_version; print(code_version())"
    edited = subprocess.run([sys.executable, "-c", probe], env=env, cwd=tmp_path, capture_output=True, text=True,
                            check=True)
    assert edited.stdout.strip() != code_version()


def test_a_read_only_run_folder_is_cached_in_the_users_folder(run_dir: Path, _user_cache: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    """No write bit on the run folder (a shared dataset; root too could write there): the entry goes to
    the user's cache folder and the run folder stays as it was."""
    mode = run_dir.stat().st_mode
    run_dir.chmod(0o555)
    try:
        code, first, _ = _run(["summary", "--json", str(run_dir)], capsys)
        assert code == 0 and not (run_dir / ".fsdpviz-cache").exists()
        [entry] = _entries(_user_cache)
        _poison_traces(run_dir)
        code, second, err = _run(["summary", "--json", str(run_dir)], capsys)
        assert (code, err) == (0, "") and second == first and _entries(_user_cache) == [entry]
    finally:
        run_dir.chmod(mode)


def test_no_cache_reads_and_writes_nothing(run_dir: Path, capsys: pytest.CaptureFixture[str],
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    code, _, _ = _run(["summary", "--json", "--no-cache", str(run_dir)], capsys)
    assert code == 0 and not _entries(run_dir / ".fsdpviz-cache")
    monkeypatch.setenv("FSDPVIZ_NO_CACHE", "1")
    assert store_for([run_dir]) is None
    code, _, _ = _run(["summary", "--json", str(run_dir)], capsys)
    assert code == 0 and not _entries(run_dir / ".fsdpviz-cache")
    monkeypatch.setenv("FSDPVIZ_NO_CACHE", "0")
    monkeypatch.setenv("FSDPVIZ_NO_SUMMARY_CACHE", "1")
    assert store_for([run_dir]) is None


def test_a_report_keeps_the_summary_that_summary_then_reads(run_dir: Path, tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    """``report`` computes the completed summary for its page and keeps it; ``summary`` after it is a
    read, equal to a summary computed without any cache."""
    code, computed, _ = _run(["summary", "--json", "--no-cache", str(run_dir)], capsys)
    assert code == 0 and not _entries(run_dir / ".fsdpviz-cache")
    code, _, _ = _run(["report", "-q", "-o", str(tmp_path / "page.html"), str(run_dir)], capsys)
    assert code == 0
    [entry] = _entries(run_dir / ".fsdpviz-cache")
    written = entry.stat().st_mtime_ns
    _poison_traces(run_dir)
    shutil.rmtree(run_dir / "traces" / ".fsdpviz-cache")
    code, read, _ = _run(["summary", "--json", str(run_dir)], capsys)
    assert code == 0 and read == computed and entry.stat().st_mtime_ns == written


def test_the_notebook_reads_and_keeps_the_same_summary(run_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import fsdpviz

    opened = fsdpviz.open(run_dir)
    first = opened.summary.to_json()  # computed, and kept
    [entry] = _entries(run_dir / ".fsdpviz-cache")
    written = entry.stat().st_mtime_ns
    code, printed, _ = _run(["summary", "--json", str(run_dir)], capsys)
    assert code == 0 and json.loads(printed) == first and entry.stat().st_mtime_ns == written
    again = fsdpviz.open(run_dir)
    assert again.summary.to_json() == first and entry.stat().st_mtime_ns == written
    assert again.summary == opened.summary  # the typed struct, notes and actions included


def test_the_users_cache_folder_follows_xdg(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FSDPVIZ_CACHE_HOME")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert user_cache_dir() == tmp_path / "xdg" / "fsdpviz"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert user_cache_dir() == Path.home() / ".cache" / "fsdpviz"
