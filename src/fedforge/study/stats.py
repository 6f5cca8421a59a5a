"""Mean ± t-intervals over seeds, and paired differences: what every comparison of runs shows.

The interval is Student's t at ``n − 1`` degrees of freedom, so a handful of seeds gets the
wide interval it deserves. The reproduction protocol's verdicts build on these
(:mod:`fedforge.reproduce.stats`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from scipy import stats as _st


def t_quantile(p: float, df: int) -> float:
    """Student-t quantile (``scipy.stats.t.ppf``)."""
    return float(_st.t.ppf(p, df))


@dataclass(frozen=True)
class Interval:
    """``mean ± half`` over ``n`` values (``half`` is NaN when n < 2)."""

    mean: float
    half: float
    n: int
    sd: float

    @property
    def low(self) -> float:
        return self.mean - self.half

    @property
    def high(self) -> float:
        return self.mean + self.half

    def format(self, fmt: str = "{:.1f}") -> str:
        if self.n == 0:
            return "–"
        if self.n < 2 or math.isnan(self.half):
            return fmt.format(self.mean)
        return f"{fmt.format(self.mean)} ± {fmt.replace('+', '').format(self.half)}"


def t_interval(values: Sequence[float], level: float = 0.95) -> Interval:
    """Mean and the half-width of the two-sided t-interval ``t_{(1+level)/2, n-1} s / √n``."""
    vals = [float(v) for v in values]
    n = len(vals)
    if n == 0:
        return Interval(math.nan, math.nan, 0, math.nan)
    mean = sum(vals) / n
    if n < 2:
        return Interval(mean, math.nan, 1, math.nan)
    sd = math.sqrt(sum((v - mean) ** 2 for v in vals) / (n - 1))
    half = t_quantile((1 + level) / 2, n - 1) * sd / math.sqrt(n)
    return Interval(mean, half, n, sd)


def paired_difference(a: Sequence[float], b: Sequence[float], level: float = 0.95) -> Interval:
    """t-interval of ``a_k - b_k`` over the seeds k (same partition and cohort draws)."""
    if len(a) != len(b):
        raise ValueError(f"paired_difference: {len(a)} vs {len(b)} values")
    return t_interval([x - y for x, y in zip(a, b, strict=True)], level)
