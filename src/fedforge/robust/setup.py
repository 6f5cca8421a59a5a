"""Build a run's robust-aggregation step and poisoned data from its config."""

from __future__ import annotations

from fedforge.robust.aggregators import build_aggregator
from fedforge.robust.attacks import Attack, attacker_ids, flip_labels
from fedforge.robust.hook import RobustRound


def build_robust(cfg, data) -> RobustRound | None:
    """``RobustRound`` for ``cfg.server.aggregator`` / ``cfg.attack``; ``None`` when the run is
    honest with the plain mean. A ``label_flip`` attack rewrites ``data.train_y`` in place."""
    a = cfg.attack
    attack = Attack(a.kind, a.fraction, a.scale, a.noise_std)
    if cfg.server.aggregator == "mean" and not attack.active:
        return None
    fraction = attack.fraction if attack.active else 0.0
    attackers = attacker_ids(data.num_clients, fraction, cfg.seed)  # [num_attackers]
    if attack.kind == "label_flip" and attackers.numel():
        data.train_y = flip_labels(data.train_y, data.client_indices, attackers, data.num_classes)
    aggregator = build_aggregator(cfg.server.aggregator, **cfg.server.aggregator_options)
    if cfg.server.clients_per_round < aggregator.min_clients:  # Bulyan: 4f + 3, MeaMed: 2f + 1
        raise ValueError(f"server.clients_per_round: {aggregator.name} with these "
                         f"server.aggregator_options needs at least {aggregator.min_clients} "
                         f"clients per round, got {cfg.server.clients_per_round}")
    return RobustRound(aggregator, attack, attackers, cfg.seed)
