"""Shared by the privacy tests."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def one_torch_thread():
    """These tests train a 610-parameter model a few examples at a time: one intra-op thread
    is faster, and about 10x faster on a busy machine (thread spinning); restored afterwards."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
