"""What ``record --force`` refuses is what the next recording's readers would take as its own: in
traces/ the trace loader's own list, in timers/ the timers' ``*.jsonl``, in ranks/ the ranks' facts'
``rank*.json`` (names compared as the file system does, case and all); fsdpviz's own files are removed
and any other file stays."""

from __future__ import annotations

from pathlib import Path

from fsdpviz.runfolder import recording_entries
from fsdpviz.trace.sources import _traces_in

FILES = ["traces/rank0.trace.json.gz", "traces/MyTrace.JSON", "traces/mine.json.gz", "traces/.DS_Store",
         "traces/._rank1.trace.json.gz", "traces/run.json", "traces/notes.txt",
         "timers/rank0.jsonl", "timers/extra.jsonl", "timers/extra.JSONL", "timers/readme.md",
         "ranks/rank0.json", "ranks/rank-extra.json", "ranks/Rank1.json", "ranks/notes.json"]


def test_force_refuses_exactly_what_the_readers_would_read(tmp_path: Path) -> None:
    for name in FILES:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("{}")
    remove, foreign = recording_entries(tmp_path)
    # what each reader takes from its folder, less fsdpviz's own files, is what --force refuses
    read = {*_traces_in(tmp_path / "traces"), *(tmp_path / "timers").glob("*.jsonl"),
            *(tmp_path / "ranks").glob("rank*.json")}
    assert set(foreign) == read - set(remove)
    assert sorted(str(p.relative_to(tmp_path)) for p in foreign) == [
        "ranks/rank-extra.json", "timers/extra.jsonl", "traces/MyTrace.JSON", "traces/mine.json.gz"]
    assert sorted(str(p.relative_to(tmp_path)) for p in remove) == [
        "ranks/rank0.json", "timers/rank0.jsonl", "traces/rank0.trace.json.gz"]
