"""compare's default labels: each run's folder name, and where folders share a name (every recording
folder named ``run``) as many parent folders as tell them apart; the same folder twice keeps ``#2``."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from fsdpviz.analysis.compare.runs import unique_labels
from fsdpviz.report.compare.build import default_labels, load_runs
from fsdpviz.trace.loader import load_traces
from fsdpviz.trace.tables import TraceSet

RECORDED = Path(__file__).resolve().parents[1] / "recorded"
SAMPLES = Path(__file__).resolve().parents[2] / "sample_traces"
# Two committed recordings in the recorder's layout (NAME/run, run.json labelled "run"), the smallest
# there are: a label is read off the folders and run.json, never the traces, so their size is only time.
SMALL = ("groups", "memory-sgd-momentum+keep-grads")


@pytest.fixture(scope="module")
def labels_of() -> Callable[[list[Path]], list[str]]:
    """``labels_of(folders)``: the labels compare gives ``folders`` (:func:`load_runs`' own rule on the runs
    loaded, not analysed: a label is read off the folder and its run.json alone). Each folder is loaded
    once for the module, however many lists it is in: the rule reads nothing a second load would change."""
    loaded: dict[Path, TraceSet] = {}

    def labels(folders: list[Path]) -> list[str]:
        for f in folders:
            if f not in loaded:
                loaded[f] = load_traces([f], cache=False, progress=False)
        return default_labels([(f, loaded[f]) for f in folders])

    return labels


def test_runs_in_folders_of_one_name_are_named_by_their_parents(tmp_path: Path,
                                                                labels_of: Callable[[list[Path]], list[str]]) -> None:
    paths = [RECORDED / name / "run" for name in SMALL]
    assert all(p.name == "run" for p in paths)
    runs = load_runs(paths, cache=False)
    assert [r.label for r in runs] == [f"{name}/run" for name in SMALL]
    # two parents deep where one does not tell them apart; a folder of another name keeps its label
    # (run.json's, "run": the recorder's folder then)
    for name in ("a", "b"):
        shutil.copytree(paths[0], tmp_path / name / "x" / "run")
    shutil.copytree(paths[1], tmp_path / "root")
    folders = [tmp_path / "a" / "x" / "run", tmp_path / "b" / "x" / "run", tmp_path / "root"]
    assert labels_of(folders) == ["a/x/run", "b/x/run", "run"]
    # one folder twice: nothing tells them apart but the order; beside another of its name, its parent
    assert labels_of([paths[0], paths[0]]) == ["run", "run #2"]
    assert labels_of([paths[0], paths[0], paths[1]]) == [
        f"{SMALL[0]}/run", f"{SMALL[0]}/run #2", f"{SMALL[1]}/run"]
    # as many parents as it takes: a/x/y/run against b/x/y/run
    for name in ("a", "b"):
        shutil.copytree(paths[1], tmp_path / "deep" / name / "x" / "y" / "run")
    deep = [tmp_path / "deep" / n / "x" / "y" / "run" for n in ("a", "b")]
    assert labels_of(deep) == ["a/x/y/run", "b/x/y/run"]
    # a label run.json gives is kept as given (the samples' run.json name them)
    sample = SAMPLES / "fsdp2-cpu-2rank"
    assert labels_of([sample, sample]) == ["fsdp2-cpu-2rank", "fsdp2-cpu-2rank #2"]


def test_a_folder_named_as_another_runs_label_is_named_by_its_parent(
        tmp_path: Path, labels_of: Callable[[list[Path]], list[str]]) -> None:
    # run.json names the first run "fsdp2-cpu-2rank" though its folder is "renamed"; the second is a folder
    # of bare traces (no run.json) whose name is that label: the label a run.json gives stays, in either order
    shutil.copytree(SAMPLES / "fsdp2-cpu-2rank", tmp_path / "a" / "renamed",
                    ignore=shutil.ignore_patterns(".fsdpviz-cache"))
    shutil.copytree(SAMPLES / "fsdp1-cpu-2rank" / "traces", tmp_path / "b" / "fsdp2-cpu-2rank",
                    ignore=shutil.ignore_patterns(".fsdpviz-cache"))
    labelled, bare = tmp_path / "a" / "renamed", tmp_path / "b" / "fsdp2-cpu-2rank"
    assert not (bare / "run.json").exists()
    assert labels_of([labelled, bare]) == ["fsdp2-cpu-2rank", "b/fsdp2-cpu-2rank"]
    assert labels_of([bare, labelled]) == ["b/fsdp2-cpu-2rank", "fsdp2-cpu-2rank"]


def test_a_repeat_never_takes_a_label_another_run_has() -> None:
    # two runs labelled "x" beside one labelled "x #2" (run.json's or a folder's): the repeat is "x #3"
    assert unique_labels(["x", "x", "x #2"]) == ["x", "x #3", "x #2"]
    assert unique_labels(["x #2", "x", "x", "x"]) == ["x #2", "x", "x #3", "x #4"]
    assert unique_labels(["a", "b", "a"]) == ["a", "b", "a #2"]
