"""Fixtures for the data tests: where the real datasets live (skip when absent)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """Folder holding mnist/, cifar10/ ...: $FEDFORGE_TEST_DATA or <repo>/../shared/data."""
    path = Path(os.environ.get("FEDFORGE_TEST_DATA", REPO_ROOT.parent / "shared" / "data"))
    if not path.is_dir():
        pytest.skip("../shared/data not found: set FEDFORGE_TEST_DATA")
    return path
