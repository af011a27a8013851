"""compare's best mark on memory follows the memory finding's rule: runs within 2 % of each other get no
star, and the finding and the table say the same. The two CPU samples' peaks are 104 bytes apart (the
allocator's own figures, to the byte); one of their units' peaks differs beyond it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from fsdpviz.analysis.compare.model import Comparison
from fsdpviz.analysis.compare.runs import compare_runs, comparison_json
from fsdpviz.analysis.compare.spread import MEMORY_NOISE
from fsdpviz.analysis.pipeline import LabelledRun, RunResult, analyse
from fsdpviz.formatting import bytes_text

SAMPLES = Path(__file__).parents[2] / "sample_traces"


@pytest.fixture(scope="module")
def again() -> Callable[[str], RunResult]:
    """``again(name)``: ``sample_traces/NAME`` analysed a second time, once for the module, apart from
    ``sample_run``'s: a sample given twice is two analyses of the same trace files, as ``load_runs``
    makes them, so that their peaks being one is the pipeline's answer, not one object read twice."""
    made: dict[str, RunResult] = {}

    def get(name: str) -> RunResult:
        if name not in made:
            made[name] = analyse([SAMPLES / name], cache=False)
        return made[name]

    return get


def _compare(runs: list[tuple[str, RunResult]], labels: list[str]) -> Comparison:
    """``compare_runs`` of the analysed samples ``(name, result)`` under ``labels``, as ``load_runs``
    gives them to it (compare only reads the results, so the session's analyses serve every test)."""
    return compare_runs([LabelledRun(label=label, source=str(SAMPLES / name), result=result)
                         for label, (name, result) in zip(labels, runs, strict=True)])


def test_peaks_within_the_memory_findings_rule_get_no_star(sample_run: Callable[[str], RunResult]) -> None:
    names = ["fsdp2-cpu-2rank", "fsdp1-cpu-2rank"]
    c = _compare([(n, sample_run(n)) for n in names], ["a", "b"])
    key = "memory.peak_allocated_bytes"
    a, b = c.values[key]
    assert a is not None and b is not None and a != b and abs(a - b) <= MEMORY_NOISE * max(a, b)
    assert c.best[key] == [] and "within 2%" in c.best_withheld[key]
    (memory,) = [f for f in c.findings if f.kind == "memory"]
    assert memory.better is None and "within 2%" in memory.message
    # a unit whose peak differs by more than that keeps its star, one within it does not
    for group in comparison_json(c)["unit_groups"]:
        a, b = (group["values"][label]["peak_allocated_bytes"] for label in c.labels)
        if a is None or b is None or a == b:
            continue
        starred = bool(group["best"].get("peak_allocated_bytes"))
        assert starred == (abs(a - b) > MEMORY_NOISE * max(a, b)), (group["name"], a, b)


def test_a_tie_at_the_lowest_peak_is_said_as_the_table_stars_it(sample_run: Callable[[str], RunResult]) -> None:
    """The three CPU samples: FSDP1's and FSDP2's peaks are within 2 % of each other (104 bytes), ZeRO-3's
    more than 2 % above both. The table stars no run; the finding names both lowest runs, ranks neither
    (``better`` null, as the star) and gives ZeRO-3's excess over the lowest."""
    names = ["fsdp2-cpu-2rank", "fsdp1-cpu-2rank", "zero3-cpu-2rank"]
    c = _compare([(n, sample_run(n)) for n in names], names)
    key = "memory.peak_allocated_bytes"
    peaks = dict(zip(names, c.values[key]))
    low = min(peaks.values())
    tied = sorted(n for n, v in peaks.items() if v - low <= MEMORY_NOISE * v)
    assert tied == ["fsdp1-cpu-2rank", "fsdp2-cpu-2rank"]
    assert peaks["zero3-cpu-2rank"] - low > MEMORY_NOISE * peaks["zero3-cpu-2rank"]
    assert c.best[key] == []
    (memory,) = [f for f in c.findings if f.kind == "memory"]
    assert memory.better is None
    lowest = min(names, key=lambda n: peaks[n])
    other = next(n for n in tied if n != lowest)
    assert memory.message.startswith(f"{lowest} and {other} have the lowest peak allocated memory, within 2% of "
                                     "each other (")
    assert f"so none is ranked first; zero3-cpu-2rank holds {bytes_text(peaks['zero3-cpu-2rank'] - low)} more than " \
        f"{lowest}." in memory.message


def test_runs_the_same_to_the_byte_are_all_starred_and_all_named(sample_run: Callable[[str], RunResult],
                                                                   again: Callable[[str], RunResult]) -> None:
    """One sample given twice beside ZeRO-3's: the two peaks are one (the same trace files), and ZeRO-3's is
    more than 2 % above. The table stars both; the finding names both as the lowest, ranking neither above
    the other."""
    names = ["fsdp2-cpu-2rank", "fsdp2-cpu-2rank", "zero3-cpu-2rank"]
    c = _compare([(names[0], sample_run(names[0])), (names[1], again(names[1])), (names[2], sample_run(names[2]))],
                 ["a", "b", "zero3"])
    key = "memory.peak_allocated_bytes"
    a, b, z = c.values[key]
    assert a == b and z is not None and a is not None and z - a > MEMORY_NOISE * z
    assert [c.labels[i] for i in c.best[key]] == ["a", "b"]
    (memory,) = [f for f in c.findings if f.kind == "memory"]
    assert memory.better is None
    assert memory.message.startswith(f"a and b have the lowest peak allocated memory, the same to the byte: "
                                     f"{bytes_text(a)}, {bytes_text(z - a)} less than zero3.")


def test_one_run_given_twice_is_the_same_to_the_byte(sample_run: Callable[[str], RunResult],
                                                     again: Callable[[str], RunResult]) -> None:
    """The same trace files twice: one peak, which the finding says as one, not as a range within 2 %."""
    name = "fsdp1-cpu-2rank"
    c = _compare([(name, sample_run(name)), (name, again(name))], ["a", "b"])
    a, b = c.values["memory.peak_allocated_bytes"]
    assert a == b and a is not None
    (memory,) = [f for f in c.findings if f.kind == "memory"]
    assert memory.better is None
    assert memory.message == f"Peak allocated memory is the same to the byte across runs ({bytes_text(a)})."
