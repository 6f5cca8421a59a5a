"""Synthetic(alpha, beta): deterministic, fast, right shapes and per-client 80/20 split."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedforge.data import load_dataset, make_synthetic
from fedforge.data.synthetic import train_count


def test_defaults_shapes_and_groups():
    s = load_dataset("synthetic")
    assert s.name == "synthetic" and s.num_classes == 10 and s.input_shape == (60,)
    assert s.train_x.dtype == torch.float32 and s.train_x.shape[1:] == (60,)
    assert s.train_y.dtype == torch.int64 and s.test_y.dtype == torch.int64
    assert s.train_x.shape[0] == s.train_y.shape[0] == len(s.train_groups)
    assert s.test_x.shape[0] == s.test_y.shape[0] == len(s.test_groups)
    assert 0 <= int(s.train_y.min()) and int(s.train_y.max()) < 10
    assert np.unique(s.train_groups).tolist() == list(range(30))
    assert np.unique(s.test_groups).tolist() == list(range(30))
    n_tr = np.bincount(s.train_groups)
    n = n_tr + np.bincount(s.test_groups)
    assert n.min() >= 50
    assert np.array_equal(n_tr, np.round(0.8 * n).astype(int))
    assert len(np.unique(s.train_y)) > 3  # not degenerate


def test_deterministic_in_seed():
    a, b = make_synthetic(seed=5), make_synthetic(seed=5)
    assert torch.equal(a.train_x, b.train_x) and torch.equal(a.test_y, b.test_y)
    assert np.array_equal(a.train_groups, b.train_groups)
    c = make_synthetic(seed=6)
    assert a.train_x.shape != c.train_x.shape or not torch.equal(a.train_x, c.train_x)


def test_options():
    s = load_dataset("synthetic", alpha=0.5, beta=0.5, num_clients=100, seed=3)
    assert len(np.unique(s.train_groups)) == 100
    small = make_synthetic(num_clients=4, dim=8, num_classes=3, max_samples_per_client=60)
    assert small.input_shape == (8,) and small.train_x.shape[1] == 8
    assert np.bincount(small.train_groups).max() <= 48 and int(small.train_y.max()) < 3
    iid = make_synthetic(iid=True, seed=1)
    assert iid.train_x.shape[1] == 60


def test_heterogeneity_grows_with_alpha_beta():
    def spread(s):  # how different the clients' label distributions are
        h = np.stack(
            [np.bincount(s.train_y.numpy()[s.train_groups == k], minlength=10) for k in range(30)]
        ).astype(float)
        h /= h.sum(1, keepdims=True)
        return np.abs(h - h.mean(0)).sum(1).mean()

    assert spread(make_synthetic(0.0, 0.0, seed=0, iid=True)) < spread(make_synthetic(1, 1))


def test_bad_arguments():
    with pytest.raises(ValueError):
        make_synthetic(num_clients=0)
    with pytest.raises(ValueError):
        make_synthetic(train_fraction=1.0)
    with pytest.raises(ValueError, match="unknown option"):
        load_dataset("synthetic", clients=3)


def test_train_count_rounds_half_to_even_and_keeps_both_sides():
    # 2.5 -> 2 and 0.5 -> 0 -> 1 (half to even, then at least one training sample);
    # 9.9 of 10 -> 10 -> 9 (at least one test sample); the same rule for both generators
    n = np.array([5, 10, 2, 10, 7])
    frac = [0.5, 0.99, 0.25, 0.8, 0.5]
    got = [int(train_count(k, f)) for k, f in zip(n, frac, strict=True)]
    assert got == [2, 9, 1, 8, 4]
    assert train_count(n, 0.5).tolist() == [2, 5, 1, 5, 4]
