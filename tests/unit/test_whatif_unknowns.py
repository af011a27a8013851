"""whatif's memory says what it cannot know, as ``summary`` does, and a world-size change never
predicts the peak unchanged by silence.

Plain torch.profiler traces (no run.json, no recorder measurement): the bundled plain sample, the
suite's plain CPU recording, the traces alone of committed fsdpviz recordings, and the H100 recordings'
traces alone. On a CPU one the level counts only what was allocated since the trace began; on the
H100 ones the optimizer state is in what was allocated before it. Truth for the world-size changes
is the allocator's own peak of uninstrumented runs (``../shared/traces/gpu-fsdp/README.md``).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from fsdpviz.analysis import memory_categories as mcat
from fsdpviz.analysis.pipeline import RunResult, analyse
from fsdpviz.replay.model import read_model
from fsdpviz.replay.settings import Settings, Wrap
from fsdpviz.whatif.predict import predict

REPO = Path(__file__).resolve().parents[2]
PLAIN_CPU = [REPO / "sample_traces" / "fsdp2-cpu-2rank-plain", REPO / "tests" / "recorded" / "fsdp2-cpu-profile" / "traces",
             # fsdpviz recordings' traces without their run.json: no measurement of what was alive before
             REPO / "tests" / "recorded" / "example-fsdp2" / "run" / "traces",
             REPO / "tests" / "recorded" / "example-fsdp1" / "run" / "traces",
             REPO / "tests" / "recorded" / "memory-sgd-momentum+keep-grads" / "run" / "traces"]

# Uninstrumented peaks (torch.cuda.max_memory_allocated, exact to the byte) of the H100 recordings'
# scripts at other fake world sizes; the recordings themselves are at 8.
GPU_WORLD_TRUTH = {
    "h100-fsdp2-fake8-block": {2: 7_349_925_376, 16: 5_230_137_856, 1: 9_679_013_376},
    "h100-fsdp2-fake8-block-modelB": {4: 7_370_085_888, 16: 7_015_107_072, 32: 6_958_053_888},
    "h100-fsdp1-fake8-block": {16: 5_223_846_400, 1: 9_779_729_920},
}


def _plain(source: Path, tmp_path: Path) -> RunResult:
    """The traces of ``source`` alone, in a folder of their own (the analysis writes its cache there)."""
    folder = tmp_path / "-".join(source.relative_to(source.parents[2]).parts)
    shutil.copytree(source, folder, ignore=shutil.ignore_patterns(".fsdpviz-cache"))
    return analyse([folder], cache=False)


@pytest.fixture(scope="module")
def plain_cpu(tmp_path_factory: pytest.TempPathFactory) -> dict[str, RunResult]:
    base = tmp_path_factory.mktemp("plain")
    return {str(p.relative_to(REPO)): _plain(p, base) for p in PLAIN_CPU}


def _summary_categories(result: RunResult) -> dict[str, int | None]:
    memory = result.summary.to_json()["memory"]
    categories: dict[str, int | None] = memory["categories"]
    return categories


@pytest.mark.parametrize("name", [str(p.relative_to(REPO)) for p in PLAIN_CPU])
def test_categories_are_null_where_summary_says_unknown(plain_cpu: dict[str, RunResult], name: str) -> None:
    """GIVEN a plain CPU trace WHEN whatif predicts any setting THEN the recorded and predicted peaks'
    categories are null exactly where ``summary``'s are, each with why, and the known ones agree."""
    result = plain_cpu[name]
    summary = _summary_categories(result)
    unknown = {c for c, v in summary.items() if v is None}
    assert {mcat.SHARDED_PARAMS, mcat.OPTIMIZER_STATE} <= unknown  # nothing measured what was alive before
    model = read_model(result)
    for settings in (Settings(), Settings().with_(wrap=Wrap("root")),
                     Settings().with_(world_size=2 * result.analysis.world_size)):
        out = predict(model, settings).to_json()
        for side in ("baseline", "predicted"):
            categories = out[side]["memory_categories"]
            assert {c for c, v in categories.items() if v is None} == unknown, (side, settings.describe())
            assert set(out[side]["memory_unknown"]) == unknown
            assert out[side].get("memory_assumed", {}) == {}  # nothing here to carve an assumption from
        assert out["baseline"]["memory_categories"] == summary


@pytest.mark.parametrize("name", [str(p.relative_to(REPO)) for p in PLAIN_CPU])
def test_world_size_on_a_level_without_the_shards_is_null_with_a_note(plain_cpu: dict[str, RunResult],
                                                                       name: str) -> None:
    """The CPU level of a plain trace never counted the sharded parameters or an optimizer state made
    before it: a world-size change, which scales them, gets no peak, and a note says why."""
    result = plain_cpu[name]
    world = result.analysis.world_size
    for new in (1, 2 * world):
        prediction = predict(read_model(result), Settings().with_(world_size=new))
        assert prediction.baseline.peak_allocated_bytes is not None
        assert prediction.predicted.peak_allocated_bytes is None
        assert any(f"world size {world} -> {new}: not predicted" in n and "sharded parameters" in n
                   for n in prediction.notes)


@pytest.fixture(scope="module")
def plain_gpu(gpu_fsdp_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, RunResult]:
    base = tmp_path_factory.mktemp("plain-gpu")
    return {name: _plain(gpu_fsdp_dir / name / "traces", base / name) for name in GPU_WORLD_TRUTH}


@pytest.mark.parametrize(("name", "world"), [(n, w) for n, t in GPU_WORLD_TRUTH.items() for w in t])
def test_world_size_assumes_adam_said_so_and_meets_the_allocator(plain_gpu: dict[str, RunResult], name: str,
                                                                  world: int) -> None:
    """GIVEN an H100 trace alone (the optimizer state unmeasured, inside what was allocated before the
    trace) WHEN the world size changes THEN the prediction assumes Adam's two states per sharded
    element, says so in ``assumed`` and names the category it fills in ``memory_assumed``, the
    recorded peak's category stays null as in ``summary``, and the peak meets the uninstrumented
    run's allocator (this script's AdamW holds two states)."""
    result = plain_gpu[name]
    assert _summary_categories(result)[mcat.OPTIMIZER_STATE] is None
    prediction = predict(read_model(result), Settings().with_(world_size=world))
    true_peak = GPU_WORLD_TRUTH[name][world]
    base, peak = prediction.baseline.peak_allocated_bytes, prediction.predicted.peak_allocated_bytes
    assert base is not None and peak is not None
    assert abs(peak - true_peak) <= 0.01 * true_peak
    true_change = true_peak - base
    assert abs((peak - base) - true_change) <= 0.15 * abs(true_change)
    assert any("Adam" in a and "optimizer state" in a for a in prediction.assumed)
    categories = prediction.predicted.memory_categories
    assert categories is not None and categories[mcat.OPTIMIZER_STATE] is not None
    assert "Adam" in prediction.predicted.memory_assumed[mcat.OPTIMIZER_STATE]
    assert mcat.OPTIMIZER_STATE not in prediction.predicted.memory_unknown
    recorded = prediction.baseline.memory_categories
    assert recorded is not None and recorded[mcat.OPTIMIZER_STATE] is None
    assert mcat.OPTIMIZER_STATE in prediction.baseline.memory_unknown


def test_the_assumption_is_not_stated_where_nothing_scales(plain_gpu: dict[str, RunResult]) -> None:
    """A setting that leaves the world size moves no sharded state: nothing is assumed about it."""
    prediction = predict(read_model(plain_gpu["h100-fsdp2-fake8-block"]),
                         Settings().with_(reshard_after_forward=False))
    assert not any("Adam" in a for a in prediction.assumed)
    assert prediction.predicted.peak_allocated_bytes is not None
    # nor in the categories: the optimizer state stays null, with the summary's reason, as recorded
    predicted, recorded = prediction.predicted, prediction.baseline
    assert predicted.memory_assumed == {}
    assert predicted.memory_categories is not None and predicted.memory_categories[mcat.OPTIMIZER_STATE] is None
    assert predicted.memory_unknown == recorded.memory_unknown and mcat.OPTIMIZER_STATE in recorded.memory_unknown
    # and the setting as recorded predicts the summary's categories exactly
    same = predict(read_model(plain_gpu["h100-fsdp2-fake8-block"]), Settings())
    assert same.predicted.memory_categories == same.baseline.memory_categories
    assert same.predicted.memory_categories == _summary_categories(plain_gpu["h100-fsdp2-fake8-block"])


def _cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    from fsdpviz.cli import main

    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert not exc.value.code
    out: str = capsys.readouterr().out
    return out


def test_the_terminal_says_what_is_unknown_and_what_is_assumed(gpu_fsdp_dir: Path, tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    """The terminal shows the unknown peak as "-" with the note, and the Adam assumption in the headline."""
    shutil.copytree(PLAIN_CPU[0], tmp_path / "cpu")
    out = _cli(["whatif", str(tmp_path / "cpu"), "--world-size", "4", "-q"], capsys)
    peak = next(line for line in out.splitlines() if line.strip().startswith("peak allocated"))
    assert peak.split()[-1] == "-"
    assert "unknown at the peak (-): sharded parameters, optimizer state:" in out
    assert "world size 2 -> 4: not predicted" in out
    shutil.copytree(gpu_fsdp_dir / "h100-fsdp2-fake8-block" / "traces", tmp_path / "gpu")
    out = _cli(["whatif", str(tmp_path / "gpu"), "--world-size", "2", "-q"], capsys)
    # the headline: the warnings on this recording (its replay misses by more than 10 %), then what was assumed
    head = [line for line in out.splitlines()[1:] if not line.startswith("warning: ")]
    assert head[0].startswith("assumed: the optimizer state, which the recording did not measure: 2 states")
    assert "assumed in the predicted peak: optimizer state:" in out


def test_a_peak_the_models_ranks_hold_no_sample_of_says_so() -> None:
    """By construction: a run whose summary has a peak (5 MiB, from ranks the model does not read) while
    the ranks it reads hold no memory sample; and one without a peak or a note (traces the summary did not
    say anything of). Each null peak gets its reason, never a bare dash."""
    from fsdpviz.structure.records import NO_MEMORY, Note
    from fsdpviz.whatif.known import peak_unknown_note

    said = peak_unknown_note([], 5 * 2**20, [0, 9, 18])
    assert said == ("peak memory unknown: the model's rank(s) (0, 9, 18) hold no memory samples in the steps it "
                    "reads, though the summary's peak (5.00 MiB) holds other ranks' samples")
    assert peak_unknown_note([], None, [0]) == "the peak memory is null: the analysed steps hold no memory samples"
    note = Note(NO_MEMORY, "no memory in the analysed steps: it was recorded with --no-memory (run.json)")
    assert peak_unknown_note([Note("other", "x"), note], None, [0]) == str(note)


def _explored_rows(run: Path) -> list[dict]:
    """Every setting ``whatif --explore --json`` predicted for ``run`` (the skipped ones have no prediction)."""
    from fsdpviz.whatif.explore import explore

    out = explore(read_model(analyse([run], cache=False))).to_json()
    return [c for key in ("ranked", "within_spread", "unranked") for c in out[key]]


def test_explores_null_peaks_say_why_row_by_row(gpu_h200_dir: Path, tmp_path: Path) -> None:
    # GIVEN H200 model B recorded with --no-memory (Bl): no setting's peak can be predicted
    shutil.copytree(gpu_h200_dir / "Bl", tmp_path / "Bl", ignore=shutil.ignore_patterns(".fsdpviz-cache"))
    rows = _explored_rows(tmp_path / "Bl")
    assert len(rows) > 3
    # THEN every row's null peak carries the reason a single prediction gives: the recording's --no-memory
    for row in rows:
        assert row["peak_allocated_bytes"] is None and row["fits_budget"] is None
        assert row["peak_unknown"].startswith(
            "no memory in the analysed steps: it was recorded with --no-memory (run.json)"), row["setting"]


def test_explores_predicted_peaks_carry_no_reason(tmp_path: Path) -> None:
    # GIVEN the bundled FSDP2 sample, recorded with memory: every explored setting's peak is predicted
    shutil.copytree(REPO / "sample_traces" / "fsdp2-cpu-2rank", tmp_path / "fsdp2",
                    ignore=shutil.ignore_patterns(".fsdpviz-cache"))
    rows = _explored_rows(tmp_path / "fsdp2")
    assert len(rows) > 3
    for row in rows:
        assert isinstance(row["peak_allocated_bytes"], int) and row["peak_allocated_bytes"] > 0, row["setting"]
        assert "peak_unknown" in row and row["peak_unknown"] is None
