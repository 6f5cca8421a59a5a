"""Who the clients are: a speed factor per client (fixed across tasks) and availability.

FedAST (Askin et al., Sec. 5.1 and the authors' ``server.py``) shuffles the clients once and
makes the first 25% slow (x1.3), the next 50% normal (x1) and the last 25% fast (x0.7). The
class sizes here are exact: ``floor(p * N)`` per class, the remainder handed out one by one
in class order, so the proportions do not drift with the seed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

FEDAST_SPEED_CLASSES: tuple[tuple[float, float], ...] = ((0.25, 1.3), (0.5, 1.0), (0.25, 0.7))


def class_sizes(num_clients: int, fractions: Sequence[float]) -> np.ndarray:
    """Exact integer class sizes summing to ``num_clients`` (largest remainder, ties in order)."""
    fr = np.asarray(fractions, dtype=np.float64)
    if fr.ndim != 1 or len(fr) == 0 or (fr < 0).any() or not np.isclose(fr.sum(), 1.0):
        raise ValueError(f"system.speed_classes: fractions must be >= 0 and sum to 1, got "
                         f"{list(fractions)}")
    raw = fr * num_clients
    sizes = np.floor(raw).astype(np.int64)
    rest = num_clients - int(sizes.sum())
    order = np.argsort(-(raw - sizes), kind="stable")
    sizes[order[:rest]] += 1
    return sizes


def speed_factors(
    num_clients: int,
    classes: Sequence[tuple[float, float]] = FEDAST_SPEED_CLASSES,
    seed: int = 64,
) -> np.ndarray:
    """``[num_clients]`` float64 time multipliers, one class per client, shuffled by ``seed``."""
    if num_clients < 1:
        raise ValueError(f"system.num_clients: expected >= 1, got {num_clients}")
    fractions = [c[0] for c in classes]
    factors = [c[1] for c in classes]
    if any(f <= 0 for f in factors):
        raise ValueError(f"system.speed_classes: speed factors must be > 0, got {factors}")
    sizes = class_sizes(num_clients, fractions)
    per_class = np.repeat(np.asarray(factors, dtype=np.float64), sizes)
    order = np.random.default_rng(seed).permutation(num_clients)
    out = np.empty(num_clients, dtype=np.float64)
    out[order] = per_class  # client order[j] gets the j-th entry of the class-sorted list
    return out


@dataclass
class Population:
    """The client pool shared by every task of a run.

    Attributes:
      speed: ``[N]`` per-client time multiplier.
      available_fraction: the share of clients that can work at once. Async runs cap the
        number of *distinct busy* clients at ``max_busy`` (the authors' code, note A3); sync
        runs draw ``max_busy`` fresh clients per round.
    """

    speed: np.ndarray
    available_fraction: float = 1.0

    def __post_init__(self) -> None:
        if not 0 < self.available_fraction <= 1:
            raise ValueError(f"system.available_fraction: expected in (0, 1], got "
                             f"{self.available_fraction}")

    @classmethod
    def build(cls, num_clients: int, classes=FEDAST_SPEED_CLASSES, seed: int = 64,
              available_fraction: float = 1.0) -> Population:
        return cls(speed_factors(num_clients, classes, seed), available_fraction)

    @property
    def num_clients(self) -> int:
        return len(self.speed)

    @property
    def max_busy(self) -> int:
        return max(1, int(round(self.available_fraction * self.num_clients)))

    def sample_available(self, rng: np.random.Generator, count: int | None = None) -> np.ndarray:
        """``count`` (default ``max_busy``) distinct clients, uniformly, sorted."""
        n = self.max_busy if count is None else min(count, self.num_clients)
        return np.sort(rng.choice(self.num_clients, size=n, replace=False))
