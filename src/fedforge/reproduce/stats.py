"""The reproduction protocol's verdict on paired differences across seeds.

The intervals are :mod:`fedforge.experiment.stats`'s. The verdict follows the reproduction
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

from fedforge.experiment.stats import Interval, t_quantile

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
