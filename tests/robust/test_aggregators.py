"""Robust aggregators against hand numbers and a NumPy reference.

Hand data (two coordinates, five clients, the last one an outlier)::

    d = [[1, 10], [2, 20], [4, 40], [8, 30], [100, -100]]
    median        = [4, 20]              (sorted columns [1,2,4,8,100], [-100,10,20,30,40])
    trimmed (1/5) = [(2+4+8)/3, (10+20+30)/3] = [14/3, 20]
    Krum, f = 1: each row's two smallest squared distances
        r0: 101 + 449 = 550, r1: 101 + 136 = 237, r2: 116 + 404 = 520,
        r3: 116 + 136 = 252, r4: 21901 + 24004 = 45905
    -> Krum picks r1 = [2, 20]; Multi-Krum m=3 averages r1, r3, r2 = [14/3, 30];
       m = C - f = 4 adds r0: [15/4, 25].
"""

import numpy as np
import pytest
import torch

from fedforge.robust import build_aggregator, coordinate_median, krum, norm_clip, trimmed_mean
from fedforge.robust.aggregators import krum_scores

HAND = torch.tensor([[1.0, 10], [2, 20], [4, 40], [8, 30], [100, -100]])
UNIFORM5 = torch.full((5,), 0.2)


def _agg(aggregator, rows, weights=None):
    deltas = {"w": rows}
    w = weights if weights is not None else torch.full((rows.shape[0],), 1.0 / rows.shape[0])
    out, info = aggregator.aggregate(deltas, w)
    return out["w"], info


def test_median_hand_numbers_odd_and_even():
    got, _ = _agg(coordinate_median(), HAND)
    assert torch.equal(got, torch.tensor([4.0, 20.0]))
    got, _ = _agg(coordinate_median(), HAND[:4])  # even: mean of the two middle values
    assert torch.equal(got, torch.tensor([3.0, 25.0]))


def test_trimmed_mean_hand_numbers():
    got, info = _agg(trimmed_mean(beta=0.2), HAND)
    torch.testing.assert_close(got, torch.tensor([14 / 3, 20.0]))
    assert info["trimmed"] == 1
    got, _ = _agg(trimmed_mean(beta=0.0), HAND)  # no trimming = plain mean
    torch.testing.assert_close(got, HAND.mean(0))


def test_krum_scores_and_selection_hand_numbers():
    scores = krum_scores(HAND, f=1)
    assert scores.tolist() == [550.0, 237.0, 520.0, 252.0, 45905.0]
    got, info = _agg(krum(f=1), HAND)
    assert torch.equal(got, torch.tensor([2.0, 20.0]))
    assert info["selected"].tolist() == [1.0]
    got, _ = _agg(krum(f=1, m=3), HAND)
    torch.testing.assert_close(got, torch.tensor([14 / 3, 30.0]))
    got, _ = _agg(build_aggregator("multi_krum", f=1), HAND)
    torch.testing.assert_close(got, torch.tensor([15 / 4, 25.0]))


def test_norm_clip_hand_numbers_and_bound():
    rows = torch.tensor([[3.0, 4.0], [0.0, 10.0]])  # norms 5 and 10
    got, info = _agg(norm_clip(max_norm=5.0), rows, torch.tensor([0.5, 0.5]))
    torch.testing.assert_close(got, torch.tensor([1.5, 4.5]))
    assert info["clipped"] == 0.5
    big = torch.randn(7, 3) * 100
    out, _ = _agg(norm_clip(max_norm=2.0), big)
    assert out.norm() <= 2.0 + 1e-5  # a convex combination of vectors of norm <= 2


def test_norm_spans_all_parameters():
    deltas = {"a": torch.tensor([[3.0]]), "b": torch.tensor([[4.0]])}  # joint norm 5
    out, _ = norm_clip(max_norm=1.0).aggregate(deltas, torch.ones(1))
    torch.testing.assert_close(out["a"], torch.tensor([0.6]))
    torch.testing.assert_close(out["b"], torch.tensor([0.8]))


def _np_krum(x, f, m):
    n = len(x)
    d = ((x[:, None, :] - x[None, :, :]) ** 2).sum(-1)
    scores = [np.sort(np.delete(d[i], i))[: n - f - 2].sum() for i in range(n)]
    return x[np.argsort(scores)[:m]].mean(0)


@pytest.mark.parametrize("n", [5, 6, 9])
def test_against_numpy_reference(n):
    rng = np.random.default_rng(n)
    x = rng.normal(size=(n, 4, 3)).astype(np.float64)
    deltas = {"w": torch.from_numpy(x)}
    w = torch.full((n,), 1.0 / n, dtype=torch.float64)
    med, _ = coordinate_median().aggregate(deltas, w)
    np.testing.assert_allclose(med["w"].numpy(), np.median(x, axis=0), rtol=1e-12)
    tm, _ = trimmed_mean(beta=0.25).aggregate(deltas, w)
    k = int(np.floor(0.25 * n))
    np.testing.assert_allclose(tm["w"].numpy(), np.sort(x, axis=0)[k : n - k].mean(0), rtol=1e-12)
    kr, _ = krum(f=1, m=2).aggregate(deltas, w)
    ref = _np_krum(x.reshape(n, -1), 1, 2).reshape(4, 3)
    np.testing.assert_allclose(kr["w"].numpy(), ref, rtol=1e-12)


def test_bad_options_name_the_field():
    with pytest.raises(ValueError, match="server.aggregator: unknown"):
        build_aggregator("mediam")
    with pytest.raises(ValueError, match="server.aggregator_options"):
        build_aggregator("krum", q=1)
    with pytest.raises(ValueError, match="beta"):
        build_aggregator("trimmed_mean", beta=0.5)
    with pytest.raises(ValueError, match="max_norm"):
        build_aggregator("norm_clip", max_norm=0)
