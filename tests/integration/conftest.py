"""Fixtures of the integration suite."""

from __future__ import annotations

import pytest
from recording import Recordings


@pytest.fixture(scope="session")
def recordings(tmp_path_factory: pytest.TempPathFactory) -> Recordings:
    """Recordings of the example trainer made once per session (see ``recording.py``); read them, never write."""
    return Recordings(tmp_path_factory.mktemp("recordings"))
