"""Every registered algorithm reproduces its recorded metrics exactly (``golden.py``)."""

from __future__ import annotations

import json

import pytest

from tests.golden.golden import DATA, GOLDEN, TASKS, golden_run

RECORDED = json.loads(GOLDEN.read_text())
CASES = [(task, name) for task in TASKS for name in RECORDED.get(task, {})]


@pytest.mark.slow
@pytest.mark.parametrize(("task", "name"), CASES, ids=[f"{t}-{n}" for t, n in CASES])
def test_metrics_equal_the_recorded_ones(task, name):
    if task == "mnist_cnn" and not (DATA / "mnist").is_dir():
        pytest.skip(f"MNIST not found in {DATA}")
    assert golden_run(task, name) == RECORDED[task][name]
