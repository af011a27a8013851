"""``fsdpviz export --format perfetto``: one Chrome-trace file that Perfetto accepts and fsdpviz reads back.

References: the Chrome trace event format (complete events need ``ts``/``dur``; Perfetto nests the
complete events of one track and drops partial overlaps), the run's own analysis (its spans, steps
and summary), and a hand-built trace whose ``Optimizer.step`` crosses a ``ProfilerStep`` boundary on
one thread, as real traces do.
"""

from __future__ import annotations

import gzip
import json
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers.kineto import TraceBuilder
from synth import Scenario, generate_run, make_root, make_units

from fsdpviz.analysis.pipeline import RunResult, analyse
from fsdpviz.cli import main
from fsdpviz.report.perfetto import EXPORT_CATEGORY, export_perfetto

REPO = Path(__file__).resolve().parents[2]
SAMPLE = REPO / "sample_traces" / "fsdp2-cpu-2rank"
GPU = Scenario(units=make_units(3, numel=4_000_000), root=make_root(), world_size=2, steps=(3, 4, 5))


def _events(path: Path) -> list[dict]:
    raw = path.read_bytes()
    return json.loads(gzip.decompress(raw) if path.name.endswith(".gz") else raw)["traceEvents"]


def _assert_nested(events: list[dict]) -> None:
    """On every (pid, tid) track, complete events nest or are disjoint (none crosses its parent)."""
    tracks: dict[tuple[int, int], list[tuple[float, float]]] = defaultdict(list)
    for e in events:
        assert isinstance(e["pid"], int) and e["ph"] in ("X", "M", "i", "C", "s", "f"), e
        if e["ph"] == "X":
            assert e["dur"] >= 0 and isinstance(e["ts"], float | int)
            tracks[(e["pid"], e["tid"])].append((e["ts"], e["ts"] + e["dur"]))
    for spans in tracks.values():
        stack: list[float] = []
        for start, end in sorted(spans, key=lambda s: (s[0], -s[1])):
            while stack and stack[-1] <= start:
                stack.pop()
            assert not stack or end <= stack[-1] + 1e-9, (start, end, stack[-1])
            stack.append(end)


@pytest.fixture(scope="module")
def gpu_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return generate_run(GPU, tmp_path_factory.mktemp("perfetto-gpu"), run_folder=True).folder


@pytest.fixture(scope="module")
def gpu_result(gpu_run: Path) -> RunResult:
    """The synthetic GPU run analysed once for the module; the tests only read it."""
    return analyse([gpu_run], cache=False)


def _summary(path: Path, capsys: pytest.CaptureFixture[str]) -> dict:
    """``fsdpviz summary --json PATH`` in this process, without caches."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as done:
        main(["summary", str(path), "--json", "-q", "--no-cache"])
    out, err = capsys.readouterr()
    assert done.value.code in (0, None), err
    return dict(json.loads(out))


# What differs between a run and its export read back: where it was read from, and the blocks the CPU
# profiler did not see freed (the export's allocator samples hold the frees the analysis found, so
# nothing is left unseen when it is read again; the levels are the same).
NOT_THE_RUN = ("sources", "run_dir")


@pytest.mark.parametrize("source", ["fsdp2-cpu-2rank", "fsdp1-cpu-2rank", "zero3-cpu-2rank", "gpu"])
def test_export_reads_back_as_the_same_run(source: str, gpu_run: Path, tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    """The run folder's summary and its export's, read back, are one: the step on the timers' clock
    (run.json and the timers travel in the export), the units' parameter counts as run.json has them
    (the framework's own), the memory categories, the parallelism, the actions and their predictions.
    FSDP1's and ZeRO-3's backward ranges cross their parents on one thread, which the export moves to
    overflow tracks for Perfetto: read back, they are on their thread again (their units' backward)."""
    folder = gpu_run if source == "gpu" else SAMPLE.parent / source
    run = analyse([folder], cache=False)
    out = export_perfetto(run, tmp_path / "run.json.gz").path
    _assert_nested(_events(out))
    a, b = _summary(folder, capsys), _summary(out, capsys)
    if source == "fsdp2-cpu-2rank":  # what only run.json and the timers tell
        assert a["step_time_source"] == "timers" and a["parallelism"]["source"] == "run.json"
        assert a["memory"]["level"] == "since_trace_start_plus_measured"
    if source != "gpu":
        assert a["memory"]["not_seen_freed"]["blocks"] > 0 and b["memory"]["not_seen_freed"] is None
        a["memory"]["not_seen_freed"] = b["memory"]["not_seen_freed"] = None
    assert all(u["backward_ms"] > 0 for u in b["units"] if u["name"] != "(root)")
    assert {k: v for k, v in a.items() if k not in NOT_THE_RUN} == {k: v for k, v in b.items() if k not in NOT_THE_RUN}


def test_an_export_of_traces_keeps_their_collectives_element_types(tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """Traces without a run folder: the units' parameter counts come from the all-gathers' element
    counts and types, which the export keeps (not their bytes counted as elements)."""
    plain = REPO / "sample_traces" / "fsdp2-cpu-2rank-plain"
    out = export_perfetto(analyse([plain], cache=False), tmp_path / "plain.json.gz").path
    a, b = _summary(plain, capsys), _summary(out, capsys)
    numel = [u["param_numel"] for u in a["units"]]
    assert numel and all(n > 0 for n in numel) and [u["param_numel"] for u in b["units"]] == numel
    assert [u["param_bytes"] for u in a["units"]] == [u["param_bytes"] for u in b["units"]]
    assert a["memory"]["categories"] == b["memory"]["categories"]
    assert a["step_time_ms"] == b["step_time_ms"] and b["step_time_source"] == "trace"


def test_an_export_without_raw_events_is_not_read_as_a_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = export_perfetto(analyse([SAMPLE], cache=False), tmp_path / "units.json.gz", raw=False).path
    document = json.loads(gzip.decompress(out.read_bytes()))
    # what only reading back needs stays out of a file that cannot be read back (its size is the unit tracks')
    assert "fsdpvizRun" not in document and all(r["timers"] == [] for r in document["fsdpvizRanks"])
    with pytest.raises(SystemExit) as done:
        main(["summary", str(out), "-q", "--no-cache"])
    err = capsys.readouterr().err
    assert done.value.code == 2 and len(err.strip().splitlines()) == 1
    assert err.startswith(f"error: {out}: ") and "--no-raw" in err


def test_unit_tracks_hold_every_span_and_the_arrows(gpu_result: RunResult, tmp_path: Path) -> None:
    run = gpu_result
    out = export_perfetto(run, tmp_path / "units.json", raw=False).path
    events = _events(out)
    spans = run.analysis.spans
    kinds = ["all_gather", "copy_in", "compute", "copy_out", "reduce_scatter", "all_reduce"]
    kept = spans[spans["kind"].isin(kinds)]
    unit_slices = [e for e in events if e["ph"] == "X" and e.get("cat") == EXPORT_CATEGORY
                   and e["name"] != "exposed communication"]
    assert len(unit_slices) == len(kept)
    assert not [e for e in events if e["ph"] == "X" and e.get("cat") != EXPORT_CATEGORY]  # --no-raw
    # one all-gather -> compute arrow per unit pass that has both
    keys = kept.assign(kind=kept["kind"].astype(str)).groupby(["rank", "step", "micro", "unit", "phase"])["kind"].agg(set)
    both = sum(1 for k in keys if {"all_gather", "compute"} <= set(k))
    assert sum(1 for e in events if e["ph"] == "s" and e.get("cat") == EXPORT_CATEGORY) == both
    names = {e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    assert {"rank 0 · FSDP units", "rank 1 · FSDP units"} <= names
    assert any(e["ph"] == "C" for e in events)  # the memory counter


def test_crossing_events_move_to_an_overflow_track(tmp_path: Path) -> None:
    """Optimizer.step begins inside ProfilerStep#1 and ends inside #2 on the same thread."""
    b = TraceBuilder(rank=0, world_size=1)
    b.step(1, 0, 1000).step(2, 1000, 1000).step(3, 2000, 1000)
    b.annotation("Optimizer.step#AdamW.step", 900, 200)
    b.kernel("volta_sgemm_128x64_nn", 100, 100, launch_us=10)
    path = b.write(tmp_path / "r.json")
    run = analyse([path], cache=False, include_last_step=True)
    events = _events(export_perfetto(run, tmp_path / "out.json").path)
    _assert_nested(events)
    moved = [e for e in events if e["ph"] == "X" and e["name"] == "Optimizer.step#AdamW.step"]
    step = next(e for e in events if e["ph"] == "X" and e["name"] == "ProfilerStep#1")
    assert len(moved) == 1 and moved[0]["tid"] != step["tid"] and moved[0]["pid"] == step["pid"]
    track = {e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"
             and e["tid"] == moved[0]["tid"]}
    assert len(track) == 1 and track.pop().endswith("(overlapping)")


def test_cli_options_and_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    def run(*argv: str) -> tuple[int, str, str]:
        with pytest.raises(SystemExit) as exc:
            main(["export", str(SAMPLE), "--format", "perfetto", "--no-cache", *argv])
        out, err = capsys.readouterr()
        return int(exc.value.code or 0), out, err

    code, out, _ = run("-o", str(tmp_path / "all.json.gz"))
    assert code == 0 and "2 rank(s)" in out
    code, out, _ = run("-o", str(tmp_path / "one.json"), "--ranks", "1", "--steps", "3", "--no-raw")
    assert code == 0 and "1 rank(s)" in out
    events = _events(tmp_path / "one.json")
    assert {e["args"]["step"] for e in events if e["ph"] == "X" and e.get("cat") == EXPORT_CATEGORY
            and "step" in e.get("args", {})} == {3}
    for argv, message in ((["-o", str(tmp_path)], "writes one file"),
                          (["-o", str(tmp_path / "x.txt")], "name the file .json or .json.gz"),
                          (["-o", str(tmp_path / "x.json"), "--ranks", "5"], "no analysed rank 5"),
                          (["-o", str(tmp_path / "x.json"), "--steps", "5"], "not analysed")):
        code, _, err = run(*argv)
        assert code == 2 and err.startswith("error: ") and message in err and len(err.strip().splitlines()) == 1


# What one exported event may cost: 64 ranks x 80 units export as 41.9 MB of 303,552 events (138 bytes
# each; benchmarks/bench_perfetto.py, docs/perfetto.md), where the size is measured; here, on a run an
# eighth as wide each way, each event must stay as small.
BYTES_PER_EVENT = 160


def test_unit_tracks_stay_small_per_rank_and_unit(tmp_path: Path) -> None:
    ranks, units = 8, 10
    sc = Scenario(units=make_units(units, numel=1_000_000), root=make_root(), world_size=ranks, steps=(3, 4, 5),
                  shared_timeline=True)
    run = analyse([generate_run(sc, tmp_path / "big", run_folder=True).folder], cache=False)
    plain = export_perfetto(run, tmp_path / "units.json", raw=False)
    packed = export_perfetto(run, tmp_path / "units.json.gz", raw=False)
    assert plain.ranks == ranks and plain.size_bytes < BYTES_PER_EVENT * plain.events
    assert packed.size_bytes < plain.size_bytes / 5
    spans = run.analysis.spans
    n_slices = int(spans["kind"].isin(["all_gather", "copy_in", "compute", "copy_out", "reduce_scatter",
                                        "all_reduce"]).sum())
    assert plain.events > n_slices  # the slices, plus arrows, exposed strips, the memory counter, names


def _edited(out: Path, tmp_path: Path, edit: Callable[[dict], None]) -> Path:
    document = json.loads(gzip.decompress(out.read_bytes()))
    edit(document)
    path = tmp_path / f"edited-{len(list(tmp_path.iterdir()))}.json"
    path.write_text(json.dumps(document))
    return path


def test_a_damaged_export_is_read_as_far_as_it_can_be_or_is_one_error_line(tmp_path: Path,
                                                                          capsys: pytest.CaptureFixture[str]) -> None:
    out = export_perfetto(analyse([SAMPLE], cache=False), tmp_path / "run.json.gz").path

    def summary(path: Path) -> tuple[int, str, str]:
        capsys.readouterr()
        with pytest.raises(SystemExit) as done:
            main(["summary", str(path), "--json", "-q", "--no-cache"])
        out_, err = capsys.readouterr()
        return int(done.value.code or 0), out_, err

    def retype(document: dict) -> None:  # facts of another type are left out, not the export with them
        document["fsdpvizRanks"][0]["nccl_version"] = 2
        document["fsdpvizRanks"][1]["device_name"] = 7
        document["fsdpvizRanks"][1]["device_memory_bytes"] = "lots"

    code, text, err = summary(_edited(out, tmp_path, retype))
    assert code == 0, err
    read = json.loads(text)
    assert read["ranks"] == [0, 1] and read["step_time_source"] == "timers"

    for damage, said in ((lambda d: d["fsdpvizRanks"][0].update(rank="first"), "fsdpvizRanks"),
                         (lambda d: d["fsdpvizRanks"][0]["timers"][0].update(step=1e30), "does not fit"),
                         (lambda d: d.update(fsdpvizRun=[1, 2]), "run folder's facts"),
                         (lambda d: d["fsdpvizRanks"][0].update(torn_timers=[3]), "torn timer files")):
        code, text, err = summary(_edited(out, tmp_path, damage))
        lines = err.strip().splitlines()
        assert code == 2 and not text and len(lines) == 1 and lines[0].startswith("error: ") and said in lines[0], err


@pytest.mark.parametrize("name", ["h100-fsdp2-ws1-block", "h100-fsdp1-ws1-block"])
def test_a_gpu_recordings_export_holds_the_kernels_that_ran_past_its_last_step(
        name: str, gpu_fsdp_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A GPU runs behind its host: kernels of the last analysed step start after its ProfilerStep's
    host range ends. The export keeps every event of the kept steps, so the recording's summary and its
    export's are one (they parted by 2 ms of a traced step and an action when it kept host time alone)."""
    folder = gpu_fsdp_dir / name
    out = export_perfetto(analyse([folder], cache=False), tmp_path / "gpu.json.gz").path
    a, b = _summary(folder, capsys), _summary(out, capsys)
    assert a["device"] == "gpu" and a["actions"]
    assert {k: v for k, v in a.items() if k not in NOT_THE_RUN} == {k: v for k, v in b.items() if k not in NOT_THE_RUN}


def test_an_export_carries_the_torn_timer_files_of_its_ranks_named_from_the_run_folder() -> None:
    """The run folder names a rank's timers ``timers/rank{R}.jsonl``: another rank's file stays out of an
    export of some ranks; a file named otherwise (its rank unknown) stays in; every name is the run
    folder's, not this machine's path."""
    from fsdpviz.report.perfetto import _torn_timers

    torn = ["/data/run/timers/rank0.jsonl", "/data/run/timers/rank3.jsonl", "/data/run/timers/extra.jsonl",
            "/data/run/timers/rank\u00b2.jsonl", "/elsewhere/rank0.jsonl"]
    assert _torn_timers(torn, "/data/run", [0, 1]) == ["timers/rank0.jsonl", "timers/extra.jsonl",
                                                       "timers/rank\u00b2.jsonl", "/elsewhere/rank0.jsonl"]
    assert _torn_timers(torn, "/data/run/", [3]) == ["timers/rank3.jsonl", "timers/extra.jsonl", "timers/rank\u00b2.jsonl"]
    assert _torn_timers(["timers/rank2.jsonl"], None, [2]) == ["timers/rank2.jsonl"]  # an export read back


def test_an_export_of_one_rank_reads_back_with_its_own_clean_steps(tmp_path: Path) -> None:
    # the sample's rank 0 alone: the export keeps run.json whole and rank 0's timers; read back, the run is
    # rank 0's, whose clean steps lead as they do in the whole run (the other rank's timers are not missing
    # from it: its trace was not exported)
    whole = analyse([SAMPLE], cache=False, progress=False)
    export_perfetto(whole, tmp_path / "rank0.json", ranks=[0])
    back = analyse([tmp_path / "rank0.json"], cache=False, progress=False)
    assert back.traces.rank_ids == [0]
    cost = back.summary.profiler
    assert cost is not None and cost.headline and back.summary.step_time_source == "timers"
    assert cost.fewest_unprofiled_steps == 4
