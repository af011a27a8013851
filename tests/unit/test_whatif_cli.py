"""``fsdpviz whatif`` as scripts and users run it: JSON contract, table, page, --save, --explore, bad input.

The run is a synthetic GPU FSDP2 run folder (4 blocks + root, 2 ranks); its recorded numbers are the
ones ``fsdpviz summary --json`` reports for it, the independent reference for the baseline. Its ranks
share one timeline (every rank the same), so more of them would only make each command here analyse
more copies of one rank; two keep the collectives between ranks that the settings move.
"""

from __future__ import annotations

import html
import json
import re
from pathlib import Path

import pytest
from helpers.kineto import TraceBuilder
from synth import Scenario, generate_run, make_root, make_units

from fsdpviz.cli import main
from fsdpviz.formatting import format_ms

SCENARIO = Scenario(units=make_units(4, numel=8_000_000), root=make_root(), world_size=2, ring_comm=True,
                    steps=(3, 4), shared_timeline=True)


@pytest.fixture(scope="module")
def run_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return generate_run(SCENARIO, tmp_path_factory.mktemp("whatif-cli"), run_folder=True).folder


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    out, err = capsys.readouterr()
    return int(exc.value.code or 0), out, err


def test_json_baseline_is_the_summary(run_folder: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(["summary", "--json", "--no-cache", str(run_folder)], capsys)
    assert code == 0
    summary = json.loads(out)
    code, out, _ = _run(["whatif", str(run_folder), "--prefetch", "none", "--json", "-q"], capsys)
    assert code == 0
    data = json.loads(out)
    base, pred = data["baseline"], data["predicted"]
    # the change is simulated on the traced steps: the baseline is the summary's traced step, not its headline
    assert data["basis"] == "traced" and base["step_time_ms"] == summary["traced_step_time_ms"]
    assert base["exposed_comm_ms"] == summary["overlap"]["exposed_comm_ms"]
    assert [u["name"] for u in base["units"]] == [u["name"] for u in summary["units"]]
    assert base["peak_allocated_bytes"] == max(r["peak_allocated_bytes"]
                                               for r in summary["memory"]["per_rank"].values())
    # no prefetch: every all-gather waits for the compute before it, so the step gets longer
    assert pred["step_time_ms"] > base["step_time_ms"]
    assert pred["settings"]["prefetch"]["value"] == "none" and pred["settings"]["prefetch"]["source"] == "given"
    arguments = pred["settings"]["prefetch"]["arguments"]
    assert arguments["set_modules_to_forward_prefetch"] == "[] for every unit (FSDP2's default)"
    assert arguments["set_modules_to_backward_prefetch"].startswith("cannot be said")
    assert data["apply"]["code"] is None  # no code: a plain trace's units list no parameters
    assert pred["settings"]["wrap"] == {"value": "recorded", "source": "recorded"}


def test_table_page_and_saved_prediction(run_folder: Path, tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    page = tmp_path / "whatif.html"
    code, out, err = _run(["whatif", str(run_folder), "--wrap", "merge:2", "-o", str(page), "--save"], capsys)
    assert code == 0, err
    assert re.search(r"step time\s+[\d.,]+ ms\s+[\d.,]+ ms\s+[+-][\d.,]+ ms \([+-][\d.]+ %\)", out)
    assert "[blocks.0, blocks.1]" in out and "[blocks.2, blocks.3]" in out
    assert "wrap merge:2 (given)" in out
    # not given, the units keep what their recorded resharding says: said so, not as a count of 0 that
    # --keep-last-units refuses
    assert "keep last units as recorded" in out and "keep last units 0" not in out
    html = page.read_text()
    assert "One step, recorded and predicted" in html and "PREDICTED (not recorded)" in html
    assert "<script src=" not in html  # offline: bokeh inlined
    # a plain trace's units list no parameters: the page says there is no code, and why
    assert "No code for this setting: not resolved: blocks.0, blocks.1" in html and '<details class="code">' not in html
    saved = sorted((run_folder / "predictions").glob("*.json"))
    assert [p.name for p in saved] == ["wrap-merge-2.json"]
    saved_json = json.loads(saved[0].read_text())
    assert saved_json["name"] == "wrap merge:2"
    # the report and compare show it beside the recording, marked as predicted, with its numbers
    report = tmp_path / "report.html"
    code, _, err = _run(["report", str(run_folder), "-o", str(report), "-q"], capsys)
    assert code == 0, err
    html = report.read_text()
    assert "Predicted settings" in html and "wrap merge:2 (predicted)" in html
    assert format_ms(saved_json["predicted"]["step_time_ms"]) in html
    compared = tmp_path / "compare.html"
    code, _, err = _run(["compare", str(run_folder), str(run_folder), "--label", "a", "--label", "b",
                         "-o", str(compared), "-q"], capsys)
    assert code == 0, err
    html = compared.read_text()
    assert "a: wrap merge:2 (predicted)" in html and "b: wrap merge:2 (predicted)" in html
    (run_folder / "predictions" / "wrap-merge-2.json").unlink()


def test_explore_ranks_within_the_budget(run_folder: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(["whatif", str(run_folder), "--explore", "--json", "-q"], capsys)
    assert code == 0
    data = json.loads(out)
    assert data["memory_budget_bytes"] == 85_031_714_816  # the trace's H100
    ranked = data["ranked"]
    names = [c["setting"] for c in (*ranked, *data["within_spread"])]
    assert {"as recorded", "prefetch 1", "prefetch 2", "prefetch none", "wrap merge:2", "wrap root"} <= set(names)
    fitting = [c["step_time_ms"] for c in ranked if c["fits_budget"]]
    assert fitting == sorted(fitting)
    # each setting's values are filled in as a single whatif --json says them (world size 0 was said
    # with the source "recorded" for the trace's world size)
    wrap = next(c for c in (*ranked, *data["within_spread"]) if c["setting"] == "wrap root")
    code, out, _ = _run(["whatif", str(run_folder), "--wrap", "root", "--json", "-q"], capsys)
    single = json.loads(out)["predicted"]["settings"]
    assert code == 0 and wrap["settings"] == single
    assert single["world_size"]["value"] == SCENARIO.world_size == 2  # the scenario's ranks
    # a budget below the recorded peak: nothing fits but what uses less memory
    base_peak = data["baseline"]["peak_allocated_bytes"]
    code, out, _ = _run(["whatif", str(run_folder), "--explore", "--json", "-q", "--memory-budget",
                         str(base_peak - 1)], capsys)
    tight = json.loads(out)
    assert tight["memory_budget_source"] == "given"
    for c in (*tight["ranked"], *tight["within_spread"]):
        assert c["fits_budget"] == (c["peak_allocated_bytes"] <= base_peak - 1)
    # settings that do not fit are apart, with how much they exceed; the recorded one among them
    assert "as recorded" in {c["setting"] for c in tight["over_budget"]}
    for c in tight["over_budget"]:
        assert not c["fits_budget"] and c["over_budget_bytes"] == c["peak_allocated_bytes"] - (base_peak - 1) > 0
    # every setting leaves a bound; the recorded one, whose peak is the budget plus one byte: memory
    recorded = next(c for c in tight["over_budget"] if c["setting"] == "as recorded")["bound"]
    assert recorded["kind"] == "memory" and recorded["time_kind"] in {"compute", "communication", "host", "mixed"}
    assert all(c["bound"]["kind"] in {"compute", "communication", "host", "mixed", "memory"}
               for c in [*tight["ranked"], *tight["within_spread"], *tight["over_budget"]])


def test_explore_on_cpu_counts_what_it_lists_without_a_budget(capsys: pytest.CaptureFixture[str]) -> None:
    sample = Path(__file__).parents[2] / "sample_traces" / "fsdp2-cpu-2rank"
    code, out, err = _run(["whatif", str(sample), "--explore", "--no-cache"], capsys)
    assert code == 0
    lines = out.splitlines()
    # a CPU trace states no device memory: no budget, said so, and nothing called memory-bound
    assert "memory budget none: the trace does not state the device's memory" in lines[0]
    rows = [line.split() for line in lines[1:] if line.strip()[:1].isdigit() or line.strip()[:2] == "- "]
    skipped = [line for line in lines if line.startswith("not tried: ")]
    assert rows and all(row[-1] in {"compute", "communication", "mixed"} for row in rows), out
    ranked = [row for row in rows if row[0] != "-"]
    assert [int(row[0]) for row in ranked] == list(range(1, len(ranked) + 1))
    assert "over the budget" not in out
    # a setting within the recording's own step-to-step spread is listed, not ranked; the fastest is a ranked one
    assert (len(ranked) < len(rows)) == ("not measurable in this recording (within the recording's step-to-step spread" in out)
    # "fastest" names a ranked setting predicted faster than the recording, or there is none to name
    faster = [row for row in ranked if row[row.index("ms") + 1].startswith("-")]  # the step's change
    assert bool(faster) == any(line.startswith("fastest: ") for line in lines), out
    assert bool(faster) != any(line.startswith("no setting is predicted measurably faster") for line in lines)
    counted = re.search(r"fsdpviz: (\d+) setting\(s\) predicted(?:, (\d+) not tried)? in", err)
    assert counted, err
    assert int(counted.group(1)) == len(rows) and int(counted.group(2) or 0) == len(skipped)
    data = json.loads(_run(["whatif", str(sample), "--explore", "--json", "-q"], capsys)[1])
    assert data["memory_budget_bytes"] is None and not data["over_budget"]
    assert len(data["ranked"]) == len(ranked) and len(data["within_spread"]) == len(rows) - len(ranked)


def test_one_setting_gives_the_split_explore_gives_it_and_its_table_adds_up(capsys: pytest.CaptureFixture[str],
                                                                           tmp_path: Path) -> None:
    # one figure per quantity: whatif --wrap root's split of its predicted step is --explore's row of wrap root,
    # part for part, note included
    sample = str(Path(__file__).parents[2] / "sample_traces" / "fsdp2-cpu-2rank")
    one = json.loads(_run(["whatif", sample, "--wrap", "root", "--json", "-q", "--no-cache"], capsys)[1])
    grid = json.loads(_run(["whatif", sample, "--explore", "--json", "-q", "--no-cache"], capsys)[1])
    row = next(c for c in [*grid["ranked"], *grid["within_spread"], *grid["unranked"]] if c["setting"] == "wrap root")
    assert one["bound"] == row["bound"] and one["bound"]["step_ms"] == one["predicted"]["step_time_ms"]
    # a CPU thread's FSDP work under one root unit is simulated: one unit's hooks and one gather's host
    # work are left of the recorded units', not none (the recording of one root unit holds its own)
    assert 0 < one["bound"]["fsdp_overhead_ms"] < grid["baseline"]["step_time_ms"]
    # the terminal's table: compute, FSDP's per-unit work, exposed communication and idle add up to the step
    code, out, _ = _run(["whatif", sample, "--wrap", "root", "-q", "--no-cache"], capsys)
    assert code == 0
    cells = {m[1]: [float(m[2]), float(m[3])] for line in out.splitlines()
             if (m := re.match(r"^  (\S.*?)\s{2,}([\d.]+) ms\s+([\d.]+) ms", line))}
    # a CPU rank: no host wait (nothing waits for the host), so the idle row is other idle alone
    assert one["bound"]["host_wait_ms"] is None and "idle (host wait" not in out
    parts = ("compute", "FSDP per-unit work", "exposed communication", "other idle")
    for column in (0, 1):  # recorded, predicted
        assert sum(cells[p][column] for p in parts) == pytest.approx(cells["step time"][column], abs=0.03), cells
    assert one["bound"]["note"] is None or f"note: {one['bound']['note']}" in out
    # the page's table holds the same rows, the recorded column the summary's bound, to the µs
    bound = json.loads(_run(["summary", sample, "--json", "-q", "--no-cache"], capsys)[1])["bound"]
    page = tmp_path / "root.html"
    assert _run(["whatif", sample, "--wrap", "root", "-q", "--no-cache", "-o", str(page)], capsys)[0] == 0
    visible = re.sub(r"<(script|style)\b.*?</\1>", "", page.read_text(), flags=re.DOTALL)
    text = " ".join(html.unescape(re.sub(r"<[^>]+>", " ", visible)).split())
    split = one["bound"]
    assert f"FSDP per-unit work {bound['fsdp_overhead_ms']:,.3f} ms {split['fsdp_overhead_ms']:,.3f} ms" in text
    assert f"other idle {bound['other_idle_ms']:,.3f} ms {split['other_idle_ms']:,.3f} ms" in text
    assert split["note"] is None or split["note"][1:] in text


def test_a_ranked_list_with_nothing_faster_says_so_above_it(capsys: pytest.CaptureFixture[str]) -> None:
    # the ZeRO-3 sample: prefetch none is predicted measurably slower, the other settings within the spread;
    # ranked alone, a slower first row reads as advice, so the heading says none is faster
    sample = Path(__file__).parents[2] / "sample_traces" / "zero3-cpu-2rank"
    data = json.loads(_run(["whatif", str(sample), "--explore", "--json", "-q", "--no-cache"], capsys)[1])
    base = data["baseline"]["step_time_ms"]
    assert data["ranked"] and all(c["step_time_ms"] > base for c in data["ranked"])
    code, out, _ = _run(["whatif", str(sample), "--explore", "-q", "--no-cache"], capsys)
    assert code == 0
    lines = out.splitlines()
    heading = next(i for i, line in enumerate(lines) if line.startswith("ranked by predicted step time"))
    assert lines[heading] == ("ranked by predicted step time, each measurably faster or slower than the recording "
                              f"(none faster than its {base:,.2f} ms):")
    assert lines[heading + 2].split()[:3] == ["1", "prefetch", "none"]


@pytest.mark.parametrize(("sample", "framework", "expected"), [
    ("fsdp1-cpu-2rank", "FSDP1's default", "forward_prefetch=False, backward_prefetch=BACKWARD_PRE"),
    ("fsdp2-cpu-2rank", "FSDP2's default", "set_modules_to_forward_prefetch=not called"),
])
def test_the_recorded_prefetch_is_named_in_its_framework_s_words(sample: str, framework: str, expected: str,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """The settings line names a recording's default prefetch as its own framework's default, and the
    arguments it gives are what the recorder read from the framework (run.json, read as plain JSON)."""
    folder = Path(__file__).parents[2] / "sample_traces" / sample
    units = json.loads((folder / "run.json").read_text())["units"]
    if sample.startswith("fsdp1"):  # FSDP1's own arguments, as the recorder read them off its modules
        assert {(u["forward_prefetch"], u["backward_prefetch"]) for u in units} == {(False, "BACKWARD_PRE")}
    else:  # no explicit set_modules_to_*_prefetch lists: FSDP2's implicit prefetch
        assert not any(isinstance(u[k], list) and u[k] for u in units for k in ("forward_prefetch", "backward_prefetch"))
    code, out, _ = _run(["whatif", str(folder), "--wrap", "root", "--no-cache", "-q"], capsys)
    assert code == 0
    (line,) = [line for line in out.splitlines() if line.startswith("settings: ")]
    prefetch = next(part for part in line.removeprefix("settings: ").split("; ") if part.startswith("prefetch "))
    assert prefetch.startswith(f"prefetch implicit, {framework}: one unit ahead in backward"), prefetch
    assert f"(recorded: {expected}" in prefetch


def test_a_recorded_backward_post_and_unsaid_arguments_are_named_as_they_are(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """FSDP1 recorded with ``BACKWARD_POST`` (the sample's run.json said so, by construction) is not
    called FSDP1's default; traces without run.json say the prefetch was assumed, not recorded as a setting."""
    import shutil

    samples = Path(__file__).parents[2] / "sample_traces"
    post = tmp_path / "fsdp1-post"
    shutil.copytree(samples / "fsdp1-cpu-2rank", post)
    run = json.loads((post / "run.json").read_text())
    for unit in run["units"]:
        unit["backward_prefetch"] = "BACKWARD_POST"
    (post / "run.json").write_text(json.dumps(run))

    def prefetch_words(folder: Path) -> str:
        code, out, _ = _run(["whatif", str(folder), "--wrap", "root", "--no-cache", "-q"], capsys)
        assert code == 0
        (line,) = [line for line in out.splitlines() if line.startswith("settings: ")]
        return next(part for part in line.removeprefix("settings: ").split("; ") if part.startswith("prefetch "))

    said = prefetch_words(post)
    assert said.startswith("prefetch implicit, one unit ahead in backward (BACKWARD_POST)"), said
    assert "BACKWARD_PRE" not in said and "default" not in said
    plain = prefetch_words(samples / "fsdp2-cpu-2rank-plain")
    assert plain.startswith("prefetch implicit, assumed the framework's default: the recording does not say"), plain
    # and --json says why its arguments are null
    data = json.loads(_run(["whatif", str(samples / "fsdp2-cpu-2rank-plain"), "--wrap", "root", "--json", "-q"],
                           capsys)[1])
    prefetch = data["predicted"]["settings"]["prefetch"]
    assert prefetch["arguments"] is None and "does not say its prefetch arguments" in prefetch["arguments_unknown"]
    # FSDP2 with backward lists only (set_modules_to_backward_prefetch, by construction): not FSDP2's default
    backward = tmp_path / "fsdp2-backward"
    shutil.copytree(samples / "fsdp2-cpu-2rank", backward)
    run = json.loads((backward / "run.json").read_text())
    order = [u["unit"] for u in run["units"]]
    for i, unit in enumerate(run["units"]):
        unit["forward_prefetch"], unit["backward_prefetch"] = [], list(reversed(order[1:]))[i:i + 1] if i else []
    (backward / "run.json").write_text(json.dumps(run))
    lists = prefetch_words(backward)
    assert lists.startswith("prefetch implicit in forward (none ahead), the previous 1 unit(s) in backward"), lists
    assert "default" not in lists.split("(recorded")[0]


def test_a_merged_fsdp1_unit_without_parameter_sizes_says_what_its_memory_took(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The FSDP1 sample's traces alone (no run.json: no unit's parameters listed) cannot tell a merged
    unit's parameter gradients from its other gradient blocks: the prediction says what it held instead;
    with run.json beside them it does not."""
    import shutil

    sample = Path(__file__).parents[2] / "sample_traces" / "fsdp1-cpu-2rank"
    shutil.copytree(sample / "traces", tmp_path / "traces")
    assert not (tmp_path / "traces" / "run.json").exists()

    def memory_notes(folder: Path) -> list[str]:
        data = json.loads(_run(["whatif", str(folder), "--wrap", "root", "--json", "-q", "--no-cache"], capsys)[1])
        return [n for n in data["notes"] if n.startswith("memory: a merged FSDP1 unit")]

    (note,) = memory_notes(tmp_path / "traces")
    assert "does not list its units' parameters" in note
    assert memory_notes(sample) == []


def _no_units_trace(tmp: Path) -> Path:
    b = TraceBuilder(rank=0)
    b.step(1, 0, 1000).step(2, 1000, 1000).step(3, 2000, 1000)
    b.kernel("volta_sgemm_128x64_nn", 1100, 100, launch_us=1010)
    return b.write(tmp / "plain.json")


@pytest.mark.parametrize("argv, message", [
    (["--wrap", "merge:0"], "merge:K needs a whole number K of at least 1"),
    (["--wrap", "pairs"], "use root (one unit for the whole model), merge:K"),
    (["--wrap", "pair"], "did you mean --wrap merge:2?"),
    (["--wrap", "merge"], "did you mean --wrap merge:2?"),
    (["--wrap", "3"], "did you mean --wrap merge:3?"),
    (["--wrap", "whole"], "did you mean --wrap root?"),
    (["--wrap", "match:^decoder"], "matches none of the recorded units' modules"),
    (["--prefetch", "-1"], "use implicit, none or a number"),
    (["--world-size", "0"], "needs at least 1 rank"),
    (["--keep-last-units", "0"], "--keep-last-units 0: needs at least 1 unit"),
    (["--keep-last-units", "5"], "--keep-last-units 5: the recording has 4 non-root unit(s)"),
    (["--reshard-after-forward", "maybe"], "use true or false"),
    (["--inter-node-gbps", "inf"], "--inter-node-gbps inf: needs a finite bandwidth above 0"),
    (["--inter-node-gbps", "nan"], "--inter-node-gbps nan: needs a finite bandwidth above 0"),
    (["--explore", "--keep-last-units", "1"], "--explore tries its own grid of settings: leave out --keep-last-units 1"),
    (["--explore", "--gpus-per-node", "1"], "leave out --gpus-per-node 1"),
    (["--explore", "--memory-budget", "lots"], "use a size with its unit, e.g. 70GiB"),
    (["--explore", "--memory-budget", "5"], "5 bytes is surely not meant; give the unit, e.g. 5GiB or 5GB"),
    (["--explore", "--memory-budget", "40.5"], "give the unit, e.g. 40.5GiB"),
    (["--explore", "--memory-budget", "0GiB"], "needs more than 0 bytes"),
    (["--memory-budget", "1GiB"], "add --explore"),
    (["-o", "/no/such/folder/page.html"], "does not exist"),
])
def test_bad_options_are_one_error_line(argv: list[str], message: str, run_folder: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _run(["whatif", str(run_folder), "-q", *argv], capsys)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], err
    assert "Traceback" not in err and not out


def test_a_run_without_units_is_one_error_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = _no_units_trace(tmp_path)
    code, _, err = _run(["whatif", str(trace), "--prefetch", "1", "-q"], capsys)
    assert code == 2
    assert err.strip().startswith(f"error: {trace}: ") and "no FSDP units" in err and len(err.strip().splitlines()) == 1


def test_more_ranks_per_node_than_the_run_has_puts_them_all_on_one_host(capsys: pytest.CaptureFixture[str]) -> None:
    """The bundled FSDP2 sample ran 2 ranks on one 2-core host. Three ranks per node for a run of two is
    the two of them on one host, as recorded: compute shares no more cores than it did. Eight per node for
    a run of four is the four on one host, as four per node is (the same prediction, to the µs)."""
    from helpers.cli import json_here

    sample = Path(__file__).parents[2] / "sample_traces" / "fsdp2-cpu-2rank"
    three = json_here(capsys, "whatif", str(sample), "--gpus-per-node", "3", "--json", "-q", "--no-cache")
    assert three["predicted"]["compute_ms"] == three["baseline"]["compute_ms"]
    assert not any("more ranks than cores" in n for n in three["notes"]), three["notes"]
    four, eight = (json_here(capsys, "whatif", str(sample), "--world-size", "4", "--gpus-per-node", n, "--json", "-q",
                             "--no-cache")["predicted"] for n in ("4", "8"))
    assert four["compute_ms"] > three["baseline"]["compute_ms"]  # four ranks on two cores
    assert (eight["step_time_ms"], eight["compute_ms"]) == (four["step_time_ms"], four["compute_ms"])


def test_a_depth_beyond_the_units_is_predicted_as_the_deepest_they_allow(run_folder: Path,
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
    """merge:K wider than any parent's units and a prefetch deeper than the units after the root: the
    prediction is the widest merge's and the deepest prefetch's (the simulator's own answer), and a
    note says so instead of passing the number silently."""
    def predict(*argv: str) -> dict:
        code, out, err = _run(["whatif", str(run_folder), *argv, "--json", "-q", "--no-cache"], capsys)
        assert code == 0, err
        return dict(json.loads(out))

    n = len([u for u in predict("--wrap", "merge:2")["baseline"]["units"] if u["name"] != "(root)"])
    assert n >= 2
    for option, beyond, deepest, said in (("--wrap", "merge:99", f"merge:{n}", f"as wrap merge:{n} does"),
                                          ("--prefetch", "99", str(n), f"as prefetch {n}")):
        far, near = predict(option, beyond), predict(option, deepest)
        assert far["predicted"]["step_time_ms"] == near["predicted"]["step_time_ms"]
        assert far["predicted"]["exposed_comm_ms"] == near["predicted"]["exposed_comm_ms"]
        assert any(said in note for note in far["notes"]) and not any(said in note for note in near["notes"])


def test_whatif_reads_the_steps_summary_is_given(capsys: pytest.CaptureFixture[str]) -> None:
    """--steps / --include-last-step choose the steps the prediction reads, as they choose summary's: its
    baseline is the summary's step for the same steps. The plain sample's trace shows one step complete;
    with its last step there are two, and --explore has a step-to-step spread to rank against."""
    plain = str(Path(__file__).resolve().parents[2] / "sample_traces" / "fsdp2-cpu-2rank-plain")

    def answer(*argv: str) -> dict:
        code, out, err = _run([*argv, plain, "--json", "-q", "--no-cache"], capsys)
        assert code == 0, err
        return dict(json.loads(out))

    read = {}
    for steps in ([], ["--include-last-step"], ["--steps", "3"]):
        summary = read[" ".join(steps)] = answer("summary", *steps)
        prediction = answer("whatif", "--wrap", "merge:2", *steps)
        assert prediction["baseline"]["step_time_ms"] == pytest.approx(summary["step_time_ms"], abs=1e-3), steps
    assert read[""]["steps"] == [2] and read["--include-last-step"]["steps"] == [2, 3] and read["--steps 3"]["steps"] == [3]
    assert answer("whatif", "--explore")["spread_ms"] is None
    assert answer("whatif", "--explore", "--include-last-step")["spread_ms"] > 0


def test_a_host_layout_the_predicted_world_never_uses_is_said(capsys: pytest.CaptureFixture[str]) -> None:
    """The bundled sample ran 2 ranks on one host. A bandwidth between hosts for 2 ranks on one host, or a
    host size for one rank, is predicted (the prediction equals the same world's without it) and said to
    change nothing; once the ranks cross hosts (4 ranks at 2 per host) it is used and nothing says so."""
    from helpers.cli import json_here

    sample = str(Path(__file__).parents[2] / "sample_traces" / "fsdp2-cpu-2rank")

    def whatif(*argv: str) -> dict:
        return json_here(capsys, "whatif", sample, *argv, "--json", "-q", "--no-cache")

    unused = whatif("--inter-node-gbps", "5")
    assert unused["predicted"]["step_time_ms"] == unused["baseline"]["step_time_ms"]
    assert any(n.startswith("--inter-node-gbps: the 2 ranks fit on one host (2 per host)") for n in unused["notes"])
    one, one_alone = whatif("--world-size", "1", "--gpus-per-node", "4"), whatif("--world-size", "1")
    assert one["predicted"]["step_time_ms"] == one_alone["predicted"]["step_time_ms"]
    assert "--gpus-per-node: one rank runs no collective, so no host is crossed: it changes nothing" in one["notes"]
    crossing = whatif("--world-size", "4", "--gpus-per-node", "2", "--inter-node-gbps", "0.5")
    slower = whatif("--world-size", "4", "--gpus-per-node", "2", "--inter-node-gbps", "0.05")
    assert slower["predicted"]["step_time_ms"] > crossing["predicted"]["step_time_ms"]  # the bandwidth is used
    assert not [n for n in crossing["notes"] if "changes nothing" in n or "change nothing" in n]


def test_a_world_without_recorded_communication_says_it_prices_none(capsys: pytest.CaptureFixture[str]) -> None:
    """Under torch's fake process group (the committed fake-8 recording) no collective took any time: another
    world size predicts no communication, and says why, rather than reading as communication that scales for
    free; a recording whose collectives ran (the bundled gloo sample) prices them and says nothing of it."""
    from helpers.cli import json_here

    from fsdpviz.whatif.predict import NO_COMM_WORLD_NOTE

    fake = Path(__file__).parents[1] / "recorded" / "fake8-block" / "run"
    data = json_here(capsys, "whatif", str(fake), "--world-size", "4", "--json", "-q", "--no-cache")
    assert data["baseline"]["comm_ms"] == 0.0 and data["predicted"]["comm_ms"] == 0.0
    assert NO_COMM_WORLD_NOTE in data["notes"]
    sample = Path(__file__).parents[2] / "sample_traces" / "fsdp2-cpu-2rank"
    real = json_here(capsys, "whatif", str(sample), "--world-size", "4", "--json", "-q", "--no-cache")
    assert real["predicted"]["comm_ms"] > 0 and NO_COMM_WORLD_NOTE not in real["notes"]


def test_explore_says_by_how_much_a_setting_is_over_the_budget(capsys: pytest.CaptureFixture[str]) -> None:
    """Over a budget by a few hundred bytes is said in bytes, not as "0.00 MiB": each row's figure is the
    JSON's ``over_budget_bytes`` of that setting."""
    from helpers.cli import json_here, stdout_here

    from fsdpviz.formatting import bytes_text

    argv = ("whatif", str(Path(__file__).parents[2] / "sample_traces" / "fsdp2-cpu-2rank"), "--explore",
            "--memory-budget", "1.4MiB", "-q", "--no-cache")
    over = json_here(capsys, *argv, "--json")["over_budget"]
    assert over and min(c["over_budget_bytes"] for c in over) > 0
    text = stdout_here(capsys, *argv)
    table = text.split("over the budget:", 1)[1]
    for candidate in over:
        row = next(line for line in table.splitlines() if line.strip().startswith(candidate["setting"]))
        assert row.rstrip().endswith(bytes_text(candidate["over_budget_bytes"])), (row, candidate)
    assert " 0.00 MiB\n" not in table


def test_the_terminal_names_each_category_a_small_peak_moves_by(capsys: pytest.CaptureFixture[str]) -> None:
    """On one rank instead of two, FSDP2 holds every parameter and its Adam state on the rank: each rank's
    shard doubles (run.json's units hold 222,336 bytes of parameters, 0.11 MiB a rank of 2). On a model
    this small the shards move by less than a MiB, yet they are a third of the peak's change: the
    terminal's line names them, as the JSON does, not the optimizer state alone."""
    run = Path(__file__).parents[1] / "recorded" / "example-fsdp2" / "run"
    units = json.loads((run / "run.json").read_text())["units"]
    shard_mib = sum(u["param_bytes"] for u in units) / 2 / 2**20
    with pytest.raises(SystemExit):
        main(["whatif", str(run), "--world-size", "1", "-q"])
    (line,) = [ln for ln in capsys.readouterr().out.splitlines() if "peak by category:" in ln]
    said = {name: (float(a), float(b))
            for name, a, b in re.findall(r"(sharded parameters|optimizer state) ([\d.]+) MiB -> ([\d.]+) MiB", line)}
    assert said["sharded parameters"] == pytest.approx((shard_mib, 2 * shard_mib), abs=0.006)
    assert said["optimizer state"] == pytest.approx((2 * shard_mib, 4 * shard_mib), abs=0.006)  # Adam: 2 per element


def test_unknown_per_unit_figures_print_as_unknown(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Under another ZeRO-3 bucket each unit's gathers are unknown (test_zero3_bucket_replay.py): the table
    and the page print them as n/a, beside a note that says why, and the figures each unit keeps."""
    import shutil

    run = tmp_path / "run"
    shutil.copytree(Path(__file__).parents[1] / "recorded" / "example-zero3-submodule" / "run", run)
    page = tmp_path / "whatif.html"
    code, out, err = _run(["whatif", str(run), "--prefetch", "2", "--no-cache", "-o", str(page)], capsys)
    assert code == 0, err
    rows = [line.split() for line in out.splitlines() if line.strip().startswith("blocks.0.qkv")]
    assert len(rows) == 1 and rows[0][1] == "n/a" and rows[0][5] == "n/a"
    assert all(float(v) >= 0 for v in rows[0][2:5])  # forward, backward, reduce-scatter
    assert "note: per-unit all-gather and exposed communication unknown (null)" in out
    assert "n/a: unknown, the notes say why" in page.read_text()
    # a CPU run's ranks per node are processes: the page names the setting as the terminal does
    assert "ranks per node 2 (recorded)" in out
    assert ">ranks per node<" in page.read_text() and "gpus per node" not in page.read_text()


def test_the_peak_by_category_line_leaves_no_change_unsaid(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """On four ranks instead of two the shards halve: the optimizer state moves past the line's floor, the
    sharded parameters by less (run.json: 0.11 MiB a rank of 2, half the Adam state's). Every category the
    prediction moves (``--json``) is in the line, the smaller ones in a clause of their own, each by the
    JSON's bytes; else the parts listed read as the peak's whole change."""
    from fsdpviz.analysis.memory_categories import TITLES
    from fsdpviz.formatting import mib_change_text

    run = Path(__file__).parents[1] / "recorded" / "example-fsdp2" / "run"
    code, out, err = _run(["whatif", str(run), "--world-size", "4", "--json", "-q"], capsys)
    assert code == 0, err
    data = json.loads(out)
    before, after = data["baseline"]["memory_categories"], data["predicted"]["memory_categories"]
    moved = {c for c in before if before[c] is not None and after.get(c) is not None and before[c] != after[c]}
    assert {"optimizer_state", "sharded_params"} <= moved
    with pytest.raises(SystemExit):
        main(["whatif", str(run), "--world-size", "4", "-q"])
    (line,) = [ln for ln in capsys.readouterr().out.splitlines() if "peak by category:" in ln]
    listed, _, clause = line.partition(" each: ")
    assert clause, line
    for c in moved:
        assert TITLES[c] in line, (c, line)
    assert f"{TITLES['sharded_params']} {mib_change_text(after['sharded_params'] - before['sharded_params'])}" in clause
    assert TITLES["optimizer_state"] in listed and TITLES["optimizer_state"] not in clause
    # the page's table ends with the same clause
    page = tmp_path / "whatif.html"
    code, _, err = _run(["whatif", str(run), "--world-size", "4", "-q", "-o", str(page)], capsys)
    assert code == 0, err
    assert html.unescape(clause.strip()) in html.unescape(page.read_text()), clause


def test_a_merge_with_nothing_to_merge_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    """A recording of one root unit (run.json lists no other) has nothing to merge: ``--wrap merge:2``
    predicts the recorded setting's step and memory, and a note says why, rather than a silent +0.00."""
    run = Path(__file__).parents[1] / "recorded" / "fsdp2-d256-root" / "run"
    assert [u["unit"] for u in json.loads((run / "run.json").read_text())["units"]] == ["(root)"]
    code, out, err = _run(["whatif", str(run), "--wrap", "merge:2", "--json", "-q"], capsys)
    assert code == 0, err
    data = json.loads(out)
    assert data["predicted"]["step_time_ms"] == data["baseline"]["step_time_ms"]
    assert data["predicted"]["peak_allocated_bytes"] == data["baseline"]["peak_allocated_bytes"]
    assert any(n.startswith("wrap merge:2: the recording has one unit, the root, so nothing merges")
               for n in data["notes"]), data["notes"]


def test_explore_marks_a_setting_the_script_cannot_be_given_as_code(capsys: pytest.CaptureFixture[str]) -> None:
    """FSDP1 wraps one module per unit, so ``merge:2`` of a per-block recording has no code (``--code``
    refuses it, exit 2): the ranked list marks its row and a note says why; one root unit, which FSDP1
    takes as code, is not marked."""
    run = Path(__file__).parents[1] / "recorded" / "example-fsdp1" / "run"
    code, _, err = _run(["whatif", str(run), "--wrap", "merge:2", "--code", "-q"], capsys)
    assert code == 2 and "FSDP1 wraps one module per unit" in err
    code, out, err = _run(["whatif", str(run), "--explore", "-q"], capsys)
    assert code == 0, err
    rows = {re.split(r"\s{2,}", line.strip())[1] for line in out.splitlines() if re.match(r"\s+[-\d]+\s{2,}wrap ", line)}
    assert "wrap merge:2 (no code)" in rows and "wrap root" in rows, rows
    assert "note: no code for wrap merge:2: FSDP1 wraps one module per unit" in out
