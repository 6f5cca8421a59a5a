"""client_batches: epoch coverage, masks for unequal sizes, steps mode, and gathering."""

from __future__ import annotations

import math

import pytest
import torch

from fedforge.data import build_index_table, client_batches, gather_round_indices

SIZES = torch.tensor([5, 0, 3, 12, 1, 64, 8])


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


@pytest.mark.parametrize("batch_size", [1, 4, 8, 100])
def test_epochs_cover_each_sample_once_per_epoch(batch_size):
    epochs = 3
    pos, mask = client_batches(SIZES, None, epochs, batch_size, _gen())
    per_epoch = [math.ceil(n / batch_size) for n in SIZES.tolist()]
    assert pos.shape == mask.shape == (len(SIZES), epochs * max(per_epoch), batch_size)
    assert pos.dtype == torch.int64 and mask.dtype == torch.float32
    for i, n in enumerate(SIZES.tolist()):
        k = per_epoch[i]
        for e in range(epochs):
            p, m = pos[i, e * k : (e + 1) * k], mask[i, e * k : (e + 1) * k]
            assert torch.equal(p[m > 0].sort().values, torch.arange(n))
        assert mask[i, epochs * k :].sum() == 0  # steps beyond this client's count
        assert int(mask[i].sum()) == epochs * n


def test_epoch_masks_partial_last_batch():
    pos, mask = client_batches(torch.tensor([10, 4, 0]), None, 1, 4, _gen())
    assert mask.shape == (3, 3, 4)
    assert mask[0].tolist() == [[1] * 4, [1] * 4, [1, 1, 0, 0]]
    assert mask[1].tolist() == [[1] * 4, [0] * 4, [0] * 4]
    assert mask[2].sum() == 0 and pos[2].sum() == 0
    assert (pos[mask == 0] == 0).all()


def test_epochs_reshuffle():
    pos, _ = client_batches(torch.tensor([50]), None, 4, 50, _gen())
    assert len({tuple(pos[0, e].tolist()) for e in range(4)}) == 4


def test_steps_mode():
    steps, b = 6, 4
    pos, mask = client_batches(SIZES, steps, None, b, _gen())
    assert pos.shape == mask.shape == (len(SIZES), steps, b)
    for i, n in enumerate(SIZES.tolist()):
        if n == 0:
            assert mask[i].sum() == 0
            continue
        assert mask[i].sum() == steps * b
        flat = pos[i].reshape(-1)
        assert int(flat.max()) < n and int(flat.min()) >= 0
        full = (steps * b) // n  # every complete pass is a permutation
        for p in range(full):
            assert torch.equal(flat[p * n : (p + 1) * n].sort().values, torch.arange(n))


def test_determinism_and_errors():
    a = client_batches(SIZES, 5, None, 3, _gen(1))[0]
    assert torch.equal(a, client_batches(SIZES, 5, None, 3, _gen(1))[0])
    assert not torch.equal(a, client_batches(SIZES, 5, None, 3, _gen(2))[0])
    with pytest.raises(ValueError, match="exactly one"):
        client_batches(SIZES, 5, 1, 3, _gen())
    with pytest.raises(ValueError, match="exactly one"):
        client_batches(SIZES, None, None, 3, _gen())
    empty_pos, empty_mask = client_batches(torch.zeros(3, dtype=torch.int64), None, 2, 4, _gen())
    assert empty_pos.shape == (3, 0, 4) and empty_mask.numel() == 0


def test_gather_round_indices():
    client_indices = [
        torch.tensor([7, 3, 9]),
        torch.tensor([], dtype=torch.int64),
        torch.tensor([0, 1, 2, 4, 5]),
    ]
    table = build_index_table(client_indices)
    assert table.shape == (3, 5)
    clients = torch.tensor([2, 0, 1])
    sizes = torch.tensor([len(client_indices[c]) for c in clients.tolist()])
    pos, mask = client_batches(sizes, None, 2, 2, _gen())
    glob = gather_round_indices(table, clients, pos)
    assert torch.equal(glob, gather_round_indices(client_indices, clients, pos))
    for row, c in enumerate(clients.tolist()):
        chosen = glob[row][mask[row] > 0]
        assert set(chosen.tolist()) == set(client_indices[c].tolist())
