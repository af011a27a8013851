"""A setting written as whatif's options (``Settings.flags``, what an advised knob names) is the setting
the whatif command reads back: each kind of option, a wrap pattern with capitals, backslashes and
shell characters included, through the command's own parsing (``fsdpviz whatif ... --json``)."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
from helpers.cli import json_here

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
    # partial resharding has no option of its own: the knob is left as it was
    assert _naming(knob, Settings().with_(keep_last_units=1)) == knob
