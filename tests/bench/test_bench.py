"""Benchmark plumbing (not speed): workloads build, engines agree, results are recorded."""

import pytest
import torch

from fedforge.bench import append_results
from fedforge.bench.throughput import Workload, make_data, run_w1
from fedforge.bench.time_to_accuracy import first_reaching

TINY = Workload("T", "logreg", (1, 28, 28), steps=2, batch=4)


def test_make_data_gives_each_client_its_own_epoch():
    x, y, idx = make_data(3, torch.device("cpu"), TINY)
    assert x.shape == (3 * 8, 1, 28, 28) and idx.shape == (3, 2, 4)
    for c in range(3):  # a permutation of the client's own 8 samples
        assert sorted(idx[c].flatten().tolist()) == list(range(8 * c, 8 * c + 8))


def test_run_w1_rows_and_results_file(tmp_path):
    rows = run_w1([2], ["plain", "loop", "vmap", "vmap:bf16"], torch.device("cpu"), work=TINY)
    assert [r[0] for r in rows] == ["plain", "loop", "vmap", "vmap:bf16"]
    assert all(r[1] == 2 and r[2] > 0 for r in rows) and rows[0][4] == "1.00x"
    path = tmp_path / "RESULTS.md"
    append_results(path, "T", torch.device("cpu"), ["engine", "cohort", "u/s", "GiB", "x"], rows)
    text = path.read_text()
    assert "| vmap:bf16 | 2 |" in text and "torch " + torch.__version__ in text


def test_unknown_engine_is_a_clear_error():
    with pytest.raises(ValueError, match="--engines"):
        run_w1([1], ["jax"], torch.device("cpu"), work=TINY)


def test_first_reaching():
    hist = [{"round": 5, "test_accuracy": 0.5}, {"round": 10, "test_accuracy": 0.81},
            {"round": 15, "test_accuracy": 0.9}]
    assert first_reaching(hist, 0.8)["round"] == 10
    assert first_reaching(hist, 0.95) is None
