"""Unknown stays null through ``whatif``: a unit's predicted figures where the model cannot move them.

A unit's predicted figures are its members' recorded ones moved by the share the replay moves them
(``whatif/predict.py``). A member the replay of the recording ran nothing of has no share: its figures
are unknown, not its recorded ones over a replayed 0. Known by construction: the bundled FSDP2 sample's
model with one unit's spans taken out of its replays of the recording (the replays without the
profiler, which the change is read against), the setting's replays as they are.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import pytest

from fsdpviz.replay.model import read_model
from fsdpviz.replay.settings import Settings
from fsdpviz.whatif.predict import predict


def test_a_unit_the_replay_ran_nothing_of_predicts_null_and_says_why(sample_run: Callable[[str], Any]) -> None:
    result = sample_run("fsdp2-cpu-2rank")
    whole = predict(read_model(result), Settings().with_(prefetch="2"))
    units = [u.name for u in whole.predicted.units]
    gone = units[1]
    assert all(u.forward_ms is not None and u.forward_ms > 0 for u in whole.predicted.units)

    model = read_model(result)
    # the replays the change is read against: without the profiler where the model has one
    timing = model.net or model
    timing.replays = [dataclasses.replace(sim, spans=[s for s in sim.spans if s.unit != gone])
                      for sim in timing.replays]
    p = predict(model, Settings().with_(prefetch="2"))
    by_name = {u.name: u for u in p.predicted.units}
    unknown = by_name[gone]
    assert [unknown.all_gather_ms, unknown.forward_ms, unknown.backward_ms, unknown.reduce_scatter_ms,
            unknown.exposed_comm_ms] == [None] * 5
    # every other unit keeps the figures the whole replay gave it: nothing else read the missing spans
    for u in whole.predicted.units:
        if u.name != gone:
            assert by_name[u.name].forward_ms == pytest.approx(u.forward_ms, abs=1e-3)
            assert by_name[u.name].backward_ms == pytest.approx(u.backward_ms, abs=1e-3)
    (note,) = [n for n in p.notes if n.startswith("per-unit figures unknown")]
    assert f"{gone} ({gone})" in note
    assert p.to_json()["predicted"]["units"][units.index(gone)]["forward_ms"] is None


def test_a_unit_no_replay_ran_is_listed_null_not_dropped(sample_run: Callable[[str], Any]) -> None:
    """The same sample with one unit's passes, gathers and reductions taken out of the steps the change
    is read against: neither the replay of the recording nor the setting's runs anything of it. The unit
    is still listed, with null figures, and the notes say so."""
    from fsdpviz.replay import program as prog
    from fsdpviz.replay.model import recorded_settings
    from fsdpviz.replay.simulate import run

    result = sample_run("fsdp2-cpu-2rank")
    model = read_model(result)
    gone = predict(model, Settings().with_(prefetch="2")).predicted.units[1].name
    timing = model.net or model

    def without(step: Any) -> Any:
        micro = [dataclasses.replace(m, forward=[p for p in m.forward if p.unit != gone],
                                     backward=[p for p in m.backward if p.unit != gone]) for m in step.micro]
        return dataclasses.replace(step, micro=micro, gathers=[g for g in step.gathers if g.unit != gone],
                                   reduces=[r for r in step.reduces if r.unit != gone])

    timing.recording = dataclasses.replace(timing.recording, steps=[without(s) for s in timing.recording.steps])
    timing.replays = [run(prog.build(timing.recording, s, recorded_settings(), timing.comm, timing.gathers), False)
                      for s in timing.recording.steps]
    assert all(s.unit != gone for r in timing.replays for s in r.spans)
    p = predict(model, Settings().with_(prefetch="2"))
    (unknown,) = [u for u in p.predicted.units if u.name == gone]
    assert [unknown.all_gather_ms, unknown.forward_ms, unknown.backward_ms, unknown.reduce_scatter_ms,
            unknown.exposed_comm_ms] == [None] * 5
    assert len(p.predicted.units) == len(p.baseline.units)
    assert any(n.startswith("per-unit figures unknown") and gone in n for n in p.notes)


def test_steps_that_last_no_time_predict_nothing(sample_run: Callable[[str], Any]) -> None:
    """A recording whose traced steps last no time has no replay miss to report (it is unknown, not 0 %):
    whatif says so in one line instead of predicting from it."""
    from fsdpviz.errors import NoDataError

    model = read_model(sample_run("fsdp2-cpu-2rank"))
    model.recording = dataclasses.replace(model.recording,
                                          steps=[dataclasses.replace(s, step_ns=0) for s in model.recording.steps])
    with pytest.raises(NoDataError, match="the recorded steps last no time"):
        predict(model, Settings().with_(prefetch="2"))
