"""Every registered algorithm reproduces its recorded metrics (``golden.py``).

Counts, bytes, rounds and keys must match exactly. Floats match to a relative 1e-3: the
recorded values come from one CPU, and another CPU's float32 kernels (AVX2 against
AVX-512) sum in another order, which moved them by at most 4e-4 (a diagnostic after three
rounds; losses and accuracies by far less). A change to an update rule moves them by far
more than that within the recorded rounds.
"""

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
    got, expected = golden_run(task, name), RECORDED[task][name]
    assert [sorted(r) for r in got] == [sorted(r) for r in expected]
    for new, old in zip(got, expected):
        for key, value in old.items():
            if isinstance(value, float):
                assert new[key] == pytest.approx(value, rel=1e-3, abs=1e-6), (new["round"], key)
            else:
                assert new[key] == value, (new["round"], key)
