"""The batch reader (``fsdpviz.trace.stream``) gives exactly the tables of the whole-file decoder.

The reader cuts the JSON text at commas between events without parsing it first; a wrong cut
(inside a string, inside a nested object) must be detected and another one tried. These tests force
tiny batches, so that every file is cut in many places, and compare the columns with those of the
whole-file path on real GPU traces, the sample recordings and adversarial hand-made traces.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest
from helpers.kineto import MAIN_TID, TraceBuilder

from fsdpviz.errors import TraceError
from fsdpviz.trace import kineto, stream
from fsdpviz.trace.kineto import RankColumns, parse_trace_file

SAMPLES = Path(__file__).resolve().parents[2] / "sample_traces"


def _whole_file(path: Path, monkeypatch: pytest.MonkeyPatch) -> RankColumns:
    def refuse(*_args: object) -> None:
        raise stream.StreamFallback("test: whole-file path")

    with monkeypatch.context() as m:
        m.setattr(kineto, "iter_event_batches", refuse)
        return parse_trace_file(path)


def _batched(path: Path, monkeypatch: pytest.MonkeyPatch, batch_bytes: int, *,
             fallback: bool = False) -> tuple[RankColumns, int]:
    """Parse with tiny batches; also return how many batches the reader yielded. Unless
    ``fallback``, the whole-file decoder must not have been needed."""
    batches = [0]
    real = stream.iter_event_batches

    def counting(p: Path, header: list) -> object:
        for batch in real(p, header):
            batches[0] += 1
            yield batch

    def no_fallback(*_args: object) -> None:
        raise AssertionError("the batch reader fell back to the whole-file decoder")

    with monkeypatch.context() as m:
        m.setattr(stream, "BATCH_BYTES", batch_bytes)
        m.setattr(stream, "READ_BYTES", 4096)
        m.setattr(kineto, "iter_event_batches", counting)
        if not fallback:
            m.setattr(kineto, "decode_trace", no_fallback)
        return parse_trace_file(path), batches[0]


def _assert_same(a: RankColumns, b: RankColumns) -> None:
    assert a.rank == b.rank
    assert a.categories == b.categories
    assert a.lanes == b.lanes
    for table in ("events", "steps", "memory"):
        left, right = getattr(a, table), getattr(b, table)
        assert left.keys() == right.keys()
        for col in left:
            assert left[col].dtype == right[col].dtype, (table, col)
            np.testing.assert_array_equal(left[col], right[col], err_msg=f"{table}.{col}")


def _real_traces(gpu_real_dir: Path) -> list[Path]:
    return sorted(gpu_real_dir.rglob("*.json.gz"))


def test_batches_match_whole_file_on_real_gpu_traces(gpu_real_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for path in _real_traces(gpu_real_dir):
        batched, n_batches = _batched(path, monkeypatch, batch_bytes=256 << 10)
        assert n_batches > 2, path  # really cut into pieces
        _assert_same(batched, _whole_file(path, monkeypatch))


def test_batches_match_whole_file_on_sample_recordings(monkeypatch: pytest.MonkeyPatch) -> None:
    paths = sorted(SAMPLES.glob("*/traces/*.json.gz"))
    assert paths, "sample recordings missing"
    for path in paths:
        batched, n_batches = _batched(path, monkeypatch, batch_bytes=32 << 10)
        assert n_batches > 2, path
        _assert_same(batched, _whole_file(path, monkeypatch))


def _adversarial() -> TraceBuilder:
    """Strings and nested args full of what the reader looks for when it cuts: ``},``, ``}, {``, ``]``."""
    b = TraceBuilder(rank=1)
    b.thread(MAIN_TID, "pt_main_thread")
    b.step(1, 0, 5000).step(2, 5000, 5000)
    for i in range(300):
        t = 10 + 30 * i
        b.cpu_op(f'op}}, {{"ph": "X"}}, ],{i}', t, 5, **{"Input Dims": [[4, 8], []], "Nested": [{"a": 1}, {"b": [{}]}]})
        b.annotation('x}' + ' ,' * (i % 5) + '{"', t + 6, 3, Note={"k": "}, {"}, Empty={})
        b.kernel(f"nccl}},{{Kernel_AllGather_{i % 3}", t + 10, 15, launch_us=t + 1,
                 **{"Collective name": "_allgather_base", "In msg nelems": 64, "Out msg nelems": 128,
                    "dtype": "Float", "Process Group Name": "0"})
        b.memory(t + 2, allocated=1000 + i, reserved=4096, delta=i)
    return b


@pytest.mark.parametrize("indent", [None, 2])
@pytest.mark.parametrize("suffix", [".json", ".json.gz"])
@pytest.mark.parametrize("header_last", [False, True])
def test_cuts_inside_strings_and_nested_objects_are_not_taken(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, indent: int | None, suffix: str, header_last: bool,
) -> None:
    doc = _adversarial().document()
    doc["baseTimeNanoseconds"] = 1_700_000_000_000_000_000
    if header_last:  # top-level keys after the events array (JSON does not fix the order)
        events = doc.pop("traceEvents")
        doc = {"traceEvents": events, **doc, "traceName": "x ] y", "deviceProperties": [{"id": 0, "name": "G"}]}
    text = json.dumps(doc, indent=indent).encode()
    path = tmp_path / f"rank1{suffix}"
    path.write_bytes(gzip.compress(text) if suffix.endswith(".gz") else text)
    for batch_bytes in (1, 97, 4096):
        batched, n_batches = _batched(path, monkeypatch, batch_bytes)
        assert n_batches > 2
        _assert_same(batched, _whole_file(path, monkeypatch))
    tables = _whole_file(path, monkeypatch)
    assert tables.rank["n_events"] == 300 * 4 + 2 and tables.rank["n_skipped"] == 0
    assert len(tables.memory["t_ns"]) == 300
    assert tables.rank["base_time_ns"] == 1_700_000_000_000_000_000
    assert tables.rank["device_name"] == ("G" if header_last else "")


def test_odd_content_falls_back_to_the_whole_file_decoder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    b = _adversarial()
    b.events.insert(500, {"ph": "X", "cat": "cpu_op", "name": "x", "pid": 1000, "tid": 1000, "ts": 1, "dur": "2"})
    text = json.dumps(b.document()).encode()
    nan = text.replace(b'"dur": 5,', b'"dur": NaN,', 1)  # non-standard JSON some writers emit
    for name, data in (("typed.json", text), ("nan.json", nan)):
        path = tmp_path / name
        path.write_bytes(data)
        batched, _ = _batched(path, monkeypatch, batch_bytes=97, fallback=True)
        _assert_same(batched, _whole_file(path, monkeypatch))
        assert batched.rank["n_skipped"] >= 1


def test_several_gzip_members_are_one_stream(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    text = json.dumps(_adversarial().document()).encode()
    path = tmp_path / "rank1.json.gz"  # as written by ``cat head.gz body.gz tail.gz``
    path.write_bytes(b"".join(gzip.compress(text[i:i + 5000]) for i in range(0, len(text), 5000)))
    batched, n_batches = _batched(path, monkeypatch, batch_bytes=97)
    assert n_batches > 2
    _assert_same(batched, _whole_file(path, monkeypatch))


@pytest.mark.parametrize(
    ("data", "problem"),
    [
        (lambda doc: gzip.compress(doc)[:-200], "truncated gzip"),
        (lambda doc: doc[: len(doc) // 2], "truncated JSON"),
        (lambda doc: gzip.compress(doc) + gzip.compress(b"{}"), "invalid JSON"),  # as gzip.decompress reads it
        (lambda doc: gzip.compress(doc) + b"junk", "corrupt gzip"),
        (lambda doc: b'{"traceEvents": []}', "holds no events"),
    ],
)
def test_broken_files_report_what_the_whole_file_decoder_reports(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, data: object, problem: str,
) -> None:
    doc = json.dumps(_adversarial().document()).encode()
    path = tmp_path / "rank0.json.gz"
    path.write_bytes(data(doc))  # type: ignore[operator]
    with pytest.raises(TraceError, match=problem) as whole:
        _whole_file(path, monkeypatch)
    with pytest.raises(TraceError) as batched:
        _batched(path, monkeypatch, batch_bytes=97, fallback=True)
    assert str(batched.value) == str(whole.value)
