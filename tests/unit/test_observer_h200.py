"""What the recorder's old per-unit timers did to the clean steps, on model B recorded on an H200 beside
bare runs of the same machine and hour (``../shared/traces/gpu-h200/README.md``): the folders were
recorded before unit-timed steps, when the timers clocked every unit in every step.

Truth: the bare step times in ``truth-B.json`` (separate processes) and ``inproc-B.jsonl`` (in-process
rounds), measured by the training script itself without fsdpviz."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fsdpviz.analysis.pipeline import analyse
from fsdpviz.structure.records import CLEAN_STEPS_UNIT_TIMED


def _bare_ms(folder: Path, setting: str) -> list[float]:
    """Every bare measurement of ``setting``: the separate processes' and the in-process rounds'."""
    out = list(json.loads((folder / "truth-B.json").read_text())["settings"][setting]["steps_ms"])
    for line in (folder / "inproc-B.jsonl").read_text().splitlines():
        out.extend(row[setting] for row in json.loads(line)["rounds_ms"])
    return out


@pytest.mark.parametrize("name", ["B", "Bl"])
def test_clean_steps_that_timed_every_unit_are_slower_than_every_bare_run_and_the_summary_says_so(
        name: str, gpu_h200_dir: Path) -> None:
    summary = analyse([gpu_h200_dir / name], cache=False).summary
    bare = _bare_ms(gpu_h200_dir, "block")
    assert len(bare) == 12
    # the recorded clean steps, which timed 12 units each, against every bare measurement of the setting
    assert summary.step_time_source == "timers" and summary.step_time_ms is not None
    assert summary.step_time_ms > max(bare)
    assert summary.has_note(CLEAN_STEPS_UNIT_TIMED)
    # the per-unit timers still read from those steps, as recorded
    blocks = [u for u in summary.units if u.name.startswith("blocks.")]
    assert len(blocks) == 12 and all(u.forward_timer_ms and u.backward_timer_ms for u in blocks)


def test_with_one_unit_the_old_clean_steps_match_bare(gpu_h200_dir: Path) -> None:
    """The cost grew with the units: with the root wrap (one unit) the recorded clean steps were bare."""
    summary = analyse([gpu_h200_dir / "Broot"], cache=False).summary
    bare = _bare_ms(gpu_h200_dir, "root")
    assert summary.step_time_ms is not None
    assert min(bare) * 0.95 <= summary.step_time_ms <= max(bare) * 1.10


def test_whatif_says_the_clean_steps_timed_every_unit_as_the_summary_does(
        gpu_h200_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A prediction's baseline is the run's step (the timers'): the summary's words about that clock go
    with it, on the terminal and in the JSON of a setting and of --explore."""
    from fsdpviz.cli import main

    def whatif(*argv: str) -> str:
        capsys.readouterr()
        with pytest.raises(SystemExit) as done:
            main(["whatif", *argv, "-q", "--no-cache"])
        out, err = capsys.readouterr()
        assert done.value.code in (0, None), err
        return str(out)

    said = "its step time holds the timers' cost: on a launch-bound GPU step 25-50 % above a bare run"
    assert said in whatif(str(gpu_h200_dir / "B"), "--wrap", "root")
    assert any(said in n for n in json.loads(whatif(str(gpu_h200_dir / "B"), "--explore", "--json"))["notes"])
