"""Bad inputs for the commands that read traces, each with the one line fsdpviz must print.

Every case writes its input under a folder and returns ONE path (a file, a folder of traces or a
run folder), so that every command takes it the same way: ``summary PATH``, ``report PATH``,
``export PATH``, ``compare GOOD PATH``. ``expected`` is a regular expression the ``error:`` line
must match: it names the file and the problem.
"""

from __future__ import annotations

import gzip
import json
import random
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from helpers.kineto import TraceBuilder

GEMM = "volta_sgemm_128x64_nn"
NCCL_GATHER = "ncclDevKernel_AllGather_RING_LL"
REPO = Path(__file__).resolve().parents[2]
SAMPLE_RUN = REPO / "sample_traces" / "fsdp2-cpu-2rank"


def good_trace(rank: int = 0, world_size: int = 2) -> TraceBuilder:
    """A small GPU trace every command accepts: two steps, a GEMM overlapping an all-gather."""
    b = TraceBuilder(rank=rank, world_size=world_size)
    b.step(1, 0, 1000).step(2, 1000, 1000)
    b.kernel(GEMM, 100, 100, launch_us=10)
    b.kernel(NCCL_GATHER, 150, 100, launch_us=20)
    b.kernel(GEMM, 1100, 100, launch_us=1010)
    return b


def good_document(rank: int = 0) -> bytes:
    return json.dumps(good_trace(rank).document()).encode()


@dataclass(frozen=True)
class Case:
    make: Callable[[Path], Path]
    expected: str


def _file(name: str, data: bytes | Callable[[], bytes]) -> Callable[[Path], Path]:
    def make(folder: Path) -> Path:
        path = folder / name
        path.write_bytes(data() if callable(data) else data)
        return path

    return make


def _truncated_json() -> bytes:
    data = good_document()
    return data[: len(data) // 2]


def _truncated_gzip() -> bytes:
    # Incompressible padding so that half the file is half the stream, not just its trailer.
    data = gzip.compress(good_document() + b" " * 10 + random.Random(1).randbytes(20000).hex().encode())
    return data[: len(data) // 2]


def _corrupt_gzip() -> bytes:
    data = bytearray(gzip.compress(good_document()))
    middle = len(data) // 2
    data[middle : middle + 16] = b"\xff" * 16
    return bytes(data)


def _invalid_json() -> bytes:
    return good_document().replace(b'"ProfilerStep#2"', b'"ProfilerStep#2" "oops"', 1)


def _duplicate_ranks(folder: Path) -> Path:
    traces = folder / "two-runs"
    traces.mkdir()
    good_trace(rank=1).write(traces / "a.json")
    good_trace(rank=1).write(traces / "b.json.gz")
    return traces


def _nothing_in_window(folder: Path) -> Path:
    b = TraceBuilder(rank=0)
    b.step(1, 0, 1000).step(2, 1000, 1000)
    b.cpu_op("aten::mm", 3000, 10)  # after every step: the analysed step 1 holds nothing
    return b.write(folder / "late.json")


def _only_unusable_events(folder: Path) -> Path:
    doc = {"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 5, "dur": -1},
                           {"ph": "Q", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 5, "dur": 1}]}
    path = folder / "unusable.json"
    path.write_text(json.dumps(doc))
    return path


def _empty_folder(folder: Path) -> Path:
    (folder / "nothing").mkdir()
    (folder / "nothing" / "notes.txt").write_text("no traces here")
    return folder / "nothing"


def _other_json_only(folder: Path) -> Path:
    other = folder / "configs"
    other.mkdir()
    (other / "config.json").write_text('{"lr": 0.1}')
    (other / "list.json").write_text("[1, 2]")
    return other


def _run_copy(folder: Path) -> Path:
    run = folder / "run"
    shutil.copytree(SAMPLE_RUN, run, ignore=shutil.ignore_patterns(".fsdpviz-cache"))
    return run


def _broken_run_json(folder: Path) -> Path:
    run = _run_copy(folder)
    (run / "run.json").write_text('{"world_size": 2, "ranks": [')
    return run


def _run_without_traces(folder: Path) -> Path:
    run = _run_copy(folder)
    shutil.rmtree(run / "traces")
    return run


def _run_without_run_json(folder: Path) -> Path:
    run = _run_copy(folder)
    (run / "run.json").unlink()
    return run


def _bad_timer_line(folder: Path) -> Path:
    run = _run_copy(folder)
    timers = run / "timers" / "rank1.jsonl"
    lines = timers.read_text().splitlines()
    lines[3] = '{"rank": 1, "step": "three"'  # a damaged line that is not the last one
    timers.write_text("\n".join(lines) + "\n")
    return run


def _truncated_trace_in_run(folder: Path) -> Path:
    run = _run_copy(folder)
    trace = run / "traces" / "rank1.trace.json.gz"
    data = trace.read_bytes()
    trace.write_bytes(data[: len(data) * 2 // 3])
    return run


CASES: dict[str, Case] = {
    "missing path": Case(lambda f: f / "does-not-exist.json.gz", r"does-not-exist\.json\.gz: no such file"),
    "empty file": Case(_file("empty.json", b""), r"empty\.json: empty file"),
    "gzip of nothing": Case(_file("void.json.gz", gzip.compress(b"")), r"void\.json\.gz: empty file"),
    "truncated JSON": Case(_file("cut.json", _truncated_json), r"cut\.json: truncated JSON"),
    "truncated gzip": Case(_file("cut.json.gz", _truncated_gzip), r"cut\.json\.gz: truncated gzip"),
    "corrupt gzip": Case(_file("corrupt.json.gz", _corrupt_gzip), r"corrupt\.json\.gz: corrupt gzip"),
    "random bytes": Case(_file("noise.json", b"\x00" + random.Random(0).randbytes(4096)),
                         r"noise\.json: not a JSON trace"),
    "invalid JSON": Case(_file("typo.json", _invalid_json), r"typo\.json: invalid JSON"),
    "JSON list": Case(_file("list.json", b"[1, 2, 3]"), r"list\.json: not a Kineto trace \(a JSON list"),
    "object without traceEvents": Case(_file("other.json", b'{"version": 1, "data": []}'),
                                       r"other\.json: not a Kineto trace \(no traceEvents\)"),
    "traceEvents not a list": Case(_file("odd.json", b'{"traceEvents": {"a": 1}}'),
                                   r"odd\.json: not a Kineto trace"),
    "no events": Case(_file("none.json", b'{"traceEvents": []}'), r"none\.json: the trace holds no events"),
    "only malformed events": Case(_file("bad.json", b'{"traceEvents": [{"ph": "X", "name": "a", "ts": "x", "dur": null, '
                                                    b'"pid": 1, "tid": 1}]}'),
                                  r"bad\.json: the trace holds no readable event: its 1 event\(s\) are malformed"),
    "no events in the analysis window": Case(_nothing_in_window,
                                             r"late\.json: no CPU events in the analysis window \(steps \[1\]\)"),
    "only unusable events": Case(_only_unusable_events, r"unusable\.json: no CPU events in the analysis window"),
    "two files claim the same rank": Case(_duplicate_ranks,
                                          r"rank 1 appears in two files: .*a\.json and .*b\.json\.gz"),
    "folder without traces": Case(_empty_folder, r"nothing: folder holds no trace files"),
    "folder of other JSON": Case(_other_json_only, r"configs: folder holds no Kineto traces \(2 JSON file"),
    "broken run.json": Case(_broken_run_json, r"run/run\.json: cannot read run\.json"),
    "run folder without traces": Case(_run_without_traces, r"run: run folder has no traces"),
    # the folder a recording wrote, its run.json lost: the line points at the traces it still holds
    "run folder without run.json": Case(_run_without_run_json,
                                        r"run: folder holds no trace files .*; it looks like a run folder without its "
                                        r"run\.json, whose traces/ holds traces: give .*run/traces to read them alone"),
    # fsdpviz's own report page (bokeh's code holds the words NaN and Infinity): not taken for JSON with NaNs
    "an HTML page": Case(_file("report.html", b"<!DOCTYPE html>\n<html><script>var a = [NaN, -Infinity], b = {x: NaN};</script>"),
                         r"report\.html: not a JSON trace \(the content is neither JSON nor gzip\)"),
    "damaged timer line": Case(_bad_timer_line, r"run/timers/rank1\.jsonl:4: bad timer record"),
    "truncated trace in a run folder": Case(_truncated_trace_in_run,
                                            r"run/traces/rank1\.trace\.json\.gz: truncated gzip"),
}


def one_error_line(stderr: str, expected: str) -> str:
    """The single ``error:`` line of ``stderr`` (asserting there is exactly one line and no traceback)."""
    assert "Traceback" not in stderr, stderr
    lines = stderr.splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith("error: "), lines[0]
    assert re.search(expected, lines[0]), (expected, lines[0])
    return lines[0]
