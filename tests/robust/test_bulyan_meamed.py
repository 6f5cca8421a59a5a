"""Bulyan and MeaMed against hand numbers, wrong variants, NumPy and Flower.

Hand data: seven clients, two coordinates, the last an outlier; f = 1, so Bulyan needs
n >= 4f + 3 = 7, picks theta = n - 2f = 5 and averages beta = theta - 2f = 3 per coordinate::

    d = [[5, 2], [0, -3], [-2, -6], [-6, -6], [-4, 4], [2, 5], [39, 34]]

Krum with removal: each pick scores the remaining updates by their n' - f - 2 smallest
squared distances (n' = updates left; at least one neighbour); ties go to the lower index.

    left 0..6         scores [266, 173, 246, 350, 291, 260, 10029]  -> pick 1
    left 0,2,3,4,5,6  scores [216, 233, 305, 226, 192, 7139]        -> pick 5
    left 0,2,3,4,6    scores [198, 120, 120, 189, 4929]             -> pick 2 (tie with 3)
    left 0,3,4,6      scores [85, 104, 85, 2180]                    -> pick 0 (tie with 4)
    left 3,4,6        scores [104, 104, 2749]                       -> pick 3 (tie with 4)

Selected rows {0, 1, 2, 3, 5}: first coordinates [5, 0, -2, -6, 2], median 0, the three
closest 0, -2, 2 -> mean 0; second coordinates [2, -3, -6, -6, 5], median -3, the three
closest -3, -6, -6 -> mean -5. Bulyan = [0, -5].

Wrong variants give other numbers: the five best scores of the first scoring (Multi-Krum, no
removal: rows {0, 1, 2, 4, 5}) -> [0, 11/3]; beta = theta - f = 4 -> [5/4, -13/4]; a
1-trimmed mean of the selection -> [0, -7/3]; the plain mean of the selection -> [-1/5, -8/5].

MeaMed, f = 1, over all seven: medians [0, 2]; the six closest per coordinate drop 39 and 34:
[(5 + 0 - 2 - 6 - 4 + 2) / 6, (2 - 3 - 6 - 6 + 4 + 5) / 6] = [-5/6, -2/3]; the median is
[0, 2] and the 1/7-trimmed mean [1/5, 2/5], so the three rules differ here.
"""

import numpy as np
import pytest
import torch

from fedforge.robust import build_aggregator
from fedforge.robust.aggregators import bulyan, bulyan_selection, meamed

HAND = torch.tensor([[5.0, 2], [0, -3], [-2, -6], [-6, -6], [-4, 4], [2, 5], [39, 34]],
                    dtype=torch.float64)
UNIFORM7 = torch.full((7,), 1 / 7, dtype=torch.float64)


# --- an independent float64 NumPy reference, with the wrong variants as switches ------------
def _np_scores(x, f):
    n = len(x)
    d = ((x[:, None, :] - x[None, :, :]) ** 2).sum(-1)
    k = max(1, n - f - 2)
    return np.array([np.sort(np.delete(d[i], i))[:k].sum() if n > 1 else 0.0
                     for i in range(n)])


def _np_around_median(v, k):
    med = np.median(v, axis=0)
    order = np.argsort(np.abs(v - med), axis=0, kind="stable")[:k]
    return np.take_along_axis(v, order, axis=0).mean(0)


def np_bulyan(x, f, *, removal=True, beta_minus=None, second="around"):
    """Bulyan on ``x [n, d]``; ``removal=False``, ``beta_minus``, ``second`` make it wrong."""
    n = len(x)
    theta = n - 2 * f
    if removal:
        left, chosen = list(range(n)), []
        for _ in range(theta):
            best = left[int(np.argmin(_np_scores(x[left], f)))]
            chosen.append(best)
            left.remove(best)
    else:
        chosen = list(np.argsort(_np_scores(x, f), kind="stable")[:theta])
    sel = x[chosen]
    if second == "trimmed":
        return np.sort(sel, axis=0)[f:theta - f].mean(0)
    if second == "mean":
        return sel.mean(0)
    return _np_around_median(sel, theta - (2 * f if beta_minus is None else beta_minus))


def _agg(aggregator, rows):
    out, info = aggregator.aggregate({"w": rows}, torch.full((rows.shape[0],), 1 / len(rows),
                                                             dtype=rows.dtype))
    return out["w"], info


def test_bulyan_hand_numbers_and_selection():
    got, info = _agg(bulyan(f=1), HAND)
    torch.testing.assert_close(got, torch.tensor([0.0, -5.0], dtype=torch.float64))
    assert info["selected"].tolist() == [0.0, 1.0, 2.0, 3.0, 5.0]
    assert bulyan_selection(HAND, 1).tolist() == [1, 5, 2, 0, 3]  # the order of the picks
    np.testing.assert_allclose(np_bulyan(HAND.numpy(), 1), [0.0, -5.0])


@pytest.mark.parametrize("wrong, expected", [
    ({"removal": False}, [0.0, 11 / 3]),
    ({"beta_minus": 1}, [5 / 4, -13 / 4]),
    ({"second": "trimmed"}, [0.0, -7 / 3]),
    ({"second": "mean"}, [-1 / 5, -8 / 5]),
], ids=["no_removal", "beta_theta_minus_f", "trimmed_mean", "plain_mean"])
def test_wrong_bulyan_variants_miss_the_hand_numbers(wrong, expected):
    """Each wrong variant lands on its own hand number, away from Bulyan's [0, -5]."""
    wrong_value = np_bulyan(HAND.numpy(), 1, **wrong)
    np.testing.assert_allclose(wrong_value, expected)
    assert np.abs(wrong_value - [0.0, -5.0]).max() > 0.5


def test_bulyan_multi_krum_selection_is_the_no_removal_variant():
    """``selection="multi_krum"`` (Flower's Message-API Bulyan) picks rows {0, 1, 2, 4, 5}."""
    got, info = _agg(bulyan(f=1, selection="multi_krum"), HAND)
    torch.testing.assert_close(got, torch.tensor([0.0, 11 / 3], dtype=torch.float64))
    assert info["selected"].tolist() == [0.0, 1.0, 2.0, 4.0, 5.0]


def test_meamed_hand_numbers_differ_from_median_and_trimmed_mean():
    got, _ = _agg(meamed(f=1), HAND)
    torch.testing.assert_close(got, torch.tensor([-5 / 6, -2 / 3], dtype=torch.float64))
    med, _ = _agg(build_aggregator("median"), HAND)
    trim, _ = _agg(build_aggregator("trimmed_mean", beta=1 / 7), HAND)
    torch.testing.assert_close(med, torch.tensor([0.0, 2.0], dtype=torch.float64))
    torch.testing.assert_close(trim, torch.tensor([0.2, 0.4], dtype=torch.float64))
    # a wrong variant, the n - 2f = 5 closest: (0 - 2 + 2 - 4 + 5) / 5, (2 + 4 + 5 - 3 - 6) / 5
    np.testing.assert_allclose(_np_around_median(HAND.numpy(), 5), [0.2, 0.4])


@pytest.mark.parametrize("n, f", [(7, 1), (9, 1), (11, 2), (12, 2), (15, 3)])
def test_against_the_numpy_reference(n, f):
    rng = np.random.default_rng(n + f)
    x = rng.normal(size=(n, 3, 2))
    deltas = {"a": torch.from_numpy(x[:, :2].copy()), "b": torch.from_numpy(x[:, 2].copy())}
    w = torch.full((n,), 1 / n, dtype=torch.float64)
    flat = x.reshape(n, -1)
    for agg, ref in ((bulyan(f), np_bulyan(flat, f)),
                     (meamed(f), _np_around_median(flat, n - f))):
        out, _ = agg.aggregate(deltas, w)
        got = torch.cat([out["a"].reshape(-1), out["b"].reshape(-1)]).numpy()
        # the flat layout is [a(2x2) b(2)] per client, as in x[:, :2] then x[:, 2]
        ref = np.concatenate([ref.reshape(3, 2)[:2].reshape(-1), ref.reshape(3, 2)[2]])
        np.testing.assert_allclose(got, ref, rtol=1e-12, atol=1e-12)


def test_agrees_with_flowers_aggregate_bulyan():
    """Flower's ``aggregate_bulyan`` with Krum as the first rule (``to_keep = 0``, the only
    value its Bulyan accepts: a Multi-Krum average is not one of the updates) equals ours;
    on deltas or on models alike, since every step commutes with a shift."""
    aggregate = pytest.importorskip(
        "flwr.server.strategy.aggregate", reason="Flower is in the test extra "
        "(`pip install 'fedforge[flower]'`)")
    for n, f in ((7, 1), (10, 1), (11, 2)):
        rng = np.random.default_rng(100 + n)
        layers = [rng.normal(size=(n, 3, 4)), rng.normal(size=(n, 5))]
        layers[0][0] += 8.0  # an outlier
        results = [([layer[i] for layer in layers], 10) for i in range(n)]
        flower = aggregate.aggregate_bulyan(results, f, aggregate.aggregate_krum, to_keep=0)
        ours, _ = bulyan(f).aggregate({"l0": torch.from_numpy(layers[0]),
                                       "l1": torch.from_numpy(layers[1])},
                                      torch.full((n,), 1 / n, dtype=torch.float64))
        np.testing.assert_allclose(ours["l0"].numpy(), flower[0], rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(ours["l1"].numpy(), flower[1], rtol=1e-12, atol=1e-12)


def test_too_small_a_cohort_is_one_line_naming_f():
    with pytest.raises(ValueError, match=r"server.aggregator_options.f: bulyan with f = 1 "
                                         r"needs at least 7 clients per round, got 6"):
        _agg(bulyan(f=1), HAND[:6])
    with pytest.raises(ValueError, match=r"meamed with f = 3 needs at least 7 .* got 6"):
        _agg(meamed(f=3), HAND[:6])
    with pytest.raises(ValueError, match="server.aggregator_options.f: expected an integer"):
        build_aggregator("bulyan", f=-1)
    with pytest.raises(ValueError, match="server.aggregator_options.selection"):
        build_aggregator("bulyan", selection="median")
    assert bulyan(f=2).min_clients == 11 and meamed(f=2).min_clients == 5


def test_f_zero_is_the_mean():
    """f = 0: Bulyan keeps every update and all of them per coordinate; MeaMed likewise."""
    rows = HAND[:5]
    for agg in (bulyan(f=0), meamed(f=0)):
        got, _ = _agg(agg, rows)
        torch.testing.assert_close(got, rows.mean(0))


# --- several attacked rounds on quadratic clients ---------------------------------------------
# Client i pulls w toward b_i = [0, 1, 3, 4, 6, 9, 8][i] (loss |w - b_i|^2 / 2); one local step of
# lr 0.5 sends Δ_i = 0.5 (x - b_i). Client 6 flips its sign and scales it by 4: 2 (8 - x).
# Bulyan, f = 1: the selection is the honest rows {0, 1, 2, 3, 4} (b = 0, 1, 3, 4, 6) in every
# round (the honest deltas only shift with x), whose three values closest to their median are
# b = 1, 3, 4: aggregate 0.5 (x - 8/3), so x <- x / 2 + 4/3: 0 -> 4/3 -> 2 -> 7/3.
# MeaMed, f = 1: the attacker is the one value farthest from the median, the six honest ones
# average 0.5 (x - 23/6): x <- x / 2 + 23/12: 0 -> 23/12 -> 23/8 -> 161/48.
ATTACK_ROWS = [[1.0, float(b), 0.0] for b in (0, 1, 3, 4, 6, 9, 8)]


@pytest.mark.parametrize("engine", ["loop", "vmap"])
@pytest.mark.parametrize("name, trajectory", [
    ("bulyan", [4 / 3, 2.0, 7 / 3]), ("meamed", [23 / 12, 23 / 8, 161 / 48]),
])
def test_sign_flip_attack_over_three_rounds_hand_numbers(engine, name, trajectory):
    import tests.quadratic as q
    from fedforge.algorithms import build_algorithm
    from fedforge.robust import Attack, RobustRound

    robust = RobustRound(build_aggregator(name, f=1), Attack("sign_flip", 1 / 7, 4.0),
                         torch.tensor([6]))
    eng = q.ENGINES[engine]()
    eng.keep_deltas = True
    *_, history = q.run_rounds(build_algorithm("fedavg", local_lr=0.5), ATTACK_ROWS, [0.0, 0.0],
                               rounds=3, engine=eng, robust=robust)
    got = [float(params["w"][0]) for params, *_ in history]
    np.testing.assert_allclose(got, trajectory, rtol=1e-12)
    assert all(float(params["w"][1]) == 0.0 for params, *_ in history)
    # the float64 NumPy reference agrees, and the plain mean is dragged elsewhere
    x, mean_x = 0.0, 0.0
    b = np.array([0.0, 1, 3, 4, 6, 9, 8])
    for want in trajectory:
        sent = 0.5 * (x - b)
        sent[6] *= -4.0
        rule = np_bulyan(sent[:, None], 1) if name == "bulyan" else _np_around_median(
            sent[:, None], 6)
        x -= float(rule[0])
        mean_x -= float(np.mean(0.5 * (mean_x - b) * np.where(np.arange(7) == 6, -4.0, 1.0)))
        assert x == pytest.approx(want, rel=1e-12)
    assert abs(mean_x - x) > 1.0
