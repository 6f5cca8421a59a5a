"""Partition metadata as arrays: partition.npz round-trips, old partition.json folders load."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from fedforge.data import FederatedDataset
from fedforge.data.population import make_population
from fedforge.experiment.partition_stats import (
    load_partition_arrays,
    load_partition_stats,
    partition_summary,
    save_partition_stats,
)


def _toy() -> FederatedDataset:
    y = torch.tensor([0, 1, 1, 2, 0, 2, 2])
    parts = [torch.tensor([0, 1, 2]), torch.tensor([], dtype=torch.int64),
             torch.tensor([6, 5, 3, 4])]
    return FederatedDataset(torch.zeros(7, 1), y, torch.zeros(1, 1), y[:1], parts, None, 3,
                            (1,), "toy", client_names=["a", "b", "c"])


def test_sizes_and_label_counts_round_trip_through_the_arrays(tmp_path):
    save_partition_stats(_toy(), tmp_path)
    summary = json.loads((tmp_path / "partition.json").read_text())
    assert summary["sizes"] == {"total": 7, "min": 0, "median": 3.0, "max": 4}
    assert summary["arrays"] == "partition.npz" and summary["label_counts"] is True
    arrays = load_partition_arrays(tmp_path)
    assert arrays["sizes"].tolist() == [3, 0, 4] and arrays["sizes"].dtype == np.int64
    assert arrays["label_counts"].tolist() == [[1, 2, 0], [0, 0, 0], [1, 0, 3]]
    stats = load_partition_stats(tmp_path)
    assert stats["sizes"] == [3, 0, 4] and stats["client_names"] == ["a", "b", "c"]
    assert stats["label_counts"] == [[1, 2, 0], [0, 0, 0], [1, 0, 3]]
    text = "3 clients, 7 training samples; per client: min 0, median 3, max 4"
    assert partition_summary(stats) == partition_summary(summary) == text


def test_an_old_partition_json_with_lists_still_loads(tmp_path):
    old = {"dataset": "synthetic", "num_clients": 2, "num_classes": 2, "sizes": [5, 6],
           "label_counts": [[2, 3], [6, 0]], "client_names": None}
    (tmp_path / "partition.json").write_text(json.dumps(old))
    assert load_partition_stats(tmp_path) == old
    arrays = load_partition_arrays(tmp_path)
    assert arrays["sizes"].tolist() == [5, 6] and arrays["label_counts"].tolist() == old[
        "label_counts"]
    assert partition_summary(old) == ("2 clients, 11 training samples; per client: min 5, "
                                      "median 5.5, max 6")
    assert load_partition_stats(tmp_path / "none") is None


def test_a_population_keeps_sizes_only(tmp_path):
    data = make_population(num_clients=1000, max_samples_per_client=100)
    save_partition_stats(data, tmp_path)
    arrays = load_partition_arrays(tmp_path)
    assert set(arrays) == {"sizes"} and np.array_equal(arrays["sizes"],
                                                       data.client_sizes().numpy())
    assert load_partition_stats(tmp_path)["label_counts"] is None


def test_a_summary_that_disagrees_with_its_arrays_is_one_line(tmp_path):
    save_partition_stats(_toy(), tmp_path)
    path = tmp_path / "partition.json"
    summary = json.loads(path.read_text())
    path.write_text(json.dumps({**summary, "num_clients": 4}))
    with pytest.raises(ValueError, match="num_clients"):
        load_partition_stats(tmp_path)
    path.write_text(json.dumps(summary))
    (tmp_path / "partition.npz").write_bytes(b"not a zip")
    with pytest.raises(ValueError, match=r"partition.npz: not a readable \.npz"):
        load_partition_stats(tmp_path)
