"""Dataset distillation by trajectory matching (MTT), used by FedPTR / FedPTR-S."""

from fedforge.distill.augment import flip_shift
from fedforge.distill.mtt import MTTResult, match_trajectory, matching_loss, student_descent
from fedforge.distill.synthetic import init_synthetic, synthetic_labels

__all__ = [
    "MTTResult",
    "flip_shift",
    "init_synthetic",
    "match_trajectory",
    "matching_loss",
    "student_descent",
    "synthetic_labels",
]
