"""Fixtures for the data tests: where the real datasets live (skip when absent)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.data_location import TEST_DATA


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """Folder holding mnist/, cifar10/ ...: tests/data_location.py."""
    if not TEST_DATA.is_dir():
        pytest.skip(f"{TEST_DATA} not found: set FEDFORGE_TEST_DATA")
    return TEST_DATA
