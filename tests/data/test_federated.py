"""FederatedDataset: construction from splits, index table, device moves, round gathering."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedforge.data import FederatedDataset, build_federated_dataset, load_dataset


@pytest.fixture(scope="module")
def synth():
    return load_dataset("synthetic", seed=0)


def test_iid_federated(synth):
    fd = build_federated_dataset(synth, "iid", 10, seed=0)
    assert isinstance(fd, FederatedDataset) and fd.num_clients == 10
    sizes = fd.client_sizes()
    assert sizes.dtype == torch.int64 and int(sizes.sum()) == synth.train_y.shape[0]
    assert fd.client_test_indices is None
    assert fd.index_table.shape == (10, int(sizes.max()))
    for k, ix in enumerate(fd.client_indices):
        assert ix.dtype == torch.int64
        assert torch.equal(fd.index_table[k, : len(ix)], ix)
    counts = fd.label_counts()
    assert counts.shape == (10, 10) and torch.equal(counts.sum(1), sizes)
    same = build_federated_dataset(synth, "iid", 10, seed=0)
    assert all(
        torch.equal(a, b) for a, b in zip(fd.client_indices, same.client_indices, strict=True)
    )


def test_natural_federated(synth):
    fd = build_federated_dataset(synth, "natural", None, seed=0)
    assert fd.num_clients == 30
    fd5 = build_federated_dataset(synth, "natural", 5, seed=0)
    assert fd5.num_clients == 5 and len(fd5.client_test_indices) == 5
    for k in range(5):
        assert set(synth.train_groups[fd5.client_indices[k].numpy()]) == {k}
        assert set(synth.test_groups[fd5.client_test_indices[k].numpy()]) == {k}
        assert torch.equal(fd5.client_indices[k], fd.client_indices[k])


def test_dirichlet_options_pass_through(synth):
    fd = build_federated_dataset(synth, "dirichlet", 8, seed=1, alpha=0.5, min_size=5)
    assert int(fd.client_sizes().min()) >= 5
    with pytest.raises(ValueError, match="num_clients"):
        build_federated_dataset(synth, "iid", None, seed=0)


def test_natural_needs_groups(synth):
    from dataclasses import replace

    no_groups = replace(synth, train_groups=None, test_groups=None)
    with pytest.raises(ValueError, match="no natural clients"):
        build_federated_dataset(no_groups, "natural", None, seed=0)


def test_to_and_round_batches(synth):
    fd = build_federated_dataset(synth, "natural", None, seed=0).to("cpu")
    assert fd.index_table.device.type == "cpu"
    clients = torch.tensor([4, 0, 17])
    idx, mask = fd.round_batches(clients, 16, torch.Generator().manual_seed(0), epochs=2)
    assert idx.shape[0] == 3 and idx.shape == mask.shape
    for row, c in enumerate(clients.tolist()):
        chosen = idx[row][mask[row] > 0].numpy()
        assert set(synth.train_groups[chosen]) == {c}
        assert len(chosen) == 2 * int(fd.client_sizes()[c])
        assert len(np.unique(chosen)) == int(fd.client_sizes()[c])
    idx, mask = fd.round_batches(clients, 16, torch.Generator().manual_seed(0), steps=3)
    assert idx.shape == (3, 3, 16) and bool((mask == 1).all())
