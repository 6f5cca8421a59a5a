"""``dirichlet_equal``: the FedDyn/FedExP/FedNAR split (equal sizes, per-client Dir prior)."""

import numpy as np
import pytest

from fedforge.data.partition import PARTITIONERS, partition

LABELS = np.repeat(np.arange(10), 500)  # 5000 samples, 500 per class


def _split(alpha, seed=0, **kw):
    return partition("dirichlet_equal", LABELS, 20, np.random.default_rng(seed), alpha=alpha, **kw)


def test_equal_sizes_disjoint_and_complete():
    parts = _split(0.3)
    assert "dirichlet_equal" in PARTITIONERS
    assert [len(p) for p in parts] == [250] * 20
    assert np.array_equal(np.sort(np.concatenate(parts)), np.arange(len(LABELS)))
    assert all(p.dtype == np.int64 and np.all(np.diff(p) > 0) for p in parts)


def test_deterministic_in_the_seed():
    a, b, c = _split(0.3, 5), _split(0.3, 5), _split(0.3, 6)
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    assert not all(np.array_equal(x, y) for x, y in zip(a, c, strict=True))


def test_alpha_controls_label_skew():
    def top_share(parts):
        return np.median([np.bincount(LABELS[p], minlength=10).max() / len(p) for p in parts])

    # Dir(0.1) priors put most mass on one or two classes; Dir(100) is close to uniform (0.1)
    assert top_share(_split(0.1)) > 0.4
    assert top_share(_split(100.0)) < 0.2


def test_samples_per_client_subset_and_errors():
    parts = _split(1.0, samples_per_client=40)
    assert [len(p) for p in parts] == [40] * 20
    assert len(np.unique(np.concatenate(parts))) == 800
    with pytest.raises(ValueError, match="samples_per_client=300 for 20 clients needs 6000"):
        _split(1.0, samples_per_client=300)
    with pytest.raises(ValueError, match="alpha must be > 0"):
        _split(0.0)
