"""Partitioners: exact coverage, determinism, and each scheme's defining property."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedforge.data import (
    PARTITIONERS,
    build_federated_dataset,
    dirichlet_label,
    load_dataset,
    natural,
    partition,
    quantity_skew,
    shards,
)

LABELS = np.random.default_rng(123).integers(0, 10, 5000)
CASES = {
    "iid": {},
    "dirichlet": {"alpha": 0.3},
    "shards": {"classes_per_client": 2},
    "quantity_skew": {"sigma": 1.5},
}


def _rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


@pytest.mark.parametrize("name", list(CASES))
def test_every_sample_exactly_once(name):
    parts = partition(name, LABELS, 20, _rng(), **CASES[name])
    assert len(parts) == 20
    assert all(p.dtype == np.int64 and p.ndim == 1 for p in parts)
    assert np.array_equal(np.sort(np.concatenate(parts)), np.arange(len(LABELS)))


@pytest.mark.parametrize("name", list(CASES))
def test_seed_determinism(name):
    a = partition(name, LABELS, 20, _rng(7), **CASES[name])
    b = partition(name, LABELS, 20, _rng(7), **CASES[name])
    c = partition(name, LABELS, 20, _rng(8), **CASES[name])
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    assert not all(np.array_equal(x, y) for x, y in zip(a, c, strict=True))


def test_iid_balanced():
    sizes = [len(p) for p in partition("iid", LABELS, 7, _rng())]
    assert max(sizes) - min(sizes) <= 1


def test_dirichlet_min_size_and_skew():
    parts = dirichlet_label(LABELS, 20, 0.1, _rng(), min_size=20)
    assert min(len(p) for p in parts) >= 20
    # alpha = 0.1 is strongly skewed: the typical client is dominated by few classes
    top_share = [np.bincount(LABELS[p], minlength=10).max() / len(p) for p in parts]
    assert np.median(top_share) > 0.4
    near_iid = dirichlet_label(LABELS, 10, 1000.0, _rng())
    assert max(np.bincount(LABELS[p]).max() / len(p) for p in near_iid) < 0.2


def test_dirichlet_impossible_min_size():
    with pytest.raises(ValueError, match="min_size"):
        dirichlet_label(LABELS[:100], 10, 0.05, _rng(), min_size=10, max_tries=20)
    with pytest.raises(ValueError, match="min_size=10 for each of 10 clients"):
        dirichlet_label(LABELS[:50], 10, 1.0, _rng(), min_size=10)


def test_shards_classes_per_client():
    labels = np.repeat(np.arange(10), 600)  # shards never straddle a class boundary
    parts = shards(labels, 100, 2, _rng())
    assert all(len(p) == 60 for p in parts)
    assert all(len(np.unique(labels[p])) <= 2 for p in parts)
    assert np.mean([len(np.unique(labels[p])) == 2 for p in parts]) > 0.7


def test_quantity_skew_sizes():
    parts = quantity_skew(5000, 30, _rng(), sigma=1.0, min_size=20)
    sizes = np.array([len(p) for p in parts])
    assert sizes.sum() == 5000 and sizes.min() >= 20 and sizes.std() > 50


def test_natural_keeps_groups_intact():
    groups = np.random.default_rng(1).integers(100, 140, 3000) * 3  # non-contiguous ids
    parts = natural(groups)
    uniq = np.unique(groups)
    assert len(parts) == len(uniq)
    for g, p in zip(uniq, parts, strict=True):
        assert np.array_equal(p, np.flatnonzero(groups == g))
    first = partition("natural", LABELS[:3000], 5, _rng(), groups=groups)
    assert all(np.array_equal(a, b) for a, b in zip(first, parts[:5], strict=True))


def test_natural_femnist_writers(shared_data):
    s = load_dataset("femnist", shared_data)
    fd = build_federated_dataset(s, "natural", None, seed=0)
    assert fd.num_clients == 300 and int(fd.client_sizes().sum()) == 41224
    for k, (tr, te) in enumerate(zip(fd.client_indices, fd.client_test_indices, strict=True)):
        assert np.unique(s.train_groups[tr.numpy()]).tolist() == [k]
        assert np.unique(s.test_groups[te.numpy()]).tolist() == [k]
        assert len(tr) == int((s.train_groups == k).sum())


def test_dispatcher_errors():
    assert {"iid", "dirichlet", "shards", "quantity_skew", "natural"} <= set(PARTITIONERS)
    with pytest.raises(ValueError, match="unknown partitioner"):
        partition("round_robin", LABELS, 5, _rng())
    with pytest.raises(ValueError, match="alpha"):
        partition("dirichlet", LABELS, 5, _rng())
    with pytest.raises(ValueError, match="unknown option"):
        partition("iid", LABELS, 5, _rng(), alpha=0.5)
    with pytest.raises(ValueError, match="groups"):
        partition("natural", LABELS, 5, _rng())
    with pytest.raises(ValueError, match="num_clients"):
        partition("iid", LABELS, None, _rng())
    with pytest.raises(ValueError, match="num_clients"):
        partition("iid", LABELS, 0, _rng())


def test_tensor_labels_and_alias():
    a = partition("dirichlet_label", torch.from_numpy(LABELS), 8, _rng(), alpha=0.5)
    b = partition("dirichlet", LABELS, 8, _rng(), alpha=0.5)
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
