"""The reproduction protocol's verdict on paired differences across seeds.

The intervals are :mod:`fedforge.study.stats`'s. The verdict follows the reproduction
protocol (docs/reproducing.md, section 4):
*reproduced* when the CI of the paired difference excludes 0 in the paper's direction,
*contradicted* when it excludes 0 in the other direction, *inconclusive* otherwise, with the
smallest effect the design could have detected (two-sided 5 % test, 80 % power, at the
observed spread).

A page judges several comparisons at once, so its verdicts control the family-wise error
rate with Holm's step-down correction (:func:`holm`): a comparison is called only when its
Holm-adjusted p-value (:func:`p_value`, the paired t-test of ``a − b = margin``) is at most
5 %. With one comparison this is the plain 95 % interval rule.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from scipy import stats as _st

from fedforge.study.stats import Interval, t_quantile

REPRODUCED, CONTRADICTED, INCONCLUSIVE = "reproduced", "contradicted", "inconclusive"


def detectable_effect(diff: Interval, level: float = 0.95, power: float = 0.8) -> float:
    """Smallest true difference a paired t-test of this size and spread detects with the
    given power: ``(t_{(1+level)/2} + t_{power}) s / √n`` with n − 1 degrees of freedom."""
    if diff.n < 2 or math.isnan(diff.sd):
        return math.nan
    df = diff.n - 1
    return (t_quantile((1 + level) / 2, df) + t_quantile(power, df)) * diff.sd / math.sqrt(diff.n)


def verdict(diff: Interval, expect: str, margin: float = 0.0) -> str:
    """The paper claims ``a - b < margin`` (``expect="<"``) or ``a - b > margin`` (``">"``);
    the whole confidence interval must lie on one side of ``margin`` for a call."""
    if diff.n < 2 or math.isnan(diff.half):
        return INCONCLUSIVE
    if diff.high < margin:
        return REPRODUCED if expect == "<" else CONTRADICTED
    if diff.low > margin:
        return REPRODUCED if expect == ">" else CONTRADICTED
    return INCONCLUSIVE


def p_value(diff: Interval, margin: float = 0.0) -> float:
    """Two-sided paired t-test of ``a − b = margin``: p ≤ α exactly when the ``1 − α``
    interval excludes ``margin``, so a corrected p keeps the interval rule's meaning."""
    if diff.n < 2 or math.isnan(diff.sd):
        return 1.0  # untestable: counts in the family, never rejected
    gap = abs(diff.mean - margin)
    if diff.sd == 0.0:
        return 0.0 if gap > 0.0 else 1.0
    t = gap / (diff.sd / math.sqrt(diff.n))
    return float(2.0 * _st.t.sf(t, diff.n - 1))


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values, in the input order: the k-th smallest p is
    multiplied by ``m − k + 1`` and made monotone, so rejecting where the adjusted p ≤ α
    keeps the chance of any false call among the m comparisons at most α."""
    m = len(pvalues)
    order = sorted(range(m), key=lambda i: pvalues[i])
    adjusted = [1.0] * m
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * float(pvalues[i])))
        adjusted[i] = running
    return adjusted


def called(diff: Interval, expect: str, p: float, margin: float = 0.0,
           alpha: float = 0.05) -> str:
    """The verdict from a (corrected) p-value: the side of ``margin`` the mean lies on
    decides reproduced or contradicted once ``p ≤ alpha``."""
    if diff.n < 2 or p > alpha:
        return INCONCLUSIVE
    below = diff.mean < margin
    return REPRODUCED if below == (expect == "<") else CONTRADICTED


# ------------------------------------------------------------------ issue 55: the protocol
EQUIVALENT, DIFFERS = "equivalent", "differs"  # "no effect that matters"; a non-claim's call
POWER = 0.8
MIN_PRIMARY_SEEDS = 5


def seeds_needed(sd: float, effect: float, tests: int, *, alpha: float = 0.05,
                 power: float = POWER, equivalence: bool = False,
                 minimum: int = 2) -> int | None:
    """The power rule: the smallest n ≥ ``minimum`` whose paired t-test detects ``effect``
    at Holm's strictest level α/``tests`` with the given power,
    ``(t_{1−α'/2, n−1} + t_{power, n−1}) · sd / √n ≤ effect`` (two one-sided tests,
    ``equivalence``: ``t_{1−α', n−1} + t_{(1+power)/2, n−1}``, at a true difference 0).
    None when the spread is unknown (fewer than two pilot seeds)."""
    if math.isnan(sd) or not effect > 0:
        return None
    level = alpha / max(1, tests)
    for n in range(max(2, minimum), 10_000):
        df = n - 1
        if equivalence:
            z = t_quantile(1 - level, df) + t_quantile((1 + power) / 2, df)
        else:
            z = t_quantile(1 - level / 2, df) + t_quantile(power, df)
        if z * sd / math.sqrt(n) <= effect:
            return n
    return None


def tost_p(diff: Interval, margin: float, centre: float = 0.0) -> float:
    """Two one-sided paired t-tests of ``|a − b − centre| < margin``: the larger of the
    p-values of ``d ≤ centre − margin`` and ``d ≥ centre + margin`` (1 when untestable)."""
    if diff.n < 2 or math.isnan(diff.sd) or not margin > 0:
        return 1.0
    if diff.sd == 0.0:
        return 0.0 if abs(diff.mean - centre) < margin else 1.0
    se = diff.sd / math.sqrt(diff.n)
    lower = float(_st.t.sf((diff.mean - (centre - margin)) / se, diff.n - 1))
    upper = float(_st.t.cdf((diff.mean - (centre + margin)) / se, diff.n - 1))
    return max(lower, upper)


def censored_signs(a: Sequence[float], a_reached: Sequence[bool], b: Sequence[float],
                   b_reached: Sequence[bool]) -> tuple[int, int, int]:
    """-> (pairs with a < b for certain, pairs with a > b for certain, the rest) of paired
    times to a target, where a run that never reached it is only known to exceed its budget.
    A censored run is later than an observed time at or below its budget; two censored runs,
    or a censored one against a later observed time, are undetermined (as are ties)."""
    less = greater = 0
    for x, xr, y, yr in zip(a, a_reached, b, b_reached, strict=True):
        if xr and yr:
            less, greater = less + (x < y), greater + (x > y)
        elif xr and not yr:
            less += x <= y
        elif yr and not xr:
            greater += y <= x
    return less, greater, len(a) - less - greater


def sign_test_p(less: int, greater: int, n: int) -> float:
    """Exact two-sided sign test on n pairs, the undetermined ones counted against both
    sides (conservative): ``2 · P(Binom(n, ½) ≥ max(less, greater))``, capped at 1. With n
    pairs it cannot go below ``2 / 2ⁿ`` (0.25 for 3 seeds)."""
    if n == 0:
        return 1.0
    k = max(less, greater)
    return min(1.0, 2.0 * float(_st.binom.sf(k - 1, n, 0.5)))


def sign_test_seeds(tests: int, alpha: float = 0.05, minimum: int = 2) -> int:
    """The fewest pairs with which the exact sign test can reach α/``tests`` at all (every
    pair on one side): the smallest n with ``2 / 2ⁿ ≤ α / tests``."""
    return max(minimum, math.ceil(math.log2(2 * max(1, tests) / alpha)))
