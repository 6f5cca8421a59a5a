"""The robust-aggregation step of a round: poison the attackers' updates, then aggregate.

:class:`RobustRound` is what :func:`fedforge.engine.round.federated_round` calls (its
``robust=`` argument) after local training. It needs the per-client deltas, so the engine
must run with ``keep_deltas=True`` (the runner sets it when an aggregator or attack is
configured). Only the model delta is aggregated robustly; algorithm uploads (e.g. SCAFFOLD's
control variates) keep their plain mean.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import torch

from fedforge.engine.base import CohortOutput
from fedforge.robust.aggregators import Aggregator
from fedforge.robust.attacks import ATTACKER_TAG, Attack, poison_updates


def attack_generator(seed: int, round_: int) -> torch.Generator:
    """The attackers' noise for ``round_`` (independent of the round's sampling RNG)."""
    state = np.random.SeedSequence([seed, round_, ATTACKER_TAG]).generate_state(1)[0]
    return torch.Generator().manual_seed(int(state))


@dataclass
class RobustRound:
    """Attack (optional) + aggregator, applied to a cohort's stacked deltas."""

    aggregator: Aggregator
    attack: Attack
    attackers: torch.Tensor  # sorted attacker client ids (may be empty)
    seed: int = 0

    def __call__(
        self, cohort: CohortOutput, client_ids: torch.Tensor, agg_weights: torch.Tensor,
        round_: int,
    ) -> CohortOutput:
        if cohort.deltas is None:
            raise ValueError("server.aggregator: robust aggregation needs per-client deltas; "
                             "build the engine with keep_deltas=True")
        deltas = cohort.deltas
        is_attacker = torch.isin(client_ids.cpu(), self.attackers)  # [C]
        deltas = poison_updates(self.attack, deltas, is_attacker,
                                attack_generator(self.seed, round_))
        mean_delta, info = self.aggregator.aggregate(deltas, agg_weights)
        metrics = replace(cohort.metrics, robust=info,
                          attackers=is_attacker.float().to(agg_weights.device))
        return cohort._replace(mean_delta=mean_delta, deltas=deltas, metrics=metrics)
