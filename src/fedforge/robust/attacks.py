"""Simulated Byzantine clients: a fixed fraction of the population misbehaves.

The attackers are a fixed set of client ids drawn once from the run's seed (``round(fraction
* num_clients)`` of them), as in the Byzantine-robust FL literature. When sampled they

* ``sign_flip``: send ``-scale * Δ_i`` instead of their honest update ``Δ_i``;
* ``scale``: send ``scale * Δ_i`` (a boosted update);
* ``random``: send Gaussian noise ``N(0, noise_std^2)`` of the update's shape;
* ``label_flip``: train honestly on poisoned data, every label ``y`` replaced by
  ``K - 1 - y`` (applied once to the training set, see :func:`flip_labels`).

The model-poisoning kinds rewrite the stacked deltas after local training and before the
aggregator; the noise is drawn from a generator seeded by ``(seed, round)``, so an attacked
run is as deterministic (and resumable) as an honest one.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from fedforge.core.tree import Params

ATTACKS = ("none", "sign_flip", "scale", "random", "label_flip")
MODEL_ATTACKS = ("sign_flip", "scale", "random")
ATTACKER_TAG = 0xA77AC  # separates the attacker draw from every round's sampling RNG


@dataclass(frozen=True)
class Attack:
    """What the attackers do. ``scale`` multiplies sign-flipped/scaled updates."""

    kind: str = "none"
    fraction: float = 0.0
    scale: float = 1.0
    noise_std: float = 1.0

    def __post_init__(self) -> None:
        if self.kind not in ATTACKS:
            raise ValueError(f"attack.kind: unknown attack {self.kind!r}; expected one of "
                             f"{list(ATTACKS)}")
        if not 0.0 <= self.fraction < 1.0:
            raise ValueError(f"attack.fraction: expected 0 <= fraction < 1, got {self.fraction}")
        if self.noise_std < 0:
            raise ValueError(f"attack.noise_std: expected >= 0, got {self.noise_std}")

    @property
    def active(self) -> bool:
        return self.kind != "none" and self.fraction > 0


def attacker_ids(num_clients: int, fraction: float, seed: int) -> torch.Tensor:
    """The fixed, sorted attacker ids: ``round(fraction * num_clients)`` drawn by ``seed``."""
    count = int(round(fraction * num_clients))
    # a 3-word entropy: can never equal the round RNG's SeedSequence([seed, round])
    state = np.random.SeedSequence([seed, 0, ATTACKER_TAG]).generate_state(1)[0]
    gen = torch.Generator().manual_seed(int(state))
    return torch.randperm(num_clients, generator=gen)[:count].sort().values


def poison_updates(
    attack: Attack, deltas: Params, is_attacker: torch.Tensor, generator: torch.Generator
) -> Params:
    """Replace the rows of ``deltas`` ``[C, ...]`` where ``is_attacker [C]`` by the attack."""
    if attack.kind not in MODEL_ATTACKS or not bool(is_attacker.any()):
        return deltas
    out = {}
    for name, d in deltas.items():
        mask = is_attacker.to(d.device).reshape(-1, *([1] * (d.dim() - 1)))  # [C, 1, ...]
        if attack.kind == "sign_flip":
            bad = -attack.scale * d
        elif attack.kind == "scale":
            bad = attack.scale * d
        else:  # random: drawn on the CPU generator for determinism, then moved
            noise = torch.randn(d.shape, generator=generator, dtype=torch.float32)
            bad = attack.noise_std * noise.to(d.device, d.dtype)
        out[name] = torch.where(mask, bad, d)
    return out


def flip_labels(train_y: torch.Tensor, client_indices: list[torch.Tensor], attackers: torch.Tensor,
                num_classes: int) -> torch.Tensor:
    """A copy of ``train_y`` where every sample of an attacker has label ``K - 1 - y``."""
    y = train_y.clone()
    for cid in attackers.tolist():
        idx = client_indices[cid].to(y.device)
        y[idx] = num_classes - 1 - y[idx]
    return y
