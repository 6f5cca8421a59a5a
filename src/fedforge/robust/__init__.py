"""Reliability and security: robust aggregation, attack simulation, divergence handling."""

from fedforge.engine.screening import POLICIES, DivergenceError, screen_cohort
from fedforge.robust.aggregators import (
    AGGREGATORS,
    Aggregator,
    build_aggregator,
    bulyan,
    coordinate_median,
    krum,
    meamed,
    norm_clip,
    trimmed_mean,
    weighted_mean,
)
from fedforge.robust.attacks import ATTACKS, Attack, attacker_ids, flip_labels, poison_updates
from fedforge.robust.hook import RobustRound
from fedforge.robust.setup import build_robust

__all__ = [
    "AGGREGATORS", "ATTACKS", "POLICIES", "Aggregator", "Attack", "DivergenceError",
    "RobustRound", "attacker_ids", "build_aggregator", "build_robust", "bulyan",
    "coordinate_median", "flip_labels", "krum", "meamed", "norm_clip", "poison_updates",
    "screen_cohort", "trimmed_mean", "weighted_mean",
]
