"""t-intervals, paired differences and the protocol's verdict, checked by hand."""

from __future__ import annotations

import math

import pytest

from fedforge.reproduce.stats import (
    CONTRADICTED,
    INCONCLUSIVE,
    REPRODUCED,
    called,
    detectable_effect,
    holm,
    p_value,
    verdict,
)
from fedforge.study.stats import Interval, paired_difference, t_interval, t_quantile


def test_t_quantiles_match_the_table():
    assert t_quantile(0.975, 2) == pytest.approx(4.302653, abs=1e-6)
    assert t_quantile(0.975, 4) == pytest.approx(2.776445, abs=1e-6)
    assert t_quantile(0.8, 2) == pytest.approx(1.060660, abs=1e-6)


def test_t_interval_by_hand():
    """[1, 2, 3]: mean 2, s = 1, half = t_{.975,2} / √3 = 4.302653 / 1.732051 = 2.484138."""
    ci = t_interval([1.0, 2.0, 3.0])
    assert (ci.mean, ci.sd, ci.n) == (2.0, 1.0, 3)
    assert ci.half == pytest.approx(2.484138, abs=1e-6)
    assert ci.format("{:.2f}") == "2.00 ± 2.48"


def test_t_interval_of_one_or_no_value():
    one = t_interval([5.0])
    assert one.mean == 5.0 and math.isnan(one.half) and one.format() == "5.0"
    assert t_interval([]).format() == "–"


def test_paired_difference_by_hand():
    """a - b = [2, 1, 4]: mean 7/3, s² = (1/9 + 16/9 + 25/9)/2 = 7/3, half = 4.302653 ·
    √(7/3) / √3 = 3.794583; the CI [-1.461, 6.128] contains 0."""
    diff = paired_difference([10.0, 12.0, 15.0], [8.0, 11.0, 11.0])
    assert diff.mean == pytest.approx(7 / 3)
    assert diff.sd == pytest.approx(math.sqrt(7 / 3))
    assert diff.half == pytest.approx(3.794583, abs=1e-6)
    assert verdict(diff, "<") == INCONCLUSIVE
    # paired vs unpaired: a constant shift with noisy levels is still detected
    shift = paired_difference([300.0, 500.0, 410.0], [310.0, 512.0, 419.0])
    assert shift.high < 0 and verdict(shift, "<") == REPRODUCED


def test_paired_difference_needs_equal_lengths():
    with pytest.raises(ValueError):
        paired_difference([1.0, 2.0], [1.0])


@pytest.mark.parametrize(("low", "high", "expect", "call"), [
    (-3.0, -1.0, "<", REPRODUCED),
    (-3.0, -1.0, ">", CONTRADICTED),
    (1.0, 3.0, ">", REPRODUCED),
    (1.0, 3.0, "<", CONTRADICTED),
    (-1.0, 3.0, "<", INCONCLUSIVE),
    (-1.0, 3.0, ">", INCONCLUSIVE),
])
def test_verdict_rule(low, high, expect, call):
    diff = Interval((low + high) / 2, (high - low) / 2, 3, 1.0)
    assert verdict(diff, expect) == call


@pytest.mark.parametrize(("low", "high", "call"), [
    (-0.01, 0.015, REPRODUCED),  # the whole interval below the margin: close
    (0.025, 0.04, CONTRADICTED),  # the whole interval above: not close
    (0.01, 0.03, INCONCLUSIVE),  # straddles the margin
])
def test_closeness_verdict_against_a_margin(low, high, call):
    diff = Interval((low + high) / 2, (high - low) / 2, 3, 1.0)
    assert verdict(diff, "<", margin=0.02) == call


def test_verdict_with_one_seed_is_inconclusive():
    assert verdict(t_interval([-5.0]), "<") == INCONCLUSIVE


def test_detectable_effect_by_hand():
    """(t_{.975,2} + t_{.8,2}) s / √n = (4.302653 + 1.060660) · 1.5 / √3 = 4.644765."""
    diff = Interval(0.0, 0.0, 3, 1.5)
    assert detectable_effect(diff) == pytest.approx(4.644765, abs=1e-6)
    assert math.isnan(detectable_effect(t_interval([1.0])))


def test_a_signed_format_signs_the_mean_only():
    assert Interval(0.08, 0.08, 3, 0.1).format("{:+.1%}") == "+8.0% ± 8.0%"
    assert Interval(-21.8, 20.9, 3, 8.4).format() == "-21.8 ± 20.9"


# ------------------------------------------------------------------ Holm's correction

def test_holm_by_hand():
    """p = [0.01, 0.04, 0.03, 0.005], m = 4, α = 0.05. Sorted: 0.005 ≤ 0.05/4 rejects,
    0.01 ≤ 0.05/3 rejects, 0.03 > 0.05/2 stops. Adjusted: 4·0.005 = 0.02, max(0.02,
    3·0.01) = 0.03, max(0.03, 2·0.03) = 0.06, max(0.06, 1·0.04) = 0.06. Bonferroni would
    give [0.04, 0.16, 0.12, 0.02]; unadjusted, all four reject."""
    adjusted = holm([0.01, 0.04, 0.03, 0.005])
    assert adjusted == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert [p <= 0.05 for p in adjusted] == [True, False, False, True]


def test_holm_rejects_more_than_bonferroni():
    """p = [0.01, 0.02, 0.03, 0.005]: every step passes (0.005 ≤ .0125, 0.01 ≤ .0167,
    0.02 ≤ .025, 0.03 ≤ .05), while Bonferroni (α/4 = 0.0125) rejects only two."""
    adjusted = holm([0.01, 0.02, 0.03, 0.005])
    assert adjusted == pytest.approx([0.03, 0.04, 0.04, 0.02])
    assert all(p <= 0.05 for p in adjusted)


def test_holm_of_one_p_is_that_p_and_caps_at_one():
    assert holm([0.03]) == [0.03]
    assert holm([0.6, 0.7]) == [1.0, 1.0]
    assert holm([]) == []


def test_p_value_matches_the_interval_rule():
    """[-1, -2, -3]: mean -2, s = 1, t = 2√3 = 3.4641 with 2 df -> two-sided p = 0.07418;
    the 95 % interval [-4.48, 0.48] contains 0 and p > 0.05: the same answer both ways."""
    diff = t_interval([-1.0, -2.0, -3.0])
    assert p_value(diff) == pytest.approx(0.074180, abs=1e-5)
    assert (p_value(diff) <= 0.05) == (diff.high < 0)
    shifted = paired_difference([300.0, 500.0, 410.0], [310.0, 512.0, 419.0])
    assert (p_value(shifted) <= 0.05) == (shifted.high < 0) is True
    assert p_value(shifted, margin=-10.3) > 0.5  # the margin is the null value
    assert p_value(t_interval([1.0])) == 1.0


def test_called_follows_the_corrected_p():
    diff = Interval(-2.0, 1.0, 3, 0.5)
    assert called(diff, "<", 0.01) == REPRODUCED
    assert called(diff, ">", 0.01) == CONTRADICTED
    assert called(diff, "<", 0.06) == INCONCLUSIVE
    assert called(diff, "<", 0.01, margin=-3.0) == CONTRADICTED
