"""whatif says what it cannot tell and speaks each framework's own settings, checked against outside truth:

- one rank has no communication: a real 1-rank FSDP2 recording on an H100 holds none, and a prediction
  of world size 1 from a 2-rank recording must show none either; a 1-rank recording's own settings are
  simulated, and held to the same model's bare runs;
- the recorded prefetch is the framework's own: the FSDP1 and ZeRO-3 samples were recorded with the
  frameworks' defaults, read here from torch's and DeepSpeed's own signatures and config;
- a prediction states the recording's step-to-step spread, as the trace's own ProfilerStep spans give
  it, and calls a change within it not measurable;
- a replay that misses its recording, or a recording the profiler slowed heavily, is said before any
  figure.
"""

from __future__ import annotations

import inspect
import json
import statistics
from pathlib import Path
from typing import Any

import pytest
from helpers.cli import json_here, run_here
from helpers.gpu_fsdp_truth import STEP_TRUTH, with_impossible_timers
from helpers.rawfiles import timer_step_ms

from fsdpviz.analysis.pipeline import analyse
from fsdpviz.replay import program as prog
from fsdpviz.replay.model import read_model
from fsdpviz.replay.settings import settings_of

SAMPLES = Path(__file__).parents[2] / "sample_traces"


def test_one_rank_has_no_communication_as_a_real_one_rank_recording_shows(
        gpu_fsdp_run: Any, capsys: pytest.CaptureFixture[str]) -> None:
    one = gpu_fsdp_run("h100-fsdp2-ws1-block").summary
    assert one.world_size == 1 and one.overlap.comm_ms == 0  # truth: FSDP2 on one rank gathers nothing
    for sample in ("fsdp2-cpu-2rank", "fsdp1-cpu-2rank", "zero3-cpu-2rank"):
        data = json_here(capsys, "whatif", str(SAMPLES / sample), "--world-size", "1", "--json", "-q", "--no-cache")
        assert data["baseline"]["comm_ms"] > 0
        predicted = data["predicted"]
        assert predicted["comm_ms"] == 0 and predicted["exposed_comm_ms"] == 0
        assert all(u["all_gather_ms"] == 0 == u["reduce_scatter_ms"] for u in predicted["units"])
        # the rank still computes all it computed (the per-rank batch is the same): the step keeps that
        # compute and loses at most the communication the recording exposed (figures in µs: each rounded)
        assert predicted["compute_ms"] <= predicted["step_time_ms"] + 0.002
        assert predicted["step_time_ms"] < data["baseline"]["step_time_ms"]


def test_a_one_rank_recordings_settings_are_simulated_and_advised_on_that(gpu_fsdp_run: Any) -> None:
    """The real 1-rank H100 recording (model A, block wrap) is launch-bound, so the bound's knob is merge:2.
    whatif simulates its program like any other: only putting several ranks on one goes unsimulated.
    Truth from outside the code: the same model's uninstrumented runs on a fake group of 8 in one process
    (collectives that take no time, so what a wrap changes is the per-unit work one rank does too) ran
    merge:2 at 49.2 / 53.2 and root at 43.1 / 53.2 of the block wrap; the one-rank predictions are held to
    those ratios within 0.10. Before, both printed +0.00 ms, the step less the (absent) exposed
    communication."""
    from fsdpviz.replay.model import read_model
    from fsdpviz.whatif.gains import completed_summary
    from fsdpviz.whatif.predict import predict

    result = gpu_fsdp_run("h100-fsdp2-ws1-block")
    model = read_model(result)
    block, truth = STEP_TRUTH["h100-fsdp2-fake8-block"]
    ratios = {}
    for settings, bare_ms in truth:
        if settings.wrap.kind == "recorded":
            continue
        p = predict(model, settings)
        assert not any("not simulated" in n for n in p.notes)
        ratios[settings.describe()] = ratio = p.predicted.step_time_ms / p.baseline.step_time_ms
        assert ratio == pytest.approx(bare_ms / block, abs=0.10), settings.describe()
        assert p.baseline.step_time_ms - p.predicted.step_time_ms > p.spread_ms
    assert ratios["wrap root"] < ratios["wrap merge:2"]  # fewer units, less of FSDP's per-unit work
    summary = completed_summary(result)
    assert summary.world_size == 1 and summary.bound is not None and summary.bound.fsdp_overhead_ms > 1.0
    (bound,) = [a for a in summary.actions if a.kind == "bound"]
    assert bound.cause == "host" and bound.knob and bound.predicted_change_ms is not None
    # the bound advises the wrap --explore puts first: root, which the bare runs measured fastest too
    assert bound.predicted_gain.endswith("(fsdpviz whatif: wrap root)")
    assert bound.predicted_change_ms == pytest.approx(
        (ratios["wrap root"] - 1) * summary.step_time_ms, abs=0.01)
    assert min(bare_ms for settings, bare_ms in truth if settings.wrap.kind == "root") < min(
        bare_ms for settings, bare_ms in truth if settings.wrap.kind == "merge")


def test_fsdp1_recorded_prefetch_is_fsdp1s_own_default(capsys: pytest.CaptureFixture[str]) -> None:
    from torch.distributed.fsdp import FullyShardedDataParallel

    defaults = inspect.signature(FullyShardedDataParallel.__init__).parameters
    truth = {"forward_prefetch": defaults["forward_prefetch"].default,
             "backward_prefetch": defaults["backward_prefetch"].default.name}  # the sample used the defaults
    data = json_here(capsys, "whatif", str(SAMPLES / "fsdp1-cpu-2rank"), "--json", "-q", "--no-cache")
    prefetch = data["predicted"]["settings"]["prefetch"]
    assert prefetch["source"] == "recorded" and prefetch["arguments"] == truth
    # a plain torch.profiler recording says no arguments: the framework's default is assumed, and its
    # source says so (the default, not the recording)
    plain = json_here(capsys, "whatif", str(SAMPLES / "fsdp2-cpu-2rank-plain"), "--wrap", "merge:2", "--json", "-q",
                      "--no-cache")["predicted"]["settings"]["prefetch"]
    assert plain["source"] == "default" and plain["arguments"] is None and plain["arguments_unknown"]
    none = json_here(capsys, "whatif", str(SAMPLES / "fsdp1-cpu-2rank"), "--prefetch", "none", "--json", "-q")
    assert none["predicted"]["settings"]["prefetch"]["arguments"] == {"forward_prefetch": False,
                                                                      "backward_prefetch": None}
    refused = run_here(capsys, "whatif", str(SAMPLES / "fsdp1-cpu-2rank"), "--prefetch", "2", "-q")
    assert refused.returncode == 2 and "fsdp1 prefetches at most 1 unit ahead" in refused.stderr


def test_zero3_recorded_prefetch_is_deepspeeds_bucket(capsys: pytest.CaptureFixture[str]) -> None:
    config = pytest.importorskip("deepspeed.runtime.zero.config")
    truth = config.DeepSpeedZeroConfig.model_fields["prefetch_bucket_size"].default  # the sample's: the default
    data = json_here(capsys, "whatif", str(SAMPLES / "zero3-cpu-2rank"), "--json", "-q", "--no-cache")
    assert data["predicted"]["settings"]["prefetch"]["arguments"] == {"stage3_prefetch_bucket_size": truth}
    one = json_here(capsys, "whatif", str(SAMPLES / "zero3-cpu-2rank"), "--prefetch", "1", "--json", "-q")
    bucket = one["predicted"]["settings"]["prefetch"]["arguments"]["stage3_prefetch_bucket_size"]
    # a bucket of one unit ahead holds the largest unit DeepSpeed fetches, and no more than two of them
    run = json.loads((SAMPLES / "zero3-cpu-2rank" / "run.json").read_text())
    numels = sorted(u["param_numel"] for u in run["units"] if u["param_numel"] > 0)
    assert numels[-1] <= bucket <= numels[-1] + numels[-2]
    # DeepSpeed's default bucket gathered the whole model at once; a bucket of one unit, or none, gathers
    # it in more, smaller groups, each a collective the thread waits for on CPU: the step moves, and no
    # note may say it reads as recorded
    assert one["predicted"]["step_time_ms"] > one["baseline"]["step_time_ms"]
    assert not any("predicts the recorded step" in n for n in one["notes"])
    # with no prefetch, each module DeepSpeed fetches gathers its own parameters at its fetch (its
    # coordinator, read in replay/zero3_fetch.py): an all-gather for every unit with parameters of its
    # own (run.json, the recorder's reading of the model's modules) and none for the blocks around them
    none = json_here(capsys, "whatif", str(SAMPLES / "zero3-cpu-2rank"), "--prefetch", "none", "--json", "-q")
    own = {u["unit"] for u in run["units"] if u["param_numel"] > 0}
    model = read_model(analyse([SAMPLES / "zero3-cpu-2rank"], cache=False, progress=False))
    for step in model.recording.steps:
        program = prog.build(model.recording, step, settings_of(prefetch="none"), model.comm, model.gathers)
        assert {g.unit for g in program.gathers} == own and len(own) > 2
    # which unit's parameters a recorded gather carried does not carry over to other groups: each unit's
    # gathers are unknown (test_zero3_bucket_replay.py), the step's predicted
    assert all(u["all_gather_ms"] is None for u in none["predicted"]["units"])
    assert none["predicted"]["step_time_ms"] > one["predicted"]["step_time_ms"]
    explore = json_here(capsys, "whatif", str(SAMPLES / "zero3-cpu-2rank"), "--explore", "--json", "-q")
    # FSDP's per-unit work does not go with a prefetch change: every row keeps some (a CPU split moves it
    # as the simulated thread's does), and a part the split takes below 0 is said
    recorded_fsdp = next(c for c in explore["ranked"] + explore["within_spread"] + explore["unranked"]
                         if c["setting"] == "as recorded")["bound"]["fsdp_overhead_ms"]
    assert recorded_fsdp > 0
    for c in explore["ranked"] + explore["within_spread"] + explore["unranked"]:
        assert c["bound"]["fsdp_overhead_ms"] > 0, c["setting"]
        if c["bound"]["other_idle_ms"] == 0:
            assert "held to 0" in (c["bound"]["note"] or ""), c["setting"]
    from fsdpviz.whatif.predict import PREFETCH_REASONS

    # every depth writes another bucket than the recorded one, so none reads as recorded, and no note
    # says DeepSpeed's thread waits out its collectives: its prefetches are asynchronous (the summary
    # keeps ZeRO-3's prefetch knob for that reason, tests/unit/test_actions.py)
    assert not [n for n in explore["notes"] if any(reason in n for reason in PREFETCH_REASONS)]
    assert not any("the training thread waits out every gloo collective" in n for n in explore["notes"])
    fsdp2 = json_here(capsys, "whatif", str(SAMPLES / "fsdp2-cpu-2rank"), "--prefetch", "2", "--json", "-q")
    assert fsdp2["predicted"]["step_time_ms"] == fsdp2["baseline"]["step_time_ms"]
    assert any("predicts the recorded step" in n and "the training thread waits out every gloo collective" in n
               for n in fsdp2["notes"])


def test_the_spread_is_the_recorders_own_step_to_step_range(capsys: pytest.CaptureFixture[str]) -> None:
    """The spread is the range of the clean unprofiled steps the recorder's own timers clocked (each step
    the median over ranks, read from the timers files), as a share of the summary's step, on the
    prediction's basis; and the recorded setting itself is never a measurable change."""
    sample = SAMPLES / "fsdp2-cpu-2rank"
    summary = json_here(capsys, "summary", str(sample), "--json", "-q", "--no-cache")
    assert summary["step_time_source"] == "timers"
    clean = summary["profiler"]["unprofiled_steps"]
    walls = [timer_step_ms(sample / "timers" / f"rank{r}.jsonl") for r in (0, 1)]
    per_step = [statistics.median(w[s] for w in walls) for s in clean]
    data = json_here(capsys, "whatif", str(sample), "--wrap", "merge:2", "--json", "-q", "--no-cache")
    share = (max(per_step) - min(per_step)) / summary["step_time_ms"]
    assert data["predicted"]["spread_ms"] == pytest.approx(share * data["baseline"]["step_time_ms"], rel=1e-3)
    same = json_here(capsys, "whatif", str(sample), "--json", "-q")["predicted"]
    assert same["measurable"] is False and same["spread_ms"] == data["predicted"]["spread_ms"] > 0


def test_a_replay_that_misses_is_said_before_any_figure(gpu_fsdp_dir: Path, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """Model B: the profiler slowed its steps 1.79x (README, the timers' profiled steps; 1.75x as traced); model A with timers no replay of its trace
    can reproduce (a step shorter than its kernels) misses them by more than 10 %."""
    missed = with_impossible_timers(gpu_fsdp_dir / "h100-fsdp2-fake8-block", tmp_path / "missed")
    for run, words in ((gpu_fsdp_dir / "h100-fsdp2-fake8-block-modelB", "the profiler slowed the recorded steps 1.7"),
                       (missed, "unreliable: without the profiler, the model's replay misses the run's own step")):
        data = json_here(capsys, "whatif", str(run), "--wrap", "root", "--json", "-q", "--no-cache")
        assert any(words in w for w in data["warnings"]), data["warnings"]
        out = run_here(capsys, "whatif", str(run), "--wrap", "root", "-q", "--no-cache").stdout.splitlines()
        first_figure = next(i for i, line in enumerate(out) if "step time" in line)
        assert any(words in line for line in out[:first_figure])


def test_gloos_collectives_on_cuda_queue_behind_one_another_in_the_replay(gpu_fsdp_run: Any,
                                                                           gpu_fsdp_dir: Any) -> None:
    """gloo's collectives on CUDA tensors (the shared 2-rank H100 recording) run on the process group's
    worker threads one at a time: in the trace file the ``gloo:*`` ranges of the analysed steps overlap
    for under 0.5 % of their time. Replayed so (one queue, each gather starting with FSDP's all-gather
    label, which holds the host until the gloo op ends), the replay of the traced steps waits on
    communication as long as each rank's trace does, which the replay is not fitted to, within 1.5 % (0.7
    and 1.0 %; without the profiler 31 ms a step less, which the bound takes out of the trace's: it is the
    trace's less that drop); with the all-gathers and reduce-scatters on streams of their own it was 1,015
    of 1,328 ms, and root,
    merge:2, no resharding and prefetch none predicted parts 14-22 % past their steps. Now every
    explored setting's parts fit its step, and the prefetch depths that predict the recorded step say
    why: their gathers queue earlier on the same one queue."""
    import statistics

    from helpers.rawfiles import trace_events

    from fsdpviz.whatif.explore import explore
    from fsdpviz.whatif.gains import summary_model

    result = gpu_fsdp_run("h100-fsdp2-gloo2-block")
    for path in sorted((gpu_fsdp_dir / "h100-fsdp2-gloo2-block" / "traces").glob("rank*.trace.json.gz")):
        events = trace_events(path)
        steps = [e for e in events if e.get("cat") == "user_annotation" and e["name"].startswith("ProfilerStep#")]
        lo, hi = min(e["ts"] for e in steps), max(e["ts"] + e["dur"] for e in steps)
        gloo = sorted((e["ts"], e["ts"] + e["dur"]) for e in events
                      if e.get("cat") == "user_annotation" and e["name"].startswith("gloo:") and lo <= e["ts"] < hi)
        union, end = 0.0, float("-inf")
        for a, b in gloo:
            union += max(b - max(a, end), 0.0)
            end = max(end, b)
        assert union > 0.995 * sum(b - a for a, b in gloo)
    model, _ = summary_model(result)
    assert model is not None and model.recording.serial_collectives
    bound = result.summary.bound
    assert bound is not None
    for rank in (0, 1):
        traced = [r.exposed_comm_ns for s, r in zip(model.recording.steps, model.replays) if s.rank == rank]
        row = result.overlap[result.overlap["rank"] == rank].iloc[0]
        in_trace = float(row["bound_exposed_comm_ns"]) / int(row["n_steps"])
        assert statistics.fmean(traced) == pytest.approx(in_trace, rel=0.015)
    explored = explore(model)
    assert not explored.unranked
    assert all(c.prediction is not None and c.prediction.parts_over_pct is None
               for c in [*explored.ranked, *explored.within_spread])
    # a prefetch whose gathers only queue earlier on that one queue predicts the recorded step, and says
    # why; prefetch none, which issues each gather after the compute before it, leaves gaps in the chain
    # and moves the step
    from fsdpviz.whatif.predict import SERIAL_PREFETCH_NOTE, SERIAL_PREFETCH_REASON

    rows = {c.settings.describe(): c.prediction for c in [*explored.ranked, *explored.within_spread]
            if c.prediction is not None and c.settings.describe().startswith("prefetch")}
    bounds = {c.settings.describe(): c.bound for c in [*explored.ranked, *explored.within_spread]}
    for name in ("prefetch 1", "prefetch 2"):
        p = rows[name]
        assert p.predicted.step_time_ms == pytest.approx(p.baseline.step_time_ms, abs=0.0005), name
        assert SERIAL_PREFETCH_NOTE in p.notes, name
        # the replay still moves their exposed communication, which an unchanged step's split takes out of
        # the host side the recorded split keeps (the replay's, gloo2's waits not emptied by the rule), so
        # the parts still add up to the step; where none is left, the split's note says they add up past it
        moved = p.predicted.exposed_comm_ms - p.baseline.exposed_comm_ms
        if abs(moved) > 0.01:
            b = bounds[name]
            assert b is not None, name
            if "the parts add up to" not in (b.note or ""):
                parts = b.compute_ms + b.exposed_comm_ms + (b.host_wait_ms or 0.0) + b.other_idle_ms + b.fsdp_overhead_ms
                assert parts == pytest.approx(b.step_ms, abs=0.01), name
                side = (b.host_wait_ms or 0.0) + b.fsdp_overhead_ms - (b.fsdp_kernels_ms or 0.0)
                recorded = (bound.host_wait_ms or 0.0) + bound.fsdp_overhead_ms - (bound.fsdp_kernels_ms or 0.0)
                assert side < recorded, name
    assert rows["prefetch none"].predicted.step_time_ms > rows["prefetch none"].baseline.step_time_ms + 1.0
    assert SERIAL_PREFETCH_NOTE not in rows["prefetch none"].notes
    said = [n for n in explored.notes if SERIAL_PREFETCH_REASON in n]
    assert said == [f"prefetch 1, prefetch 2 predicted the recorded step: {SERIAL_PREFETCH_REASON}"]


def test_a_gloo_group_beside_fsdps_collectives_leaves_them_as_they_ran(gpu_fsdp_dir: Any, tmp_path: Any) -> None:
    """A gloo group beside FSDP's own collectives (here the fake group's, which run no kernel; a NCCL
    run's alike) is not FSDP's collectives running on gloo: the replay keeps its lanes, and the copies the
    fake group's ``c10d::*`` ops launched stay FSDP's and the model's work, not communication."""
    import gzip
    import json
    import shutil

    from fsdpviz.analysis.pipeline import analyse
    from fsdpviz.whatif.gains import summary_model

    run = tmp_path / "run"
    shutil.copytree(gpu_fsdp_dir / "h100-fsdp2-fake8-block", run, ignore=shutil.ignore_patterns(".fsdpviz-cache"))
    for sub in run.rglob("*"):
        sub.chmod(0o755 if sub.is_dir() else 0o644)
    run.chmod(0o755)
    trace = run / "traces" / "rank0.trace.json.gz"
    with gzip.open(trace, "rt") as f:
        doc = json.load(f)
    step = next(e for e in doc["traceEvents"] if e.get("name") == "ProfilerStep#2")
    t = step["ts"] + step["dur"] - 200
    # a barrier, and a metric's all-reduce whose ops say no payload (a trace without shapes), which the
    # pairing of issuing ops with gloo's can give to one of FSDP's reduce-scatters
    doc["traceEvents"] += [
        {"ph": "M", "name": "thread_name", "pid": step["pid"], "tid": 987654, "args": {"name": "pt_gloo_runloop"}},
        *({"ph": "X", "cat": "cpu_op", "name": f"c10d::{kind}", "pid": step["pid"], "tid": step["tid"],
           "ts": t + 50 * i, "dur": 30, "args": {}} for i, kind in enumerate(("barrier", "allreduce_"))),
        *({"ph": "X", "cat": "user_annotation", "name": f"gloo:{kind}", "pid": step["pid"], "tid": 987654,
           "ts": t + 50 * i + 5, "dur": 20, "args": {}} for i, kind in enumerate(("barrier", "all_reduce")))]
    with gzip.open(trace, "wt") as f:
        json.dump(doc, f)
    before = analyse([gpu_fsdp_dir / "h100-fsdp2-fake8-block"], cache=False)
    after = analyse([run], cache=False)
    model, _ = summary_model(after)
    assert model is not None and not model.recording.serial_collectives
    assert after.summary.bound is not None and before.summary.bound is not None
    assert after.summary.bound.comm_ms is not None and 0 < after.summary.bound.comm_ms < 0.03  # the two gloo ranges
    for field in ("compute_ms", "fsdp_kernels_ms"):
        assert getattr(after.summary.bound, field) == getattr(before.summary.bound, field), field


def test_a_prediction_whose_parts_add_up_past_its_step_is_told_apart() -> None:
    """``parts_over`` on outcomes made by hand: compute, exposed communication and FSDP's copy kernels
    never overlap one another in the bound, so parts past the step are a contradiction; 10 % of slack."""
    from fsdpviz.whatif.predict import PARTS_OVER_PCT, Outcome, parts_over

    def outcome(step: float, compute: float, exposed: float, kernels: float | None) -> Outcome:
        return Outcome(step_time_ms=step, exposed_comm_ms=exposed, comm_ms=exposed, compute_ms=compute,
                       peak_allocated_bytes=None, units=[], fsdp_kernels_ms=kernels)

    assert PARTS_OVER_PCT == 10.0
    assert parts_over(outcome(100.0, 60.0, 30.0, 5.0)) is None  # 95 ms of parts: they fit
    assert parts_over(outcome(100.0, 60.0, 45.0, 4.0)) is None  # 109 ms: within the slack
    assert parts_over(outcome(100.0, 60.0, 45.0, 6.0)) == pytest.approx(11.0)  # 111 ms
    assert parts_over(outcome(100.0, 70.0, 45.0, None)) == pytest.approx(15.0)  # a CPU run: no copy kernels
    assert parts_over(outcome(0.0, 1.0, 1.0, None)) is None  # no step to compare with


def test_explore_shows_each_settings_clamps(capsys: pytest.CaptureFixture[str]) -> None:
    # the committed 4-rank CPU recording: its bound's parts are medians over ranks that do not add up to
    # its step, which each row's split keeps and says. The row's JSON carries it (bound.note; the
    # prediction's own clamps, a list, are empty on every recording here) and the terminal says it with
    # the setting's name
    run = str(Path(__file__).parents[1] / "recorded" / "whatif-world-4" / "run")
    data = json_here(capsys, "whatif", run, "--explore", "--json", "-q", "--no-cache")
    rows = {c["setting"]: c for c in (*data["ranked"], *data["within_spread"], *data["unranked"], *data["over_budget"])}
    assert all(isinstance(c["clamps"], list) for c in rows.values())
    held = {name: c["bound"]["note"] for name, c in rows.items() if c["bound"] and c["bound"]["note"]}
    assert "as recorded" in held and "wrap root" in held
    out = run_here(capsys, "whatif", run, "--explore", "-q", "--no-cache").stdout
    for name, note in held.items():
        assert f"note: {name}: {note}" in out


def test_a_cpu_split_keeps_fsdp_work_the_simulation_cannot_move() -> None:
    """The FSDP2 sample's root prediction: its split moves FSDP's per-unit work by the simulated thread's
    (fewer hooks, gathers and copy-outs: less, not none). Where the replay holds none of that work (a
    program whose hooks the recording did not time), the simulation cannot move it: the split keeps the
    recorded figure, not the old rule that gave it every millisecond the step saved."""
    from fsdpviz.analysis.pipeline import analyse
    from fsdpviz.replay.model import read_model
    from fsdpviz.replay.settings import Settings, Wrap
    from fsdpviz.whatif.explore import split_of
    from fsdpviz.whatif.predict import predict

    model = read_model(analyse([SAMPLES / "fsdp2-cpu-2rank"], cache=False, progress=False))
    recorded = model.result.summary.bound
    assert recorded is not None and recorded.fsdp_overhead_ms > 0
    prediction = predict(model, Settings().with_(wrap=Wrap("root")))
    moved = split_of(model, prediction)
    assert moved is not None and 0 < moved["fsdp_overhead_ms"] < recorded.fsdp_overhead_ms
    for replayed in prediction.replay:
        replayed.fsdp_host_ns = 0.0
    kept = split_of(model, prediction)
    assert kept is not None and kept["fsdp_overhead_ms"] == pytest.approx(recorded.fsdp_overhead_ms, abs=0.001)
    assert "host side" not in (kept["note"] or "")
    assert f"FSDP's per-unit work is kept as recorded ({recorded.fsdp_overhead_ms:.3f} ms)" in kept["note"]
    # a simulation whose FSDP work outgrows the room the step leaves: other idle is held at 0 and the parts
    # pass the step, each said (the step stays the prediction's: one figure)
    for replayed, simulated in zip(prediction.replay, prediction.simulated, strict=True):
        replayed.fsdp_host_ns = 1e6
        simulated.fsdp_host_ns = 1e6 * 4 * prediction.predicted.step_time_ms
    grown = split_of(model, prediction)
    assert grown is not None and grown["other_idle_ms"] == 0 and grown["step_ms"] == prediction.predicted.step_time_ms
    assert grown["fsdp_overhead_ms"] == pytest.approx(4 * prediction.predicted.step_time_ms * recorded.fsdp_overhead_ms,
                                                      rel=1e-3)
    assert ("the split of the predicted step moves FSDP's per-unit work as the simulated thread's own work moves, "
            "then other idle: other idle would come out at -") in grown["note"]
    assert "FSDP's per-unit work as simulated leave no other idle to take the rest" in grown["note"]
