"""A CPU recording read net of the profiler's cost per traced host event (replay/recording.py).

Truth from outside the reading: the recorder's timers time clean unprofiled steps beside the
profiled ones. The profiler's excess per step (profiled minus clean, timed), spread over the host
events the profiler traced, is taken off every event; the replay of what is left is not fitted to the
clean steps, so landing on them is the reading's own. On the bundled FSDP2 and FSDP1 recordings it
does (0.0 % and 2.6 %), where the traced replay runs 21 % and 14 % above them.
"""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest

from fsdpviz.analysis.pipeline import analyse
from fsdpviz.replay import hostcost
from fsdpviz.replay.model import net_of_events, read_model
from fsdpviz.structure.profiler_cost import clean_step_ms

SAMPLES = Path(__file__).resolve().parents[2] / "sample_traces"


@pytest.mark.parametrize("sample", ["fsdp2-cpu-2rank", "fsdp1-cpu-2rank"])
def test_the_replay_net_of_each_traced_event_lands_on_the_clean_steps(sample: str) -> None:
    result = analyse([SAMPLES / sample], cache=False, progress=False)
    model = read_model(result)
    rec = model.recording
    assert rec.device == "cpu" and rec.host_ops_per_step > 100  # ops, hooks and FSDP's labels per step
    cost = result.summary.profiler
    assert cost is not None
    clean = statistics.median(ms for ms, _n in clean_step_ms(result.traces.timers, result.traces.run).values())
    traced = statistics.median(r.step_ns for r in model.replays) / 1e6
    assert traced > 1.1 * clean  # the profiler's share is large enough to tell the readings apart
    per_event_ns = hostcost.per_op_ns(cost, rec)
    net = net_of_events(result, per_event_ns)
    replayed = statistics.median(r.step_ns for r in net.replays) / 1e6
    assert abs(replayed - clean) <= 0.05 * clean
