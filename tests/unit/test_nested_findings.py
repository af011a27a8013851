"""A unit nested in another (experts sharded inside their block) runs inside its holder's pass: the
holder's compute before it, then the nested unit's, then the rest of the holder's. A finding about the
nested unit's gather names the part of its holder before it, never the holder as if it had finished.
The holders are read from run.json's unit names alone: a unit's module inside another unit's module is
nested in it (FSDP2 shards a module inside another apart)."""

from __future__ import annotations

import json
from pathlib import Path

from fsdpviz.analysis.pipeline import analyse
from fsdpviz.whatif.gains import completed_summary

RUN = Path(__file__).parents[1] / "recorded" / "nested-moe-no-sync-fsdp2" / "run"


def test_a_nested_units_gather_follows_the_part_of_its_holder_before_it() -> None:
    units = [u["unit"] for u in json.loads((RUN / "run.json").read_text())["units"]]
    nested = {u: max(held, key=len) for u in units if (held := [h for h in units if u.startswith(h + ".")])}
    assert nested == {"blocks.4.moe.experts": "blocks.4", "blocks.5.moe.experts": "blocks.5"}
    summary = completed_summary(analyse([RUN], cache=False, progress=False))
    said = [f.message for f in summary.findings if f.kind == "exposed_all_gather" and f.unit in nested
            and " only after " in f.message]
    assert said  # the recording has one: the experts' forward gather waits for its block's first part
    for message in said:
        unit = message.split(":")[0]
        assert f"after the part of {nested[unit]} before it ({nested[unit]} holds it)" in message, message
        assert f"after {nested[unit]} had finished computing" not in message, message
