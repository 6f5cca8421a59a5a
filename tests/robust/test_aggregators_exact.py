"""The robust aggregators' edges, by hand: the names runs and logs go by, the plain weighted
mean over leaves of two dtypes, trimming and clipping at their boundaries, Krum with one or
two clients, and the option checks.

The hand-number tests beside this file check each rule on a typical cohort; these check
where a wrong variant of the same rule would still pass them.
"""

import pytest
import torch

from fedforge.robust.aggregators import (
    AGGREGATORS,
    build_aggregator,
    bulyan,
    bulyan_selection,
    krum,
    krum_scores,
    meamed,
    mean_around,
    multi_krum,
    norm_clip,
    trimmed_mean,
    weighted_mean,
)

F64, F32 = torch.float64, torch.float32


@pytest.mark.parametrize("name", sorted(AGGREGATORS))
def test_each_aggregator_goes_by_its_config_name(name):
    """The name is what a run logs and a resume checks against ``server.aggregator``."""
    assert build_aggregator(name).name == name


def _two_leaves() -> dict:
    return {"a": torch.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 8.0]], dtype=F64),
            "b": torch.tensor([2.0, -4.0, 6.0])}  # a float32 leaf beside a float64 one


def test_the_weighted_mean_weighs_each_leaf_in_its_own_dtype():
    out, info = weighted_mean().aggregate(_two_leaves(), torch.tensor([0.5, 0.25, 0.25]))
    assert info == {}
    assert torch.equal(out["a"], torch.tensor([2.5, 4.0], dtype=F64))
    assert out["b"].dtype == torch.float32 and out["b"].item() == 1.5


def test_the_trimmed_mean_cuts_floor_beta_n_on_each_side():
    """beta = 0.34 of 3 clients cuts one value each side: the median is left."""
    deltas = {"w": torch.tensor([[0.0], [1.0], [9.0]])}
    out, info = trimmed_mean(0.34).aggregate(deltas, torch.full((3,), 1 / 3))
    assert out["w"].item() == 1.0 and info["trimmed"].item() == 1.0
    out, info = trimmed_mean(0.33).aggregate(deltas, torch.full((3,), 1 / 3))
    assert out["w"].item() == pytest.approx(10 / 3) and info["trimmed"].item() == 0.0


def test_norm_clip_scales_only_updates_above_the_bound_over_every_leaf():
    """Norms 0.5 (below 1: kept as it is) and 2 (scaled by 1/2), over a float64 and a
    float32 leaf together."""
    deltas = {"a": torch.tensor([[0.3], [1.2]], dtype=F64), "b": torch.tensor([[0.4], [1.6]])}
    out, info = norm_clip(1.0).aggregate(deltas, torch.tensor([0.5, 0.5]))
    assert out["a"].item() == pytest.approx(0.5 * 0.3 + 0.5 * 0.6)
    assert out["b"].dtype == torch.float32 and out["b"].item() == pytest.approx(0.2 + 0.4)
    assert info["clipped"].item() == 0.5


def test_norm_clip_below_one_divides_by_the_norm_itself():
    """Norm 0.5 with bound 0.25: scale 1/2, whatever the guard against a zero norm."""
    out, _ = norm_clip(0.25).aggregate({"w": torch.tensor([[0.3, 0.4]])}, torch.ones(1))
    assert torch.allclose(out["w"], torch.tensor([0.15, 0.2]))


def test_krum_with_one_client_returns_it():
    out, info = krum().aggregate({"w": torch.tensor([[4.0, -1.0]])}, torch.ones(1))
    assert torch.equal(out["w"], torch.tensor([4.0, -1.0]))
    assert list(info) == ["selected"] and torch.equal(info["selected"], torch.zeros(1))


def test_krum_of_two_clients_averages_as_many_as_asked():
    deltas = {"w": torch.tensor([[0.0], [2.0]])}
    out, info = krum(f=0, m=2).aggregate(deltas, torch.full((2,), 0.5))
    assert out["w"].item() == 1.0 and torch.equal(info["selected"], torch.tensor([0.0, 1.0]))
    out, info = multi_krum(f=1).aggregate(deltas, torch.full((2,), 0.5))  # C - f = 1 picked
    assert info["selected"].numel() == 1


def test_multi_krum_keeps_the_m_it_is_given():
    deltas = {"w": torch.tensor([[0.0], [1.0], [2.0], [3.0], [40.0]])}
    _, info = multi_krum(f=1, m=2).aggregate(deltas, torch.full((5,), 0.2))
    assert info["selected"].numel() == 2


def test_krum_accepts_no_byzantine_clients_and_refuses_a_negative_f_in_one_line():
    krum(f=0)
    with pytest.raises(ValueError, match=r"^server.aggregator_options: expected f >= 0 and "
                       r"m >= 1, got f=-1, m=1$"):
        krum(f=-1, m=1)


@pytest.mark.parametrize("f", [True, 1.5, -1])
def test_f_must_be_a_non_negative_integer(f):
    with pytest.raises(ValueError, match=r"^server.aggregator_options.f: expected an integer"):
        meamed(f)


def test_mean_around_breaks_ties_towards_the_earlier_row():
    """Rows 1 and 5 are both 2 from the reference 3: the earlier one (1) is kept."""
    values = torch.tensor([[1.0], [3.0], [5.0]])
    assert mean_around(torch.tensor([3.0]), values, 2).item() == 2.0


# --- the defaults, selected indices and ties, on hand data -----------------------------------
# Six clients, one coordinate, the last an outlier: x = [0, 1, 2, 4, 7, 30].
#   f = 1 (k = n - f - 2 = 3 nearest): scores [21, 11, 9, 22, 70, ...] -> Krum picks row 2;
#   f = 2 (k = 2):                     scores [5, 2, 5, 13, 34, ...]   -> Krum picks row 1.
#   Multi-Krum f = 1, m = C - f = 5: rows 0..4, mean 14/5 (f = 2, m = 4: rows 0..3, 7/4);
#   m = 2: rows 1, 2, mean 3/2.
KRUM_X = torch.tensor([[0.0], [1], [2], [4], [7], [30]], dtype=F64)
SKEWED6 = torch.tensor([0.5, 0.1, 0.1, 0.1, 0.1, 0.1], dtype=F64)  # for rules that ignore them


def _agg(aggregator, rows, weights=None):
    w = torch.full((len(rows),), 1 / len(rows), dtype=rows.dtype) if weights is None else weights
    out, info = aggregator.aggregate({"w": rows}, w)
    return out["w"], info


def test_krum_scores_by_hand_for_two_f():
    assert krum_scores(KRUM_X, 1)[:5].tolist() == [21.0, 11.0, 9.0, 22.0, 70.0]
    assert krum_scores(KRUM_X, 2)[:5].tolist() == [5.0, 2.0, 5.0, 13.0, 34.0]


def test_krum_defaults_to_f_one_one_update_and_ignores_the_weights():
    got, info = _agg(krum(), KRUM_X, SKEWED6)
    assert torch.equal(got, torch.tensor([2.0], dtype=F64)) and info["selected"].tolist() == [2.0]
    got, info = _agg(krum(f=2), KRUM_X, SKEWED6)  # another f picks another client
    assert torch.equal(got, torch.tensor([1.0], dtype=F64)) and info["selected"].tolist() == [1.0]


def test_multi_krum_defaults_to_f_one_and_c_minus_f_averaged_uniformly():
    got, info = _agg(multi_krum(), KRUM_X, SKEWED6)
    torch.testing.assert_close(got, torch.tensor([14 / 5], dtype=F64), rtol=1e-15, atol=0)
    assert info["selected"].tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]
    got, info = _agg(multi_krum(f=2), KRUM_X)
    assert torch.equal(got, torch.tensor([7 / 4], dtype=F64))
    assert info["selected"].tolist() == [0.0, 1.0, 2.0, 3.0]


def test_multi_krum_with_m_two_averages_the_two_best_scored():
    got, info = _agg(multi_krum(f=1, m=2), KRUM_X)
    assert torch.equal(got, torch.tensor([1.5], dtype=F64))
    assert info["selected"].tolist() == [1.0, 2.0]


def test_bad_m_is_refused_in_one_line():
    with pytest.raises(ValueError, match=r"^server\.aggregator_options: expected f >= 0 and "
                                         r"m >= 1, got f=1, m=0$"):
        krum(m=0)


def test_bulyans_f_check_is_one_line_naming_the_field():
    with pytest.raises(ValueError, match=r"^server\.aggregator_options\.f: expected an integer "
                                         r">= 0, got True$"):
        bulyan(f=True)


def test_the_default_f_of_one_sets_the_smallest_cohort():
    assert meamed().min_clients == 3  # 2f + 1
    assert bulyan().min_clients == 7  # 4f + 3


@pytest.mark.parametrize("rows, beta, cut, expected", [
    ([-9.0, 0, 1, 2, 6, 10, 30], 0.3, 2, 3.0),  # floor(2.1) = 2: [1, 2, 6]; one cut: 19/5
    ([0.0, 1, 5, 12], 0.49, 1, 3.0),  # even C, beta just under 1/2: floor(1.96) = 1: [1, 5]
], ids=["C7_rounds_down", "C4_largest_beta"])
def test_the_trimmed_mean_cut_rounds_down(rows, beta, cut, expected):
    got, info = _agg(trimmed_mean(beta), torch.tensor(rows, dtype=F64)[:, None])
    assert torch.equal(got, torch.tensor([expected], dtype=F64))
    assert info["trimmed"] == cut


def test_norm_clip_default_bound_is_one():
    got, info = _agg(norm_clip(), torch.tensor([[3.0, 4.0]], dtype=F64))  # norm 5 -> 1
    torch.testing.assert_close(got, torch.tensor([0.6, 0.8], dtype=F64), rtol=1e-15, atol=0)
    assert info["clipped"] == 1.0


def test_norm_clip_leaves_a_norm_exactly_at_the_bound_and_a_zero_update_alone():
    """Norm 5 with bound 5: scale 1, not counted as clipped; a zero update adds zero (no NaN)."""
    rows = torch.tensor([[3.0, 4.0], [0.0, 0.0]], dtype=F64)
    got, info = _agg(norm_clip(max_norm=5.0), rows, torch.tensor([0.75, 0.25], dtype=F64))
    assert torch.equal(got, torch.tensor([2.25, 3.0], dtype=F64))
    assert info["clipped"] == 0.0


def test_norm_clip_weighs_by_the_weights_after_a_joint_clip_over_two_dtypes():
    """Client 0's norm over a float64 [2] leaf and a float32 [1, 1] leaf together is 5 (3 and
    4), so bound 2.5 halves it; client 1 (norm 1) is kept. Float32 weights 3/4, 1/4, as
    Flower's server passes them; each leaf keeps its dtype."""
    deltas = {"a": torch.tensor([[3.0, 0.0], [0.0, 1.0]], dtype=F64),
              "b": torch.tensor([[[4.0]], [[0.0]]], dtype=F32)}
    out, info = norm_clip(max_norm=2.5).aggregate(deltas, torch.tensor([0.75, 0.25], dtype=F32))
    assert torch.equal(out["a"], torch.tensor([1.125, 0.25], dtype=F64))  # 3/8 [3, 0] + [0, 1/4]
    assert torch.equal(out["b"], torch.tensor([[1.5]], dtype=F32))  # 3/8 * 4
    assert info["clipped"] == 0.5


def test_mean_around_ties_go_to_the_earlier_row_in_a_long_column():
    """Seventeen values all 1 from the reference, the first eight +1: the eight kept are rows
    0..7, mean 1. (PyTorch's CPU sort is stable up to 16 rows even when not asked to be, so
    only a longer column tells a stable sort from an unstable one.)"""
    values = torch.tensor([1.0] * 8 + [-1.0] * 9, dtype=F64)[:, None]
    assert torch.equal(mean_around(torch.zeros(1, dtype=F64), values, 8),
                       torch.ones(1, dtype=F64))


def test_meamed_with_f_at_its_largest_breaks_ties_by_row():
    """C = 17, f = 8 = (C - 1) / 2: the median is row 16's 0 and every other value lies 1 from
    it, so the nine kept are row 16 and rows 0..7 (+1): 8/9, whatever the weights."""
    rows = torch.tensor([1.0] * 8 + [-1.0] * 8 + [0.0], dtype=F64)[:, None]
    got, _ = _agg(meamed(f=8), rows, torch.tensor([0.001] * 16 + [0.984], dtype=F64))
    torch.testing.assert_close(got, torch.tensor([8 / 9], dtype=F64), rtol=1e-15, atol=0)


def test_bulyans_multi_krum_selection_breaks_score_ties_by_client_index():
    """Seventeen clients, f = 1: fourteen zeros (score 13 * 0 + 1 = 1) and ones at rows 0, 1, 8
    (score 2 * 0 + 12 * 1 = 12); theta = 15 takes the zeros and the lowest-index one, row 0."""
    rows = torch.zeros(17, 1, dtype=F64)
    rows[[0, 1, 8]] = 1.0
    assert krum_scores(rows, 1).tolist() == [12.0, 12.0] + [1.0] * 6 + [12.0] + [1.0] * 8
    picked = bulyan_selection(rows, 1, "multi_krum")
    assert sorted(picked.tolist()) == [0, 2, 3, 4, 5, 6, 7, *range(9, 17)]
    got, info = _agg(bulyan(f=1, selection="multi_krum"), rows)
    assert torch.equal(got, torch.zeros(1, dtype=F64))  # the 13 values nearest the median 0
    assert info["selected"].tolist() == [0.0, 2, 3, 4, 5, 6, 7, *range(9, 17)]
