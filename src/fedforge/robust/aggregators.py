"""Byzantine-robust aggregation of stacked client updates.

Every aggregator maps the cohort's stacked deltas ``{name: [C, ...]}`` and their weights
``[C]`` (summing to 1) to one delta ``{name: [...]}`` that replaces the weighted mean before
the algorithm's server optimizer runs, so any algorithm can use any aggregator. Parameters
are treated as one flat vector per client (norms and distances span every parameter).

References:
  * Median / trimmed mean: Yin et al., "Byzantine-Robust Distributed Learning: Towards
    Optimal Statistical Rates", ICML 2018 (coordinate-wise median, beta-trimmed mean).
  * Krum / Multi-Krum: Blanchard et al., "Machine Learning with Adversaries: Byzantine
    Tolerant Gradient Descent", NeurIPS 2017 (score = sum of the n - f - 2 smallest squared
    distances to the other updates; Multi-Krum averages the m best-scored updates).
  * Norm clipping: Sun et al., "Can You Really Backdoor Federated Learning?", 2019.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import torch

from fedforge.core.tree import Params

AggregateFn = Callable[[Params, torch.Tensor], tuple[Params, dict]]


class Aggregator(NamedTuple):
    """``aggregate(deltas [C, ...], weights [C]) -> (delta, info)``; info holds 0-d/[C] tensors."""

    name: str
    aggregate: AggregateFn


def _flat(deltas: Params) -> torch.Tensor:
    """Stacked deltas as one ``[C, D]`` matrix (parameters concatenated in key order)."""
    return torch.cat([d.reshape(d.shape[0], -1) for d in deltas.values()], dim=1)  # [C, D]


def weighted_mean() -> Aggregator:
    """The plain FedAvg aggregate ``sum_i w_i Δ_i`` (the default; not robust)."""

    def aggregate(deltas: Params, weights: torch.Tensor) -> tuple[Params, dict]:
        return {k: torch.tensordot(weights.to(d.dtype), d, dims=1) for k, d in deltas.items()}, {}

    return Aggregator("mean", aggregate)


def coordinate_median() -> Aggregator:
    """Coordinate-wise median (Yin et al. 2018); the mean of the two middle values when C is
    even (numpy's convention). Client weights are ignored: each client counts once."""

    def aggregate(deltas: Params, weights: torch.Tensor) -> tuple[Params, dict]:
        out = {}
        for k, d in deltas.items():
            s = d.sort(dim=0).values  # [C, ...]
            n = s.shape[0]
            out[k] = s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])
        return out, {}

    return Aggregator("median", aggregate)


def trimmed_mean(beta: float = 0.1) -> Aggregator:
    """Coordinate-wise beta-trimmed mean (Yin et al. 2018): per coordinate, drop the
    ``floor(beta C)`` largest and smallest values and average the rest (weights ignored)."""
    if not 0.0 <= beta < 0.5:
        raise ValueError(f"server.aggregator_options.beta: expected 0 <= beta < 0.5, got {beta}")

    def aggregate(deltas: Params, weights: torch.Tensor) -> tuple[Params, dict]:
        n = next(iter(deltas.values())).shape[0]
        cut = min(int(math.floor(beta * n)), (n - 1) // 2)  # keep at least one value
        out = {k: d.sort(dim=0).values[cut : n - cut].mean(0) for k, d in deltas.items()}
        return out, {"trimmed": torch.tensor(float(cut))}

    return Aggregator("trimmed_mean", aggregate)


def norm_clip(max_norm: float = 1.0) -> Aggregator:
    """Clip each client's whole update to L2 norm ``max_norm``, then take the weighted mean:
    ``sum_i w_i Δ_i min(1, max_norm / ||Δ_i||)``."""
    if not max_norm > 0:
        raise ValueError(f"server.aggregator_options.max_norm: expected > 0, got {max_norm}")

    def aggregate(deltas: Params, weights: torch.Tensor) -> tuple[Params, dict]:
        norms = _flat(deltas).norm(dim=1)  # [C]
        scale = (max_norm / norms.clamp_min(1e-12)).clamp(max=1.0)  # [C]
        coef = weights.to(scale.dtype) * scale
        out = {k: torch.tensordot(coef.to(d.dtype), d, dims=1) for k, d in deltas.items()}
        return out, {"clipped": (scale < 1.0).float().mean()}

    return Aggregator("norm_clip", aggregate)


def krum_scores(flat: torch.Tensor, f: int) -> torch.Tensor:
    """Krum score of each row of ``flat [C, D]``: the sum of its ``C - f - 2`` smallest
    squared distances to the other rows (at least one neighbour)."""
    n = flat.shape[0]
    dist = torch.cdist(flat.double(), flat.double()).pow(2)  # [C, C]
    dist.fill_diagonal_(float("inf"))
    k = max(1, min(n - f - 2, n - 1))
    return dist.sort(dim=1).values[:, :k].sum(1)  # [C]


def krum(f: int = 1, m: int | None = 1) -> Aggregator:
    """Multi-Krum (Blanchard et al. 2017): average, uniformly, the ``m`` updates with the
    lowest Krum score, assuming at most ``f`` Byzantine clients; ``m = 1`` is Krum and
    ``m = None`` selects ``C - f`` updates (the paper's Multi-Krum choice)."""
    if f < 0 or (m is not None and m < 1):
        raise ValueError(f"server.aggregator_options: expected f >= 0 and m >= 1, got f={f}, m={m}")

    def aggregate(deltas: Params, weights: torch.Tensor) -> tuple[Params, dict]:
        flat = _flat(deltas)
        n = flat.shape[0]
        if n == 1:
            return {k: d[0] for k, d in deltas.items()}, {"selected": torch.zeros(1)}
        scores = krum_scores(flat, f)
        keep = max(1, n - f) if m is None else min(m, n)
        chosen = scores.argsort()[:keep].sort().values  # [m]
        out = {k: d[chosen].mean(0) for k, d in deltas.items()}
        return out, {"selected": chosen.float()}

    return Aggregator("krum", aggregate)


def multi_krum(f: int = 1, m: int | None = None) -> Aggregator:
    """Multi-Krum with the paper's default ``m = C - f`` selected updates."""
    return krum(f, m)._replace(name="multi_krum")


AGGREGATORS: dict[str, Callable[..., Aggregator]] = {
    "mean": weighted_mean,
    "median": coordinate_median,
    "trimmed_mean": trimmed_mean,
    "norm_clip": norm_clip,
    "krum": krum,
    "multi_krum": multi_krum,
}


def build_aggregator(name: str, **options) -> Aggregator:
    """Aggregator by config name; errors name ``server.aggregator`` / its options."""
    if name not in AGGREGATORS:
        raise ValueError(f"server.aggregator: unknown aggregator {name!r}; expected one of "
                         f"{sorted(AGGREGATORS)}")
    try:
        return AGGREGATORS[name](**options)
    except TypeError as exc:
        raise ValueError(f"server.aggregator_options: {exc}") from None
