"""Population data: procedural clients, O(cohort) draws, index ranges, the evaluation sample."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

from fedforge.data import FederatedDataset, build_index_table
from fedforge.data.loaders import is_population, load_dataset, load_population
from fedforge.data.population import (
    SHARED_ID,
    ClientCache,
    SyntheticPopulation,
    counter_uniform,
    eval_sample,
    lognormal_sizes,
    make_population,
    sample_clients,
)
from fedforge.data.ranges import ClientRanges


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_client_k_is_a_function_of_seed_and_k_only():
    small = SyntheticPopulation(num_clients=10, seed=7, max_samples_per_client=80)
    big = SyntheticPopulation(num_clients=10_000, seed=7, max_samples_per_client=80)
    other = SyntheticPopulation(num_clients=10, seed=8, max_samples_per_client=80)
    for k in (0, 3, 9):
        x, y, n = small.client(k)
        x2, y2, n2 = big.client(k)
        assert n == n2 and np.array_equal(x, x2) and np.array_equal(y, y2)
        assert not np.array_equal(x, other.client(k)[0][: len(x)])
    # training samples alone are the first rows of the whole draw
    x, y, n = small.client(4)
    xt, yt, nt = small.client(4, train_only=True)
    assert nt == n and len(xt) == n and np.array_equal(xt, x[:n]) and np.array_equal(yt, y[:n])


def test_a_cohort_gets_the_same_data_whatever_the_cohort_or_order():
    data = make_population(num_clients=50, seed=3, max_samples_per_client=60, cache_mb=0)
    pos = torch.zeros(3, 2, 4, dtype=torch.int64)
    pos[:, 1, :] = torch.arange(4)

    def rows(clients: list[int]) -> dict[int, torch.Tensor]:
        idx = data.round_indices(torch.tensor(clients), pos)
        return {c: data.train_x[idx[i]] for i, c in enumerate(clients)}

    a, b = rows([1, 7, 30]), rows([30, 2, 7])
    assert torch.equal(a[7], b[7]) and torch.equal(a[30], b[30])
    x, _, _ = data.source.client(7, train_only=True)
    assert torch.equal(a[7][1], torch.from_numpy(x[:4]))  # positions 0..3 of client 7
    assert torch.equal(a[7][0], torch.from_numpy(x[[0, 0, 0, 0]]))


def test_sizes_follow_the_lognormal_quantiles_and_the_cap():
    ids = np.arange(20_000)
    sizes = lognormal_sizes(0, ids)
    u = counter_uniform(0, 0x5123_A17E, ids)
    assert 0 < u.min() and u.max() < 1 and abs(u.mean() - 0.5) < 0.01
    # median of floor(LogNormal(4, 2)) + 50 is floor(e^4) + 50 = 104
    assert abs(np.median(sizes) - 104) <= 3 and sizes.min() >= 50
    capped = lognormal_sizes(0, ids, max_samples=90)
    assert capped.max() == 90 and np.array_equal(np.minimum(sizes, 90), capped)
    assert np.array_equal(lognormal_sizes(0, ids[5:9]), sizes[5:9])  # per id, no state


def test_a_million_clients_hold_a_few_bytes_each():
    data = make_population(num_clients=1_000_000)
    assert data.nbytes() <= 4 * 1_000_000  # the int32 training sizes; nothing per sample
    assert data.train_x.numel() == 0 and len(data._cache) == 0  # noqa: SLF001
    sizes = data.client_sizes()
    assert sizes.shape == (1_000_000,) and int(sizes.min()) >= 40  # round(0.8 * 50)
    assert data.nbytes() <= 12 * 1_000_000  # plus the int64 copy the runner reads
    cohort = sample_clients(data.trainable, 1000, _gen(0))
    data.round_indices(cohort, torch.zeros(1000, 1, 1, dtype=torch.int64))
    assert data.train_x.shape[0] == int(sizes[cohort].sum())  # only the cohort's samples


@pytest.mark.parametrize(("population", "k"), [(10, 10), (1_000_000, 1000), (7, 3), (5, 0)])
def test_floyd_draws_distinct_sorted_ids_deterministically(population, k):
    a = sample_clients(population, k, _gen(11))
    assert len(a) == k == len(set(a.tolist()))
    assert torch.equal(a, a.sort().values) and (k == 0 or 0 <= int(a.min()) <= int(a.max())
                                               < population)
    assert torch.equal(a, sample_clients(population, k, _gen(11)))


def test_floyd_is_uniform_over_subsets():
    counts: dict[tuple[int, ...], int] = {}
    g = _gen(0)
    for _ in range(6000):
        key = tuple(sample_clients(4, 2, g).tolist())
        counts[key] = counts.get(key, 0) + 1
    assert len(counts) == 6 and all(900 < c < 1100 for c in counts.values())
    with pytest.raises(ValueError, match="cannot draw 5 distinct clients of 4"):
        sample_clients(4, 5, g)


def test_held_out_clients_are_never_drawn_and_the_eval_sample_is_fixed():
    data = make_population(num_clients=100).for_eval(10, 30, seed=5)
    assert data.trainable == 70
    train, held = eval_sample(100, 10, 30, 5)
    assert torch.equal(data.eval_clients, train) and torch.equal(data.held_out_eval, held)
    assert int(train.max()) < 70 and int(held.min()) >= 70 and len(held) == 10
    assert not torch.equal(train, eval_sample(100, 10, 30, 6)[0])
    x, y, owner = data.test_data_of(train)
    assert torch.equal(data.test_x, x) and torch.equal(data.test_y, y)
    assert set(owner.tolist()) == set(train.tolist())
    parts = data.client_test_indices
    assert len(parts) == 10 and sum(len(p) for p in parts) == len(y)
    assert data.held_out_data()[2].min() >= 70
    with pytest.raises(ValueError, match="eval.held_out"):
        make_population(num_clients=10).for_eval(None, 10, 0)


def test_the_run_draws_cohorts_from_the_training_ids_only():
    from types import SimpleNamespace as NS  # noqa: PLC0415

    from fedforge.algorithms import build_algorithm  # noqa: PLC0415
    from fedforge.experiment.build import round_generator, sample_round  # noqa: PLC0415

    class Exp:  # what sample_round reads of a Setup
        def __init__(self, data):
            self.cfg = NS(seed=0, server=NS(clients_per_round=20, aggregation=None),
                          client=NS(local_steps=2, local_epochs=None, batch_size=4),
                          eval=NS(held_out=15))
            self.data, self.device = data, torch.device("cpu")
            self.algorithm = build_algorithm("fedavg", local_lr=0.1)
            self.client_sizes = data.client_sizes()

    data = make_population(num_clients=40, max_samples_per_client=60).for_eval(5, 15, 0)
    exp = Exp(data)
    seen: set[int] = set()
    for t in (1, 2, 3, 1):
        draw = sample_round(exp, t)
        ids, idx = draw.client_ids, draw.sample_idx
        assert len(ids) == 20 and int(ids.max()) < 25
        assert torch.equal(ids, sample_clients(25, 20, round_generator(exp.cfg.seed, t)))
        assert int(idx.max()) < len(data.train_y)  # ids into the cohort's samples
        seen |= set(ids.tolist())
    assert seen <= set(range(25))


def test_ranges_gather_what_the_padded_table_gathers():
    parts = [np.array([4, 2]), np.array([], dtype=np.int64), np.array([0, 5, 1, 3])]
    ranges = ClientRanges.from_lists(parts)
    table = build_index_table([torch.from_numpy(p) for p in parts])
    assert torch.equal(ranges.table(), table)
    assert ranges.offsets.tolist() == [0, 2, 2, 6] and ranges.order.tolist() == [4, 2, 0, 5, 1, 3]
    clients = torch.tensor([2, 1, 0])
    pos = torch.tensor([[3, 0], [0, 0], [1, 0]])
    assert ranges.gather(clients, pos).tolist() == [[3, 0], [0, 0], [2, 4]]
    assert torch.equal(ranges.gather(clients, pos), table[clients[:, None], pos])
    assert [p.tolist() for p in ranges] == [[4, 2], [], [0, 5, 1, 3]]
    assert ranges[-1].tolist() == [0, 5, 1, 3] and len(ranges) == 3
    owners = ClientRanges.from_owners(np.array([2, 0, 2, 2, 0]), 3)
    assert owners.offsets.tolist() == [0, 2, 2, 5] and owners.order.tolist() == [1, 4, 0, 2, 3]


def test_label_counts_from_ranges():
    y = torch.tensor([0, 1, 1, 2, 0, 2])
    data = FederatedDataset(torch.zeros(6, 1), y, torch.zeros(1, 1), y[:1],
                            [torch.tensor([0, 1, 2]), torch.tensor([], dtype=torch.int64),
                             torch.tensor([5, 3, 4])], None, 3, (1,), "toy")
    assert data.label_counts().tolist() == [[1, 2, 0], [0, 0, 0], [1, 0, 2]]
    assert data.client_sizes().tolist() == [3, 0, 3]
    assert torch.equal(data.index_table, build_index_table(data.client_indices))


def test_the_cache_keeps_the_most_recent_clients_within_its_bytes():
    made: list[int] = []

    def make(k: int):
        made.append(k)
        return np.zeros((10, 1), np.float32), np.zeros(10, np.int64), 5  # 120 bytes

    cache = ClientCache(250)
    for k in (1, 2, 1, 3, 1, 2):
        cache.get(k, make)
    assert made == [1, 2, 3, 2] and len(cache) == 2 and cache.nbytes == 240


def test_the_registry_routes_population_datasets():
    assert is_population("synthetic_population") and not is_population("synthetic")
    with pytest.raises(ValueError, match="load_population"):
        load_dataset("synthetic_population")
    data = load_population("synthetic_population", {"num_clients": 9}, num_clients=4)
    assert data.num_clients == 4 and data.name == "synthetic_population"
    with pytest.raises(ValueError, match=r"data.options: .* does not take \['bogus'\]"):
        load_population("synthetic_population", {"bogus": 1})


def test_the_shared_iid_model_is_keyed_without_a_lossy_cast():
    """iid=True keys the shared model by 2^64 - 1, which a plain list cast through float
    (a RuntimeWarning, and a key that depends on the platform)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        g = SyntheticPopulation(iid=True, seed=3)._generator(SHARED_ID)
    want = np.random.Philox(key=np.array([3, SHARED_ID], dtype=np.uint64)).random_raw(1)
    assert g.bit_generator.random_raw(1) == want
