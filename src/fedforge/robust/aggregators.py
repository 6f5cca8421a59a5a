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
  * Bulyan: El Mhamdi, Guerraoui & Rouault, "The Hidden Vulnerability of Distributed
    Learning in Byzantium", ICML 2018 (theta = n - 2f Krum picks, each removed from the
    candidates; per coordinate the mean of the beta = theta - 2f picks closest to their
    median; n >= 4f + 3). Flower's ``aggregate_bulyan`` does the same.
  * MeaMed: Xie, Koyejo & Gupta, "Generalized Byzantine-tolerant SGD", 2018 (mean around
    median: per coordinate the mean of the n - f values closest to the median).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import torch

from fedforge.core.tree import Params

AggregateFn = Callable[[Params, torch.Tensor], tuple[Params, dict]]


class Aggregator(NamedTuple):
    """``aggregate(deltas [C, ...], weights [C]) -> (delta, info)``; info holds 0-d/[C] tensors.
    ``min_clients``: the smallest cohort the rule's guarantee holds for (checked per round)."""

    name: str
    aggregate: AggregateFn
    min_clients: int = 1


def _flat(deltas: Params) -> torch.Tensor:
    """Stacked deltas as one ``[C, D]`` matrix (parameters concatenated in key order)."""
    return torch.cat([d.reshape(d.shape[0], -1) for d in deltas.values()], dim=1)  # [C, D]


def weighted_mean() -> Aggregator:
    """The plain FedAvg aggregate ``sum_i w_i Δ_i`` (the default; not robust)."""

    def aggregate(deltas: Params, weights: torch.Tensor) -> tuple[Params, dict]:
        return {k: torch.tensordot(weights.to(d.dtype), d, dims=1) for k, d in deltas.items()}, {}

    return Aggregator("mean", aggregate)


def _median(values: torch.Tensor) -> torch.Tensor:
    """Coordinate-wise median of ``values [m, ...]`` (mean of the two middles for even m)."""
    s = values.sort(dim=0).values
    n = s.shape[0]
    return s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])


def coordinate_median() -> Aggregator:
    """Coordinate-wise median (Yin et al. 2018); the mean of the two middle values when C is
    even (numpy's convention). Client weights are ignored: each client counts once."""

    def aggregate(deltas: Params, weights: torch.Tensor) -> tuple[Params, dict]:
        return {k: _median(d) for k, d in deltas.items()}, {}

    return Aggregator("median", aggregate)


def trimmed_mean(beta: float = 0.1) -> Aggregator:
    """Coordinate-wise beta-trimmed mean (Yin et al. 2018): per coordinate, drop the
    ``floor(beta C)`` largest and smallest values and average the rest (weights ignored)."""
    if not 0.0 <= beta < 0.5:
        raise ValueError(f"server.aggregator_options.beta: expected 0 <= beta < 0.5, got {beta}")

    def aggregate(deltas: Params, weights: torch.Tensor) -> tuple[Params, dict]:
        n = next(iter(deltas.values())).shape[0]
        cut = int(math.floor(beta * n))  # beta < 0.5 keeps n - 2 cut >= 1 values
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
    k = max(1, n - f - 2)  # f >= 0: never more than the n - 1 others
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


def _check_f(f: int) -> int:
    if isinstance(f, bool) or not isinstance(f, int) or f < 0:
        raise ValueError(f"server.aggregator_options.f: expected an integer >= 0, got {f!r}")
    return f


def check_cohort(name: str, needed: int, num_clients: int, f: int) -> None:
    """One line naming the rule, its bound and the fields to change when a cohort is too
    small for the assumed number ``f`` of Byzantine clients."""
    if num_clients < needed:
        raise ValueError(f"server.aggregator_options.f: {name} with f = {f} needs at least "
                         f"{needed} clients per round, got {num_clients} (lower f or raise "
                         f"server.clients_per_round)")


def mean_around(reference: torch.Tensor, values: torch.Tensor, k: int) -> torch.Tensor:
    """Per coordinate, the mean of the ``k`` rows of ``values [m, ...]`` closest to
    ``reference [...]`` (ties: the earlier row, a stable sort)."""
    order = (values - reference).abs().sort(dim=0, stable=True).indices[:k]  # [k, ...]
    return values.gather(0, order).mean(0)


def meamed(f: int = 1) -> Aggregator:
    """Mean around median (Xie et al. 2018): per coordinate, the mean of the ``C - f`` values
    closest to the coordinate-wise median (weights ignored); needs ``C >= 2f + 1``."""
    f = _check_f(f)

    def aggregate(deltas: Params, weights: torch.Tensor) -> tuple[Params, dict]:
        n = next(iter(deltas.values())).shape[0]
        check_cohort("meamed", 2 * f + 1, n, f)
        return {k: mean_around(_median(d), d, n - f) for k, d in deltas.items()}, {}

    return Aggregator("meamed", aggregate, min_clients=2 * f + 1)


SELECTIONS = ("krum", "multi_krum")


def bulyan_selection(flat: torch.Tensor, f: int, selection: str = "krum") -> torch.Tensor:
    """Bulyan's first phase on ``flat [C, D]``: ``theta = C - 2f`` updates. ``"krum"`` (the
    paper): ``theta`` times the Krum choice among the updates not yet chosen, scored over that
    remaining set, which it then leaves (ties: the lower client index). ``"multi_krum"``: the
    ``theta`` best scores of one Krum scoring of all ``C`` (Flower's Message-API ``Bulyan``)."""
    theta = flat.shape[0] - 2 * f
    if selection == "multi_krum":
        return krum_scores(flat, f).argsort(stable=True)[:theta]
    remaining, chosen = list(range(flat.shape[0])), []
    for _ in range(theta):
        best = remaining[int(krum_scores(flat[remaining], f).argmin())]
        chosen.append(best)
        remaining.remove(best)
    return torch.tensor(chosen, dtype=torch.long, device=flat.device)


def bulyan(f: int = 1, selection: str = "krum") -> Aggregator:
    """Bulyan over Krum (El Mhamdi et al. 2018, as Flower's ``aggregate_bulyan``): select
    ``theta = C - 2f`` updates (:func:`bulyan_selection`), then per coordinate average the
    ``beta = theta - 2f`` selected values closest to their median; needs ``C >= 4f + 3``."""
    f = _check_f(f)
    if selection not in SELECTIONS:
        raise ValueError(f"server.aggregator_options.selection: expected one of {SELECTIONS}, "
                         f"got {selection!r}")

    def aggregate(deltas: Params, weights: torch.Tensor) -> tuple[Params, dict]:
        flat = _flat(deltas)
        check_cohort("bulyan", 4 * f + 3, flat.shape[0], f)
        chosen = bulyan_selection(flat, f, selection)  # [theta]
        beta = chosen.numel() - 2 * f
        out = {k: mean_around(_median(d[chosen]), d[chosen], beta) for k, d in deltas.items()}
        return out, {"selected": chosen.sort().values.float()}

    return Aggregator("bulyan", aggregate, min_clients=4 * f + 3)


AGGREGATORS: dict[str, Callable[..., Aggregator]] = {
    "mean": weighted_mean,
    "median": coordinate_median,
    "trimmed_mean": trimmed_mean,
    "norm_clip": norm_clip,
    "krum": krum,
    "multi_krum": multi_krum,
    "bulyan": bulyan,
    "meamed": meamed,
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
