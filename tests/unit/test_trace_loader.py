"""The loader on hand-built inputs: ranks, clock, lanes, comm sizes, skipping, run folders, cache."""

from __future__ import annotations

import gzip
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.kineto import MAIN_TID, TraceBuilder

from fsdpviz.runfolder import RunInfo, UnitInfo, to_builtins
from fsdpviz.trace import load_traces, schema
from fsdpviz.trace.cache import CACHE_DIR
from fsdpviz.trace.kineto import rank_from_filename, us_to_ns

GEMM = "volta_sgemm_128x64_nn"


def _simple(rank: int | None = 0) -> TraceBuilder:
    b = TraceBuilder(rank=rank)
    b.step(1, 0, 1000).step(2, 1000, 1000)
    b.kernel(GEMM, 100, 100, launch_us=10)
    return b


@pytest.mark.parametrize(
    ("name", "rank"),
    [("rank3.trace.json.gz", 3), ("sampled_rank-1.json.gz", 1), ("trace_8_rank_12.json", 12),
     ("host.1700000000.pt.trace.json.gz", None), ("RANK7.json", 7)],
)
def test_rank_from_filename(name: str, rank: int | None) -> None:
    assert rank_from_filename(Path(name)) == rank


def test_rank_sources_in_order_of_trust(tmp_path: Path) -> None:
    _simple(rank=5).write(tmp_path / "rank2.json")  # distributedInfo wins over the name
    _simple(rank=None).write(tmp_path / "rank-3.json.gz")
    (tmp_path / "other").mkdir()
    _simple(rank=None).write(tmp_path / "other" / "worker.pt.trace.json.gz")
    traces = load_traces([tmp_path, tmp_path / "other"], cache=False)
    got = dict(zip(traces.ranks["rank"], traces.ranks["rank_source"]))
    assert got == {5: "distributedInfo", 3: "filename", 0: "default"}
    assert traces.rank_ids == [0, 3, 5]
    assert list(traces.events["rank"].unique()) == [0, 3, 5]  # concatenated in rank order
    for _, events in traces.events.groupby("rank"):
        assert events["start_ns"].is_monotonic_increasing


def test_clock_is_exact_integer_nanoseconds() -> None:
    import numpy as np

    # An epoch in µs (~1.7e15) times 1000 exceeds float64's exact integers; split parts stay exact.
    ts = np.array([1682725898236567.0, 4458676522690.655, 0.001, 12.5])
    assert us_to_ns(ts).tolist() == [1682725898236567000, 4458676522690655, 1, 12500]


def test_base_time_is_added_and_ranks_share_one_clock(tmp_path: Path) -> None:
    a = _simple(rank=0)
    a.base_time_ns = 1_700_000_000_000_000_000
    a.write(tmp_path / "rank0.json")
    b = _simple(rank=1)
    b.base_time_ns = 1_700_000_000_000_000_000 + 5_000_000  # started 5 ms later
    b.write(tmp_path / "rank1.json")
    traces = load_traces([tmp_path], cache=False)
    steps = traces.steps.set_index("rank")
    assert steps.loc[0, "start_ns"].iloc[0] == 1_700_000_000_000_000_000
    assert steps.loc[1, "start_ns"].iloc[0] - steps.loc[0, "start_ns"].iloc[0] == 5_000_000


def test_unknown_fields_phases_categories_and_bad_durations(tmp_path: Path) -> None:
    b = _simple()
    b.events.append({"ph": "X", "cat": "mystery_cat", "name": "x", "pid": 1000, "tid": 1000, "ts": 5, "dur": 1})
    b.events.append({"ph": "B", "name": "begin", "pid": 1000, "tid": 1000, "ts": 5})
    b.events.append({"ph": "X", "cat": "cpu_op", "name": "neg", "pid": 1000, "tid": 1000, "ts": 5, "dur": -3})
    b.events.append({"ph": "X", "cat": "cpu_op", "name": "nodur", "pid": 1000, "tid": 1000, "ts": 5})
    b.events.append({"ph": "X", "cat": "cpu_op", "name": "aten::ok", "pid": 1000, "tid": 1000, "ts": 5,
                     "dur": 2, "newField": {"deep": [1, 2]}, "args": {"Something new": [[1]], "External id": 9}})
    b.events.append({"ph": "X", "cat": "python_function", "name": "train.py(1)", "pid": 1000, "tid": 1000,
                     "ts": 5, "dur": 2})
    doc = b.document()
    doc["someNewTopLevelKey"] = {"x": 1}
    path = tmp_path / "rank0.json"
    path.write_text(json.dumps(doc))
    traces = load_traces([path], cache=False)
    assert int(traces.ranks["n_skipped"].iloc[0]) == 4  # mystery_cat, B, negative, missing dur
    names = set(traces.events["name"].astype(str))
    assert "aten::ok" in names and not {"neg", "nodur", "x", "train.py(1)"} & names


def test_oddly_typed_field_falls_back_without_losing_the_file(tmp_path: Path) -> None:
    b = _simple()
    b.events.append({"ph": "X", "cat": "cpu_op", "name": "weird", "pid": 1000, "tid": 1000, "ts": 5,
                     "dur": 1, "args": {"correlation": "not a number"}})
    traces = load_traces([b.write(tmp_path / "rank0.json")], cache=False)
    assert int(traces.ranks["n_skipped"].iloc[0]) == 1
    assert (traces.events["kind"] == "kernel").sum() == 1 and len(traces.steps) == 2


def test_lanes_from_thread_names_and_streams(tmp_path: Path) -> None:
    b = TraceBuilder(backend="gloo")
    b.thread(MAIN_TID, "pt_main_thread").thread(2001, "pt_gloo_runloop").thread(2002, "pt_gloo_runloop")
    b.thread(3001, "pt_main_thread").thread(3001, "pt_autograd_0").thread(4001, "python3")
    b.step(1, 0, 100)
    b.cpu_op("aten::mm", 1, 1).cpu_op("aten::mm", 1, 1, tid=3001).cpu_op("aten::add", 1, 1, tid=4001)
    b.annotation("gloo:all_gather", 1, 1, tid=2002, **{"Input Dims": [[256]], "Input type": ["c10::BFloat16"]})
    b.annotation("gloo:all_reduce", 1, 1, tid=2001, **{"Input Dims": [[100]], "Input type": ["float"]})
    b.kernel(GEMM, 5, 1, stream=7, launch_us=1).kernel(GEMM, 5, 1, stream=13, launch_us=2)
    traces = load_traces([b.write(tmp_path / "rank0.json")], cache=False)
    lanes = traces.lanes.set_index("lane")
    assert list(lanes.index) == ["main", "autograd", "gloo 0", "gloo 1", "thread 4001", "stream 7", "stream 13"]
    assert list(lanes["lane_kind"]) == ["cpu_main", "cpu_autograd", "cpu_gloo", "cpu_gloo", "cpu_other",
                                        "gpu_stream", "gpu_stream"]
    assert lanes.loc["autograd", "thread_name"] == "pt_main_thread / pt_autograd_0"
    ev = traces.events.set_index("name")
    # A gloo all-gather sees only its shard: bytes = shard x world size (2); bf16 = 2 bytes.
    assert ev.loc["gloo:all_gather", "comm_bytes"] == 256 * 2 * 2
    assert ev.loc["gloo:all_reduce", "comm_bytes"] == 100 * 4
    assert ev.loc["gloo:all_gather", "lane"] == "gloo 1"


def test_memory_samples_and_devices(tmp_path: Path) -> None:
    b = _simple()
    b.memory(50, allocated=1000, reserved=4096, delta=1000)
    b.memory(60, allocated=600, reserved=4096, delta=-400)
    b.memory(70, allocated=64, reserved=0, delta=64, device=-1)
    traces = load_traces([b.write(tmp_path / "rank0.json")], cache=False)
    mem = traces.memory
    assert mem["device"].tolist() == ["cuda:0", "cuda:0", "cpu"]
    assert mem["allocated_bytes"].tolist() == [1000, 600, 64]
    assert mem["delta_bytes"].tolist() == [1000, -400, 64]
    assert mem["t_ns"].tolist() == [50_000, 60_000, 70_000]


def test_run_folder_reads_run_json_timers_and_units(tmp_path: Path) -> None:
    run = tmp_path / "run"
    (run / "traces").mkdir(parents=True)
    (run / "timers").mkdir()
    for r in (0, 1):
        _simple(rank=r).write(run / "traces" / f"rank{r}.trace.json.gz")
    (run / "timers" / "rank0.jsonl").write_text(
        '{"rank": 0, "step": 1, "unit": "", "phase": "step", "kind": "wall", "ms": 12.5}\n'
        '{"rank": 0, "step": 1, "unit": "blocks.0", "phase": "forward", "kind": "compute", "ms": 1.25}\n'
        '{"rank": 0, "step": 2, "unit": "", "pha'  # torn last line: the recorder was killed mid-write
    )
    run_json = {"fsdpviz_version": "0.1.0", "format": 1, "world_size": 2, "framework": "fsdp2",
                "units": [{"unit": "blocks.0", "order": 0, "param_numel": 1024, "param_bytes": 4096,
                           "dtype": "float32", "parent": ""}]}
    (run / "run.json").write_text(json.dumps(run_json))
    (run / "report.html").write_text("<html></html>")
    traces = load_traces([run], cache=False)
    assert to_builtins(traces.run) == {**to_builtins(RunInfo()), **run_json,
                                       "units": [{**to_builtins(UnitInfo(unit="")), **run_json["units"][0]}]}
    assert traces.run_dir == str(run)
    assert traces.rank_ids == [0, 1]
    assert traces.timers["ms"].tolist() == [12.5, 1.25]
    # the torn line is left out, and said: a note of the summary and a warning of every command
    assert traces.torn_timers == [str(run / "timers" / "rank0.jsonl")]
    from fsdpviz.analysis.completeness import gap_notes, gap_warnings

    (said,) = [n for n in gap_notes(traces) if n.code == "torn_timers"]
    assert said.startswith(f"left out the last line of {run / 'timers' / 'rank0.jsonl'}: ")
    assert str(said) in gap_warnings(traces)
    assert list(traces.timers.dtypes.astype(str)) == list(schema.TIMERS.values())
    assert traces.units.iloc[0].to_dict() == {"unit": "blocks.0", "order": 0, "param_numel": 1024,
                                              "param_bytes": 4096, "framework": "fsdp2", "parent": "",
                                              "dtype": "float32", "size_source": "run.json"}


def test_run_folder_without_traces_is_an_error(tmp_path: Path) -> None:
    from fsdpviz.errors import RunFolderError

    (tmp_path / "run.json").write_text("{}")
    with pytest.raises(RunFolderError, match="run folder has no traces"):
        load_traces([tmp_path])


def test_tables_follow_the_schema(tmp_path: Path) -> None:
    traces = load_traces([_simple().write(tmp_path / "rank0.json")], cache=False)
    for table, sch in [(traces.events, schema.EVENTS), (traces.lanes, schema.LANES), (traces.steps, schema.STEPS),
                       (traces.memory, schema.MEMORY), (traces.ranks, schema.RANKS)]:
        assert list(table.columns) == list(sch)
        assert [str(t) for t in table.dtypes] == list(sch.values())


def test_cache_is_reused_invalidated_and_can_be_disabled(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _simple().write(tmp_path / "rank0.trace.json.gz")
    first = load_traces([path])
    entries = sorted(p.name for p in (tmp_path / CACHE_DIR).iterdir())
    assert len(entries) == 5 and all(e.endswith(".parquet") for e in entries)
    # A second load reads the cache: poison the source's content but keep size and mtime.
    stat = path.stat()
    data = path.read_bytes()
    path.write_bytes(b"\x00" * len(data))
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    again = load_traces([path])
    assert again.events.equals(first.events) and again.lanes.equals(first.lanes)
    # FSDPVIZ_NO_CACHE=1 ignores it and parses the (now broken) file.
    monkeypatch.setenv("FSDPVIZ_NO_CACHE", "1")
    from fsdpviz.errors import FsdpvizError

    with pytest.raises(FsdpvizError, match="not a JSON trace"):
        load_traces([path])
    monkeypatch.delenv("FSDPVIZ_NO_CACHE")
    # A changed file (new mtime) gets a new entry and the stale one is removed.
    b = _simple()
    b.kernel(GEMM, 300, 10, launch_us=20)
    b.write(path)
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    changed = load_traces([path])
    assert (changed.events["kind"] == "kernel").sum() == 2
    assert len(list((tmp_path / CACHE_DIR).iterdir())) == 5


def test_unwritable_cache_location_means_no_cache_not_an_error(tmp_path: Path) -> None:
    path = _simple().write(tmp_path / "rank0.json")
    blocker = tmp_path / CACHE_DIR
    blocker.write_text("a file where the cache folder would go")
    assert load_traces([path]).rank_ids == [0]
    assert load_traces([path]).rank_ids == [0]
    assert blocker.read_text() == "a file where the cache folder would go"


def test_a_folder_without_write_bits_gets_no_cache_even_as_root(tmp_path: Path) -> None:
    """A dataset whose owner took every write bit away is read-only for everyone: the loader parses it
    and writes nothing there (root's access check would let it; the mode bits do not)."""
    folder = tmp_path / "dataset"
    folder.mkdir()
    path = _simple().write(folder / "rank0.json")
    mode = folder.stat().st_mode
    folder.chmod(0o555)
    try:
        assert load_traces([path]).rank_ids == [0]
        assert sorted(p.name for p in folder.iterdir()) == ["rank0.json"]
    finally:
        folder.chmod(mode)
    assert load_traces([path]).rank_ids == [0]  # once writable, it is cached as usual
    assert (folder / CACHE_DIR).is_dir()


def test_parallel_and_serial_loads_agree(tmp_path: Path) -> None:
    for r in range(3):
        _simple(rank=r).write(tmp_path / f"rank{r}.json.gz")
    serial = load_traces([tmp_path], cache=False, jobs=1)
    parallel = load_traces([tmp_path], cache=False, jobs=2)
    assert serial.events.equals(parallel.events) and serial.ranks.equals(parallel.ranks)


def test_plain_and_gzip_and_pt_trace_names(tmp_path: Path) -> None:
    doc = _simple().document()
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "rank0.json").write_text(json.dumps(doc))
    (tmp_path / "a" / "rank1.pt.trace.json.gz").write_bytes(gzip.compress(json.dumps({**doc, "distributedInfo": {"rank": 1}}).encode()))
    (tmp_path / "a" / "notes.txt").write_text("not a trace")
    traces = load_traces([tmp_path / "a"], cache=False)
    assert traces.rank_ids == [0, 1]


def test_folder_scan_skips_json_that_is_not_a_trace(tmp_path: Path) -> None:
    from fsdpviz.errors import TraceError

    _simple().write(tmp_path / "rank0.json")
    (tmp_path / "config.json").write_text('{"lr": 0.1}')
    traces = load_traces([tmp_path], cache=False)
    assert traces.rank_ids == [0] and traces.skipped == [str(tmp_path / "config.json")]
    # Named explicitly, the same file is an error; a corrupt trace in a folder is one too.
    with pytest.raises(TraceError, match=r"config\.json: not a Kineto trace"):
        load_traces([tmp_path / "config.json"], cache=False)
    (tmp_path / "rank1.json").write_text('{"traceEvents": [')
    with pytest.raises(TraceError, match=r"rank1\.json: truncated JSON"):
        load_traces([tmp_path], cache=False)
    (tmp_path / "rank1.json").unlink()
    (tmp_path / "rank0.json").unlink()
    with pytest.raises(TraceError, match="folder holds no Kineto traces"):
        load_traces([tmp_path], cache=False)


def test_progress_lines_only_when_asked_off_a_terminal(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for r in range(2):
        _simple(rank=r).write(tmp_path / f"rank{r}.json")
    load_traces([tmp_path], cache=False, jobs=1)
    assert capsys.readouterr().err == ""  # stderr is not a terminal here: quiet by default
    load_traces([tmp_path], cache=False, jobs=1, progress=True)
    lines = capsys.readouterr().err.splitlines()
    assert [re.sub(r", [0-9.]+ files/s\)$", ")", line) for line in lines] == [
        "fsdpviz: parsed rank0.json (1/2)", "fsdpviz: parsed rank1.json (2/2)"]
    assert all(re.search(r", \d+\.\d files/s\)$", line) for line in lines)  # and the rate


def test_nan_and_infinity_literals_are_read(tmp_path: Path) -> None:
    b = _simple()
    b.events.append({"ph": "X", "cat": "cpu_op", "name": "nan_dur", "pid": 1000, "tid": 1000, "ts": 5,
                     "dur": float("nan")})
    b.events.append({"ph": "X", "cat": "kernel", "name": "occupancy", "pid": 0, "tid": 7, "ts": 300, "dur": 5,
                     "args": {"stream": 7, "device": 0, "correlation": 99, "est. achieved occupancy %": float("inf")}})
    path = tmp_path / "rank0.json"
    path.write_text(json.dumps(b.document()))  # Python writes NaN / Infinity literals
    assert "NaN" in path.read_text() and "Infinity" in path.read_text()
    # the same document behind UTF-8's byte order mark (an editor's save), which Python's json reads past
    marked = tmp_path / "marked" / "rank0.json"
    marked.parent.mkdir()
    marked.write_bytes(b"\xef\xbb\xbf" + path.read_bytes())
    for trace in (path, marked):
        traces = load_traces([trace], cache=False)
        assert int(traces.ranks["n_skipped"].iloc[0]) == 1  # the NaN duration
        assert set(traces.events["name"].astype(str)) >= {"occupancy", GEMM}
        assert len(traces.steps) == 2
    # and a trace without such literals behind the mark reads as the same trace without it
    plain = tmp_path / "plain" / "rank0.json"
    plain.parent.mkdir()
    plain.write_bytes(b"\xef\xbb\xbf" + json.dumps(_simple().document()).encode())
    assert len(load_traces([plain], cache=False).events) == len(_simple().events)


def test_start_up_work_runs_once_while_a_worker_parses(tmp_path: Path) -> None:
    """``load_run(meanwhile=)``: run in this process after pandas is imported, while the file is parsed in
    a worker (given a second CPU); not run at all when the cache answers."""
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("one CPU: the file is parsed in this process")
    _simple().write(tmp_path / "rank0.json")
    code = f"""
import json, multiprocessing, sys
from fsdpviz.trace.loader import load_run
seen = []
def start_up():
    seen.append({{"pandas": "pandas" in sys.modules, "workers": len(multiprocessing.active_children())}})
cold = load_run([{str(tmp_path)!r}], cache=True, meanwhile=start_up)
warm = load_run([{str(tmp_path)!r}], cache=True, meanwhile=start_up)
print(json.dumps({{"seen": seen, "events": [int(cold.traces.ranks["n_events"][0]), int(warm.traces.ranks["n_events"][0])]}}))
"""
    env = {k: v for k, v in os.environ.items() if k != "FSDPVIZ_NO_CACHE"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["seen"] == [{"pandas": True, "workers": 1}]
    assert got["events"][0] == got["events"][1] > 0


def test_a_torn_timer_line_is_said_by_the_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The bundled FSDP2 sample with rank 0's timer file cut in the middle of its last line: ``summary``
    reads every whole line (the step time is still the timers') and says, as a warning and a note, which
    file's last line it left out."""
    import shutil

    from fsdpviz.cli import main

    run = tmp_path / "run"
    shutil.copytree(Path(__file__).parents[2] / "sample_traces" / "fsdp2-cpu-2rank", run,
                    ignore=shutil.ignore_patterns(".fsdpviz-cache", "report.html"))
    timers = run / "timers" / "rank0.jsonl"
    text = timers.read_text()
    last = text.rstrip("\n").rsplit("\n", 1)[1]
    timers.write_text(text.rstrip("\n")[: -len(last) // 2])
    with pytest.raises(SystemExit) as done:
        main(["summary", str(run), "--json", "-q", "--no-cache"])
    out, err = capsys.readouterr()
    assert not done.value.code, err
    said = f"left out the last line of {timers}: it is not a whole timer record"
    assert any(ln.startswith("warning: ") and said in ln for ln in err.splitlines()), err
    summary = json.loads(out)
    assert summary["step_time_source"] == "timers" and any(n.startswith(said) for n in summary["notes"])

    # An export carries the timers, and with them what was left out of them: read back, it says so too,
    # naming the file from the run folder (the export is read elsewhere); an export of rank 1 alone does not
    def exported(*ranks: str) -> tuple[dict, str]:
        export = tmp_path / f"run{''.join(ranks)}.json.gz"
        with pytest.raises(SystemExit) as done:
            main(["export", str(run), "--format", "perfetto", "-o", str(export), "-q", "--no-cache",
                  *(["--ranks", *ranks] if ranks else [])])
        assert not done.value.code, capsys.readouterr().err
        capsys.readouterr()
        with pytest.raises(SystemExit) as done:
            main(["summary", str(export), "--json", "-q", "--no-cache"])
        out, err = capsys.readouterr()
        assert not done.value.code, err
        return json.loads(out), err

    back, err = exported()
    said_back = "left out the last line of timers/rank0.jsonl: it is not a whole timer record"
    assert any(ln.startswith("warning: ") and said_back in ln for ln in err.splitlines()), err
    assert [n.replace(str(timers), "timers/rank0.jsonl") for n in summary["notes"] if n.startswith(said)] \
        == [n for n in back["notes"] if n.startswith(said_back)] != []
    assert back["step_time_source"] == "timers" and back["step_time_ms"] == summary["step_time_ms"]
    alone, err = exported("1")
    assert alone["ranks"] == [1] and "left out the last line" not in err
    assert not any("left out the last line" in n for n in alone["notes"])
