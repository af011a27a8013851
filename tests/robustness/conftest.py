"""Fixtures of the robustness suite."""

from __future__ import annotations

from pathlib import Path

import pytest
from badinputs import good_trace


@pytest.fixture(scope="session")
def good_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small loadable 2-rank run: the baseline ``compare`` gets next to the run under test."""
    folder = tmp_path_factory.mktemp("good")
    good_trace(rank=0).write(folder / "rank0.trace.json")
    good_trace(rank=1).write(folder / "rank1.trace.json")
    return folder
