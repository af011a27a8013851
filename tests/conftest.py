"""Shared fixtures: where the real GPU traces live, and the repository root."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
# Real GPU traces (not part of this repository) live beside the checkout; see docs/testing.md.
GPU_REAL_DIR = REPO_ROOT.parent / "shared" / "traces" / "gpu-real"
SAMPLE_TRACES_DIR = REPO_ROOT / "sample_traces"


@pytest.fixture(scope="session")
def gpu_real_dir() -> Path:
    """The folder of real GPU traces; tests that need it skip with a reason when it is missing."""
    if not GPU_REAL_DIR.is_dir():
        pytest.skip(f"real GPU traces not found at {GPU_REAL_DIR}")
    return GPU_REAL_DIR


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO_ROOT
