"""``fsdpviz whatif RUN [--wrap] [--prefetch] [--reshard-after-forward] [--world-size] [--json] [-o FILE]``:
predict another FSDP setting from one recording; ``--explore`` ranks a grid of settings."""

from __future__ import annotations

import json
import re
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from fsdpviz.commands.common import (
    INCLUDE_LAST_HELP,
    QUIET_HELP,
    SCHEDULER_HELP,
    STEPS_HELP,
    check_output_folder,
    progress_printer,
    warn_gaps,
)
from fsdpviz.errors import UsageError
from fsdpviz.formatting import bytes_text, change_text, mib_change_text, mib_text

if TYPE_CHECKING:
    from fsdpviz.analysis.bound import BoundSummary
    from fsdpviz.replay.settings import Settings
    from fsdpviz.whatif.explore import Candidate, Exploration
    from fsdpviz.whatif.predict import Outcome, Prediction

EXAMPLE = """
fsdpviz whatif runs/base --prefetch 2 -o prefetch2.html
fsdpviz whatif runs/base --explore --memory-budget 70GiB
"""
MIN_BARE_BYTES = 1 << 20  # a bare number below 1 MiB is a size whose unit was left out
_BYTES_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e[0-9]+)?)\s*([kmgt]i?b?|b)?\s*$", re.IGNORECASE)
_BYTE_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9,
               "t": 10**12, "tb": 10**12, "ki": 1 << 10, "kib": 1 << 10, "mi": 1 << 20, "mib": 1 << 20,
               "gi": 1 << 30, "gib": 1 << 30, "ti": 1 << 40, "tib": 1 << 40}


def whatif(
    run: Annotated[Path, typer.Argument(
        metavar="RUN", help="A run folder (from fsdpviz record), a folder of traces, or trace files of one run.",
        show_default=False)],
    wrap: Annotated[str | None, typer.Option(
        "--wrap", metavar="root|merge:K|match:REGEX", help="root (one unit for the whole model), merge:K (every K consecutive non-root units in "
                       "forward order become one) or match:REGEX (units are the modules whose name matches). "
                       "Default: as recorded.", show_default=False)] = None,
    prefetch: Annotated[str | None, typer.Option(
        "--prefetch", metavar="implicit|none|N", help="implicit (the framework's own default prefetch), none (no all-gather overlaps compute) or N (explicit "
                           "forward and backward prefetch of the next N units). Default: as recorded.",
        show_default=False)] = None,
    reshard_after_forward: Annotated[str | None, typer.Option(
        "--reshard-after-forward", metavar="true|false", help="true or false for every non-root unit (false: parameters stay "
                                        "gathered from forward to backward). Default: as recorded.",
        show_default=False)] = None,
    keep_last_units: Annotated[int | None, typer.Option(
        "--keep-last-units", metavar="N", help="FSDP2: the last N non-root units in forward order keep their "
                                  "parameters from forward to backward (no reshard after forward for them alone; "
                                  "--explore tries 1, 2 and every unit). Default: as recorded.",
        show_default=False)] = None,
    world_size: Annotated[int | None, typer.Option(
        "--world-size", metavar="N", help="Ranks: the same model and per-rank batch on N ranks. Default: as recorded.",
        show_default=False)] = None,
    gpus_per_node: Annotated[int | None, typer.Option(
        "--gpus-per-node", metavar="N", help="Ranks per host, to tell when collectives cross hosts. Default: as recorded.",
        show_default=False)] = None,
    inter_node_gbps: Annotated[float | None, typer.Option(
        "--inter-node-gbps", metavar="GB/S", help="Bandwidth between hosts per rank in GB/s, for world sizes past one host. "
                                  "Default: 25 on GPU (200 Gb/s per GPU), 1.25 on CPU (10 GbE).",
        show_default=False)] = None,
    explore_grid: Annotated[bool, typer.Option(
        "--explore", help="Predict a small grid (prefetch 1/2/none, no reshard for the last units, merge:2, "
                          "root, as recorded) and rank it by step time within the memory budget.")] = False,
    memory_budget: Annotated[str | None, typer.Option(
        "--memory-budget", metavar="SIZE", help="With --explore: the allocated memory a setting may peak "
                                                "at, with its unit: 70GiB, 80GB, 512MiB (GiB, MiB: powers "
                                                "of 1024; GB, MB: of 1000). Default: the device's memory "
                                                "from the trace, else none (CPU): ranked by step time.",
        show_default=False)] = None,
    as_json: Annotated[bool, typer.Option(
        "--json", help='Print {"baseline": {...}, "predicted": {...}} (with --explore: the ranked grid).')] = False,
    code: Annotated[bool, typer.Option(
        "--code", help="Print only the setting as code: a shard_model(model) that applies it to an unsharded "
                       "model of the recorded architecture (FSDP2, FSDP1), or zero_config(config) (ZeRO-3); "
                       "with --stack, or where the recorded launcher names a stack, the keys that stack "
                       "changes instead.")] = False,
    stack: Annotated[str | None, typer.Option(
        "--stack", metavar="code|hf_trainer|accelerate|lightning|deepspeed",
        help="With --code: print the setting as this stack takes it (the HF Trainer's fsdp_config, accelerate's "
             "config keys, Lightning's strategy, the DeepSpeed JSON; code: the framework's own calls). Default: "
             "the stack the recorded launcher names (accelerate launch, deepspeed), else code.",
        show_default=False)] = None,
    output: Annotated[Path | None, typer.Option(
        "-o", "--output", "--out", metavar="FILE", help="Also write an HTML page: the recorded and the predicted step on one time axis, "
                               "unit by unit, with their memory curves.", show_default=False)] = None,
    save: Annotated[bool, typer.Option(
        "--save", help="Keep the prediction in the run folder (predictions/), where `fsdpviz report` and "
                       "`fsdpviz compare` show it beside the recording, marked as predicted.")] = False,
    steps: Annotated[str | None, typer.Option(
        "--steps", metavar="STEPS", help=f"{STEPS_HELP} The steps the prediction reads, as summary's.",
        show_default=False)] = None,
    include_last_step: Annotated[bool, typer.Option("--include-last-step", help=INCLUDE_LAST_HELP)] = False,
    cache: Annotated[bool, typer.Option("--cache/--no-cache", help="Reuse parsed traces cached beside them.")] = True,
    quiet: Annotated[bool, typer.Option("-q", "--quiet", help=QUIET_HELP)] = False,
    scheduler: Annotated[str | None, typer.Option("--scheduler", metavar="ADDRESS", help=SCHEDULER_HELP,
                                                  show_default=False)] = None,
) -> None:
    """Predict another FSDP setting from one recording.

    Step time, communication and memory under another wrap policy, prefetch, resharding or world
    size. Each recorded step is simulated twice, as recorded and under the setting, and the
    prediction is the recording moved by the difference, so what the simulation does not explain
    cancels out; the replay line says how closely it reproduces the recording."""
    from fsdpviz.replay.settings import settings_of

    settings = settings_of(wrap=wrap, prefetch=prefetch, reshard_after_forward=reshard_after_forward,
                           keep_last_units=keep_last_units, world_size=world_size, gpus_per_node=gpus_per_node,
                           inter_node_gbps=inter_node_gbps)
    budget = parse_bytes(memory_budget, "--memory-budget") if memory_budget is not None else None
    if budget is not None and not explore_grid:
        raise UsageError("--memory-budget ranks the settings of --explore: add --explore")
    if explore_grid and settings.describe() != "as recorded":
        raise UsageError(f"--explore tries its own grid of settings: leave out {settings.flags()}")
    from fsdpviz.whatif.stacks import STACKS

    if stack is not None and stack not in STACKS:
        raise UsageError(f"--stack {stack}: expected one of {', '.join(STACKS)}")
    if stack is not None and not code:
        raise UsageError("--stack says which form --code prints: add --code (the JSON has every form as 'apply.stacks')")
    if code and (explore_grid or as_json):
        raise UsageError("--code prints one setting's code: leave out --explore and --json (the JSON has it as 'apply')")
    if explore_grid and (output is not None or save):
        raise UsageError("--explore ranks settings; write the page or save one of them with a second call "
                         "(fsdpviz whatif RUN --prefetch 1 -o page.html)")
    check_output_folder(output, "the page")
    say = progress_printer(quiet) or (lambda message: None)
    started = time.perf_counter()

    from fsdpviz.analysis.pipeline import analyse
    from fsdpviz.commands.summary import parse_steps
    from fsdpviz.trace.sources import check_inputs
    from fsdpviz.whatif.gains import clock_notes, summary_model

    check_inputs([run])  # a missing input is its one error line, not "loading" and then the error
    say(f"loading {run}")
    result = analyse([run], steps=parse_steps(steps), include_last_step=include_last_step, cache=cache,
                     progress=False, scheduler=scheduler)
    model, why_not = summary_model(result)  # the run's one model: the ranks the summary's advice read
    if model is None:
        raise UsageError(f"{run}: {why_not}")
    warn_gaps(result.traces)
    said_of_clock = clock_notes(result)
    rec = model.recording
    say(f"read {len(rec.steps)} step(s) over {len({s.rank for s in rec.steps})} rank(s); simulating")
    if explore_grid:
        from fsdpviz.whatif.explore import explore

        exploration = explore(model, budget)
        exploration.notes.extend(said_of_clock)
        if as_json:
            sys.stdout.write(json.dumps(exploration.to_json(), indent=2) + "\n")
        else:
            print_exploration(exploration, str(run))
        say(f"{exploration_count(exploration)} in {time.perf_counter() - started:.1f} s")
        return

    from fsdpviz.whatif.predict import predict

    prediction = predict(model, settings)
    prediction.notes.extend(said_of_clock)
    from fsdpviz.whatif.explore import split_of

    # the predicted step's split, as --explore gives each setting's: the parts the table adds up to
    recorded_bound = model.result.summary.bound
    prediction.bound = split_of(model, prediction)
    if code:
        print_code(prediction, settings, stack, say)
        return
    if as_json:
        sys.stdout.write(json.dumps(prediction.to_json(), indent=2) + "\n")
    else:
        print_prediction(prediction, str(run), rec.framework, rec.world_size, rec.device, recorded_bound)
    if save:
        from fsdpviz.whatif.saved import save_prediction

        path = save_prediction(result, prediction)
        say(f"saved the prediction as {path}")
    if output is not None:
        from fsdpviz.report.whatif.build import build_whatif

        written = build_whatif(model, prediction, output, source=str(run))
        say(f"wrote {written.path} ({written.size_bytes / 1e6:.1f} MB)")
    say(f"predicted in {time.perf_counter() - started:.1f} s")


def print_code(prediction: Prediction, settings: Settings, stack: str | None, say: Callable[[str], None]) -> None:
    """``--code``: the code form, or ``stack``'s form (by default the one the recorded launcher names);
    a usage error where that form cannot say the setting."""
    from fsdpviz.whatif.predict import code_header
    from fsdpviz.whatif.stacks import CODE, DEEPSPEED

    apply = prediction.apply
    if apply is None:
        raise UsageError(f"no code for {settings.describe()}: none written")
    chosen = stack or apply.stack or CODE
    if chosen != CODE:
        form = apply.form(chosen)
        if form is None and stack is not None:
            # an HF Trainer or accelerate run of DeepSpeed takes its settings in the DeepSpeed config file
            via = (f"; a {chosen} run of DeepSpeed takes the {DEEPSPEED} form in the config file it passes"
                   if apply.framework == "zero3" and any(f.stack == DEEPSPEED for f in apply.stacks) else "")
            raise UsageError(f"--stack {chosen}: no form for a {apply.framework} recording (forms: "
                             f"{', '.join([CODE, *(f.stack for f in apply.stacks)])}){via}")
        if form is not None and form.text is None and stack is not None:
            raise UsageError(f"no {chosen} form for {settings.describe()}: {form.note}")
        if form is not None and form.text is not None:
            if form.stack == DEEPSPEED:
                # JSON: the prediction's comment lines, which every other form carries in itself, go
                # beside it on stderr, -q or not (the code travels with how far it can be trusted)
                sys.stderr.write(code_header(prediction)
                                 + "# set these keys in the DeepSpeed JSON config, keep the others as they are\n")
            sys.stdout.write(form.text)
            if form.note:
                say(f"note: {form.note}")
            return
        # the launcher's stack cannot say it: the code form, which every stack can run, and why
        say(f"note: the recorded launcher's stack ({chosen}) cannot say it: "
            f"{form.note if form is not None else 'no form for ' + apply.framework}")
    if apply.code is None:
        raise UsageError(f"no code for {settings.describe()}: {apply.note}")
    sys.stdout.write(apply.code)
    if apply.note:
        say(f"note: {apply.note}")


def parse_bytes(text: str, option: str) -> int:
    """``70GiB``, ``512MB``, ``5e9`` -> bytes (GiB/MiB: powers of 1024; GB/MB: of 1000).

    A number without a unit is bytes only from :data:`MIN_BARE_BYTES` on: ``--memory-budget 40`` is
    someone's 40 GiB, and read as 40 bytes it would silently rule out every setting."""
    match = _BYTES_RE.match(text)
    if not match:
        raise UsageError(f"{option} {text!r}: use a size with its unit, e.g. 70GiB, 80GB or 512MiB")
    number, unit = float(match.group(1)), (match.group(2) or "").lower()
    value = number * _BYTE_UNITS[unit]
    if value <= 0:
        raise UsageError(f"{option} {text!r}: needs more than 0 bytes")
    if not unit and value < MIN_BARE_BYTES:
        raise UsageError(f"{option} {text!r}: a number without a unit is bytes, and {number:g} bytes is surely "
                         f"not meant; give the unit, e.g. {number:g}GiB or {number:g}GB")
    return int(value)


def _rows(baseline: Outcome, predicted: Outcome) -> list[tuple[str, str, str, str]]:
    from fsdpviz.whatif.predict import time_rows

    rows = [(label, f"{b:,.2f} ms", f"{p:,.2f} ms", change_text(b, p, "ms"))
            for label, b, p in time_rows(baseline, predicted)]
    b_peak, p_peak = baseline.peak_allocated_bytes, predicted.peak_allocated_bytes
    rows.append(("peak allocated", mib_text(b_peak), mib_text(p_peak), change_text(b_peak, p_peak, "bytes")))
    return rows


def category_changes(baseline: Outcome, predicted: Outcome) -> list[str]:
    """What the predicted peak holds that the recorded one did not, category by category
    (:func:`~fsdpviz.whatif.predict.category_moves`, as the page's table lists them), e.g.
    ``unsharded parameters 100.1 MiB -> 772.4 MiB``, then the smaller moves in one clause
    (``under 1.00 MiB each: sharded parameters -0.26 MiB``), as the page's last row."""
    from fsdpviz.analysis.memory_categories import TITLES
    from fsdpviz.whatif.predict import category_moves

    floor, listed, smaller = category_moves(baseline, predicted)
    out = [f"{TITLES[c]} {mib_text(b)} -> {mib_text(a)}" for c, b, a in listed]
    if out and smaller:
        out.append(f"under {mib_text(floor)} each: " + ", ".join(f"{TITLES[c]} {mib_change_text(d)}" for c, d in smaller))
    return out


def _unknown_lines(prediction: Prediction) -> None:
    """What the recorded peak cannot know (shown as "-"), and what the predicted one assumes."""
    from fsdpviz.analysis.memory_categories import TITLES

    by_why: dict[str, list[str]] = {}
    for c, why in prediction.baseline.memory_unknown.items():
        by_why.setdefault(why, []).append(TITLES.get(c, c))
    if by_why:
        typer.echo("  unknown at the peak (-): " + "; ".join(f"{', '.join(cs)}: {why}" for why, cs in by_why.items()))
    for c, why in prediction.predicted.memory_assumed.items():
        typer.echo(f"  assumed in the predicted peak: {TITLES.get(c, c)}: {why}")


def _table(header: tuple[str, ...], rows: Sequence[tuple[str, ...]]) -> None:
    widths = [max(len(r[i]) for r in (header, *rows)) for i in range(len(header))]
    for row in (header, *rows):
        typer.echo("  " + "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths))))


def print_prediction(prediction: Prediction, run: str, framework: str, world_size: int, device: str,
                     recorded_bound: BoundSummary | None = None) -> None:
    """Baseline vs predicted with deltas, the units, where each setting came from, and the notes; the
    recording's clock first. ``recorded_bound``: the recording's split, beside the prediction's
    (``prediction.bound``): FSDP's per-unit work and the idle time join the table, so that its parts add up
    to its step."""
    from fsdpviz.analysis.completeness import format_ranks
    from fsdpviz.whatif.predict import SPREAD_UNKNOWN, within_spread_words

    settings = prediction.settings
    typer.echo(f"{run}: {framework}, world size {world_size} on {device}; predicting {settings.describe()}")
    for warning in prediction.warnings:  # before any figure: what makes them weak
        typer.echo(f"warning: {warning}")
    for figure in prediction.assumed:
        typer.echo(f"assumed: {figure}")
    if prediction.clock is not None:  # the recording's clock, as `fsdpviz summary` says it
        read = prediction.clock.get("ranks")
        typer.echo(f"clock: {prediction.clock['note']}"
                   + (f"; the model read rank(s) {format_ranks(read)} only" if read else ""))
    from fsdpviz.whatif.predict import split_rows

    rows = _rows(prediction.baseline, prediction.predicted)
    split = prediction.bound
    rows[-1:-1] = [(label, f"{b:,.2f} ms", f"{a:,.2f} ms", change_text(b, a, "ms"))
                   for label, b, a in split_rows(recorded_bound, split)]
    _table(("", "recorded", "predicted", "change"), rows)
    if prediction.measurable is False:
        typer.echo(f"  {within_spread_words(prediction.spread_ms or 0.0)}")
    elif prediction.spread_ms is None:
        typer.echo(f"  {SPREAD_UNKNOWN}")
    changes = category_changes(prediction.baseline, prediction.predicted)
    if changes:
        typer.echo("  peak by category: " + "; ".join(changes))
    _unknown_lines(prediction)
    typer.echo("")
    typer.echo("predicted per unit (ms per step; medians over ranks and steps, each column its own, so exposed can "
               "exceed all-gather + reduce-scatter)")
    _table(("unit", "all-gather", "forward", "backward", "reduce-scatter", "exposed"),
           [(u.name, *("n/a" if v is None else f"{v:.2f}" for v in (  # n/a: unknown, the notes say why
               u.all_gather_ms, u.forward_ms, u.backward_ms, u.reduce_scatter_ms, u.exposed_comm_ms)))
            for u in prediction.predicted.units])
    typer.echo("")
    typer.echo("settings: " + "; ".join(_setting_words(settings, device, prediction.prefetch_arguments, framework)))
    typer.echo(f"replay: {prediction.replay_words()}")
    for note in prediction.notes:
        typer.echo(f"note: {note}")
    if split is not None and split.get("note"):
        typer.echo(f"note: {split['note']}")


def _setting_words(settings: Settings, device: str = "", prefetch: dict[str, object] | None = None,
                   framework: str = "") -> list[str]:
    """Each setting and where it came from: ``prefetch 1 (given)``, ``wrap as recorded``; on a CPU
    ``device`` the ranks per host are not GPUs; ``prefetch``: that setting in ``framework``'s own words and
    arguments (``prefetch implicit, FSDP1's default: ... (recorded: forward_prefetch=False,
    backward_prefetch=BACKWARD_PRE)``)."""
    from fsdpviz.replay.prefetch_args import depth_words
    from fsdpviz.replay.prefetch_args import words as argument_words
    from fsdpviz.replay.settings import setting_name

    words = []
    for key, v in settings.to_json().items():
        name, value, source = setting_name(key, device), v["value"], v["source"]
        # the value is the recording's, which is also where it came from
        if value == "recorded":
            words.append(f"{name} as recorded")
        else:
            text = str(value).lower() if isinstance(value, bool) else str(value)
            if key == "prefetch":
                text = depth_words(framework, text, prefetch)
            said = f"{source}: {argument_words(prefetch)}" if key == "prefetch" and prefetch else source
            words.append(f"{name} {text} ({said})")
    return words


def _bound_words(c: object) -> str:
    """``compute``, or ``memory (time: host)`` where the peak nears the budget; "-" without a split."""
    bound = getattr(c, "bound", None)
    if bound is None:
        return "-"
    return bound.kind if bound.kind == bound.time_kind else f"{bound.kind} (time: {bound.time_kind})"


def exploration_count(exploration: Exploration) -> str:
    """``7 setting(s) predicted (5 within the budget, 2 over it), 2 not tried``: every row the grid lists
    (``, 3 of unknown peak`` where the recording holds no memory to predict a peak from)."""
    listed = [*exploration.ranked, *exploration.within_spread, *exploration.unranked]
    over, skipped = len(exploration.over_budget), len(exploration.skipped)
    unknown = sum(c.fits is None for c in listed)
    text = f"{len(listed) + over} setting(s) predicted"
    if exploration.budget_bytes is not None:
        text += f" ({len(listed) - unknown} within the budget, {over} over it"
        text += f", {unknown} of unknown peak)" if unknown else ")"
    return text + (f", {skipped} not tried" if skipped else "")


def _uncoded(c: Candidate) -> bool:
    """A changed setting the script cannot be given as a change of its sharding code (``apply.note`` says
    why); the recorded setting changes nothing, so it needs none."""
    from fsdpviz.replay.settings import GIVEN

    apply = c.prediction.apply if c.prediction is not None else None
    return (apply is not None and apply.code is None
            and any(source == GIVEN for source in c.settings.sources.values()))


def print_exploration(exploration: Exploration, run: str) -> None:
    """The grid ranked: predicted step time and peak per setting, the budget, what was left out."""
    base = exploration.baseline
    budget = exploration.budget_bytes
    budget_words = (f"memory budget {mib_text(budget)} ({exploration.budget_source})" if budget is not None
                    else f"memory budget {exploration.budget_source}")
    typer.echo(f"{run}: recorded step {base.step_time_ms:,.2f} ms, peak {mib_text(base.peak_allocated_bytes)}; "
               f"{budget_words}")
    for warning in exploration.warnings:
        typer.echo(f"warning: {warning}")
    def row(c: object) -> tuple[str, ...]:
        from fsdpviz.whatif.explore import Candidate

        assert isinstance(c, Candidate) and c.prediction is not None
        p = c.prediction.predicted
        name = c.name + (" (no code)" if _uncoded(c) else "")
        return (name, f"{p.step_time_ms:,.2f} ms", change_text(base.step_time_ms, p.step_time_ms, "ms"),
                mib_text(p.peak_allocated_bytes), change_text(base.peak_allocated_bytes, p.peak_allocated_bytes, "bytes"),
                _bound_words(c))

    header = ("setting", "step", "change", "peak", "change", "bound")
    rows = [(str(i), *row(c)) for i, c in enumerate(exploration.ranked, 1) if c.prediction is not None]
    within = [("-", *row(c)) for c in exploration.within_spread if c.prediction is not None]
    unranked = [("-", *row(c)) for c in exploration.unranked if c.prediction is not None]
    if rows:
        # the ranked settings are those whose step moves past the spread, either way: a list whose first is
        # slower than the recording is not advice, and the heading says so
        typer.echo("ranked by predicted step time, each measurably faster or slower than the recording"
                   + ("" if exploration.best() is not None else f" (none faster than its {base.step_time_ms:,.2f} ms)")
                   + ":")
        _table(("#", *header), rows)
    if unranked:
        whole = any(w.startswith("unreliable") for w in exploration.warnings)
        typer.echo("predicted, not ranked: " + (
            "the replay does not explain the recording (see the warning)" if whole
            else "the recording's step-to-step spread is unknown (see the note)" if exploration.spread_ms is None
            else "their predictions do not hold together (see the note)"))
        _table(("#", *header), unranked)
    elif not rows and not within:
        typer.echo("  no setting's predicted peak fits the budget")
    if within:
        spread = exploration.spread_ms
        typer.echo(f"predicted, not ranked: not measurable in this recording (within the recording's step-to-step spread of "
                   f"{spread:,.2f} ms)")
        _table(("#", *header), within)
    over = [(*row(c), bytes_text(c.over_bytes)) for c in exploration.over_budget if c.prediction is not None]
    if over:
        typer.echo("over the budget:")
        _table((*header, "over by"), over)
    best = exploration.best()
    if best is not None and best.prediction is not None:
        p = best.prediction.predicted
        # a peak that cannot be predicted cannot be held to the budget: the setting is the fastest, no more
        title = ("fastest" if budget is None else "best within the budget" if best.fits
                 else "fastest (its peak unknown, so not held to the budget)")
        uncoded = _uncoded(best)
        typer.echo(f"{title}: {best.name} ({change_text(base.step_time_ms, p.step_time_ms, 'ms')} per step, "
                   f"peak {change_text(base.peak_allocated_bytes, p.peak_allocated_bytes, 'bytes') or 'unknown'})"
                   + ("; no code for it (see the note)" if uncoded else ""))
    elif exploration.ranked or exploration.within_spread:
        typer.echo("no setting is predicted measurably faster than the recording")
    for c in exploration.skipped:
        typer.echo(f"not tried: {c.name}: {c.skipped}")
    for note in exploration.notes:
        typer.echo(f"note: {note}")
    no_code: dict[str, list[str]] = {}  # why there is no code -> the settings it holds for
    for c in (*exploration.ranked, *exploration.within_spread, *exploration.unranked, *exploration.over_budget):
        if _uncoded(c):
            assert c.prediction is not None and c.prediction.apply is not None
            no_code.setdefault(c.prediction.apply.note or "whatif --code writes none", []).append(c.name)
    for why, names in no_code.items():
        if len(names) == 1:  # a note that names its setting itself
            why = why.removeprefix(f"{names[0]}: ")
        typer.echo(f"note: no code for {', '.join(names)}: {why}")
    # a bound a setting's prediction or its split hit, with the setting it changed (whatif's notes)
    for c in (*exploration.ranked, *exploration.within_spread, *exploration.unranked, *exploration.over_budget):
        said = [*(c.prediction.clamps if c.prediction is not None else []),
                *([c.bound.note] if c.bound is not None and c.bound.note else [])]
        for clamp in dict.fromkeys(said):
            typer.echo(f"note: {c.name}: {clamp}")
