"""The paper's per-class Dirichlet split (FedPTR App. D) and explicit empty-client handling."""

import warnings

import numpy as np
import pytest
import torch

from fedforge.data.base import DatasetSplits
from fedforge.data.batching import client_batches
from fedforge.data.federated import build_federated_dataset
from fedforge.data.partition import dirichlet_class, partition

LABELS = np.repeat(np.arange(4), 50)  # 4 classes x 50


def test_every_sample_once_and_alpha_small_gives_one_owner_per_class():
    parts = dirichlet_class(LABELS, 6, 0.001, np.random.default_rng(0))
    allidx = np.concatenate(parts)
    assert sorted(allidx.tolist()) == list(range(200))
    owners = [{i for i, p in enumerate(parts) if np.isin(np.flatnonzero(LABELS == c), p).any()}
              for c in range(4)]
    assert all(len(o) <= 2 for o in owners)  # nearly all of a class goes to one client
    assert sum(len(p) == 0 for p in parts) >= 2  # 4 classes over 6 clients: some are empty


def test_fraction_keeps_share_of_each_class():
    parts = partition("dirichlet_class", LABELS, 3, np.random.default_rng(1), alpha=1.0,
                      fraction=0.2)
    kept = np.concatenate(parts)
    assert len(kept) == 40 and len(set(kept.tolist())) == 40
    assert np.bincount(LABELS[kept], minlength=4).tolist() == [10, 10, 10, 10]
    with pytest.raises(ValueError, match="fraction"):
        dirichlet_class(LABELS, 3, 1.0, np.random.default_rng(0), fraction=0.0)


def test_empty_clients_warn_and_batch_without_crash():
    x = torch.randn(200, 1, 2, 2)
    splits = DatasetSplits(train_x=x, train_y=torch.from_numpy(LABELS), test_x=x[:10],
                           test_y=torch.from_numpy(LABELS[:10]), num_classes=4,
                           input_shape=(1, 2, 2), name="toy", train_groups=None,
                           test_groups=None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fd = build_federated_dataset(splits, "dirichlet_class", 6, seed=0, alpha=0.001)
    sizes = fd.client_sizes()
    assert (sizes == 0).any()
    assert any("no training samples" in str(w.message) for w in caught)
    pos, mask = client_batches(sizes, None, 1, 8, torch.Generator().manual_seed(0))
    assert mask[sizes == 0].sum() == 0  # empty clients: every step masked
