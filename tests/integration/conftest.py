"""Fixtures of the integration suite."""

from __future__ import annotations

import pytest
from helpers.once import session_root
from recording import MeshRecordings, Recordings


@pytest.fixture(scope="session")
def recordings(tmp_path_factory: pytest.TempPathFactory) -> Recordings:
    """Recordings of the example trainer made once per session, shared by every xdist worker (see
    ``recording.py``); read them, never write."""
    return Recordings(session_root(tmp_path_factory) / "recordings")


@pytest.fixture(scope="session")
def mesh_recordings(tmp_path_factory: pytest.TempPathFactory) -> MeshRecordings:
    """4-rank recordings of ``record_scripts/mesh_train.py`` (TP x FSDP2, HSDP), once per session,
    shared by every xdist worker."""
    return MeshRecordings(session_root(tmp_path_factory) / "mesh")
