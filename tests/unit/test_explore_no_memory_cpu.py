"""``whatif --explore`` on a CPU recording without memory: no budget and no peak, so no setting is said
to fit (``fits_budget`` null, as docs/whatif.md says of an unknown peak), and each row says why its
peak is null. The recording is the bundled FSDP2 sample with its memory samples taken out."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

from fsdpviz.analysis.pipeline import analyse
from fsdpviz.replay.model import read_model
from fsdpviz.whatif.explore import explore

SAMPLE = Path(__file__).resolve().parents[2] / "sample_traces" / "fsdp2-cpu-2rank"


def _without_memory(tmp_path: Path) -> Path:
    run = tmp_path / "run"
    shutil.copytree(SAMPLE, run)
    for trace in (run / "traces").glob("*.trace.json.gz"):
        with gzip.open(trace, "rt") as f:
            data = json.load(f)
        data["traceEvents"] = [e for e in data["traceEvents"] if e.get("name") != "[memory]"]
        with gzip.open(trace, "wt") as f:
            json.dump(data, f)
    return run


def test_without_memory_or_budget_no_setting_is_said_to_fit(tmp_path: Path) -> None:
    exploration = explore(read_model(analyse([_without_memory(tmp_path)], cache=False, progress=False)))
    rows = [c.to_json() for c in (*exploration.ranked, *exploration.within_spread, *exploration.unranked)]
    assert len(rows) >= 5
    for row in rows:
        assert row["peak_allocated_bytes"] is None and row["peak_unknown"]
        assert row["fits_budget"] is None
