"""A setting written as whatif's options (``Settings.flags``, what an advised knob names) is the setting
the whatif command reads back: each kind of option, a wrap pattern with capitals, backslashes and
shell characters included, through the command's own parsing (``fsdpviz whatif ... --json``)."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
from helpers.cli import json_here, run_here

from fsdpviz.replay.settings import Settings, Wrap
from fsdpviz.whatif.gains import _naming

SAMPLE = Path(__file__).parents[2] / "sample_traces" / "fsdp2-cpu-2rank"
SETTINGS = [
    Settings().with_(wrap=Wrap("root")),
    Settings().with_(wrap=Wrap("merge", k=2)),
    Settings().with_(wrap=Wrap("match", pattern=r"(?i)^BLOCKS\.\d+$")),
    Settings().with_(prefetch="none"),
    Settings().with_(prefetch="2", reshard_after_forward=False),
    Settings().with_(world_size=4, gpus_per_node=4),
    # the advisor's partial resharding (--explore's "no reshard after forward for the last 1 unit")
    Settings().with_(keep_last_units=1),
]


@pytest.mark.parametrize("settings", SETTINGS, ids=lambda s: s.describe())
def test_flags_are_read_back_as_the_setting(settings: Settings, capsys: pytest.CaptureFixture[str]) -> None:
    flags = settings.flags()
    assert flags is not None
    data = json_here(capsys, "whatif", str(SAMPLE), *shlex.split(flags), "--json", "-q", "--no-cache")
    read = data["predicted"]["settings"]
    for key, entry in settings.to_json().items():
        if settings.sources.get(key) == "given":
            assert read[key]["source"] == "given" and read[key]["value"] == entry["value"], key


def test_a_knob_names_its_setting_whatever_the_pattern_holds() -> None:
    settings = SETTINGS[2]
    knob = "fewer or larger units (fsdpviz whatif --wrap merge:2, or root): fewer hooks and copies"
    named = _naming(knob, settings)
    assert named == f"fewer or larger units (fsdpviz whatif {settings.flags()}): fewer hooks and copies"
    assert shlex.split(named.split("(fsdpviz whatif ", 1)[1].split("): ")[0]) == ["--wrap", r"match:(?i)^BLOCKS\.\d+$"]
    # partial resharding has its option too: an advised knob names it
    assert _naming(knob, Settings().with_(keep_last_units=2)) == \
        "fewer or larger units (fsdpviz whatif --keep-last-units 2): fewer hooks and copies"


def test_an_advised_partial_resharding_is_what_its_option_predicts(capsys: pytest.CaptureFixture[str]) -> None:
    """The summary of the committed plain-profiler FSDP2 run advises keeping the last unit's parameters
    (its backward regathers them, exposed); ``--keep-last-units 1`` predicts the same change, so the
    advice can be checked and its code asked for from the command line."""
    run = Path(__file__).parents[1] / "recorded" / "fsdp2-cpu-profile" / "traces"
    summary = json_here(capsys, "summary", str(run), "--json", "-q", "--no-cache")
    kept = [a for a in summary["actions"] if "no reshard after forward for the last 1 unit" in a["predicted_gain"]]
    assert len(kept) == 1 and kept[0]["predicted_change_ms"] is not None, summary["actions"]
    data = json_here(capsys, "whatif", str(run), "--keep-last-units", "1", "--json", "-q", "--no-cache")
    change = data["predicted"]["step_time_ms"] - data["baseline"]["step_time_ms"]
    assert change == pytest.approx(kept[0]["predicted_change_ms"], abs=1e-3)
    assert data["predicted"]["settings"]["keep_last_units"] == {"value": 1, "source": "given"}
    # not given, the resharding is each unit's as recorded: said so, not as a count of 0 that
    # --keep-last-units refuses
    other = json_here(capsys, "whatif", str(run), "--prefetch", "1", "--json", "-q", "--no-cache")
    assert other["predicted"]["settings"]["keep_last_units"] == {"value": "recorded", "source": "recorded"}
    refused = run_here(capsys, "whatif", str(run), "--keep-last-units", "0", "-q", "--no-cache")
    assert refused.returncode == 2 and "needs at least 1 unit" in refused.stderr


def test_the_options_are_read_as_the_command_line_reads_them() -> None:
    """What the command's parser hands over (``--world-size 4.0`` as 4, ``--prefetch 01``) and the notebook's
    values of other types come to one setting, spelled one way: the JSON and the settings line say 1, not 01."""
    from fsdpviz.replay.settings import settings_of

    a = settings_of(prefetch="01", world_size=4.0, keep_last_units=2.0)  # type: ignore[arg-type]
    b = settings_of(prefetch=2 - 1, world_size=4, keep_last_units=2)  # type: ignore[arg-type]
    assert a.to_json() == b.to_json() and a.flags() == b.flags() == "--prefetch 1 --keep-last-units 2 --world-size 4"
    assert a.to_json()["world_size"] == {"value": 4, "source": "given"}
    assert settings_of(wrap="merge:02").to_json()["wrap"]["value"] == "merge:2"
    assert settings_of(inter_node_gbps=12.5).inter_node_gbps == 12.5
    # a notebook's numbers as numpy or pandas hand them over, and a float prefetch
    import numpy as np

    c = settings_of(prefetch=1.0, world_size=np.int64(4), keep_last_units=np.int32(2),  # type: ignore[arg-type]
                    reshard_after_forward=np.bool_(False), inter_node_gbps=np.float32(2.5))
    assert c.flags() == "--prefetch 1 --reshard-after-forward false --keep-last-units 2 --world-size 4 --inter-node-gbps 2.5"
    assert type(c.world_size) is int and type(c.reshard_after_forward) is bool
