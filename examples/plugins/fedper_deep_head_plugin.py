"""A personalised method built from existing parts: FedPer with a two-layer personal head.

Load it with ``fedforge run CONFIG --plugin fedper_deep_head_plugin`` (docs/extending.md)."""

from fedforge import register_algorithm
from fedforge.algorithms.personal import Personal, Phase, personalised
from fedforge.client.optimizers import local_optimizer


def fedper_deep_head(local_lr: float = 0.01):
    """FedPer whose personal head is the classifier's two layers."""
    opt = local_optimizer("sgd", local_lr)
    spec = Personal(kept="head", head=("classifier.*",), finetune=Phase(opt),
                    finetune_part="head")
    return personalised("fedper_deep_head", opt, spec, "FedPer, two-layer personal head")


register_algorithm("fedper_deep_head", fedper_deep_head)
