"""FedBN (Li, Jiang, Zhang, Kamp & Dou, "FedBN: Federated Learning on Non-IID Features via
Local Batch Normalization", ICLR 2021).

The normalisation layers' affine parameters are the client's own (kept in the client store,
never sent); every other parameter is averaged as in FedAvg. fedforge's models keep no
running statistics (GroupNorm and LayerNorm, no BatchNorm buffers), so the local part is the
scale and shift of each normalisation layer. Which parameters those are is given by
``norm`` patterns (as ``[model] head``'s); a config without them takes the zoo model's
normalisation layers (:data:`NORM_LAYERS`), and a model without any trains as FedAvg.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from fedforge.algorithms.defaults import defaults_from
from fedforge.algorithms.personal.base import Personal, PersonalAlgorithm, PersonalPart, Phase
from fedforge.algorithms.personal.split import head_names
from fedforge.client.optimizers import local_optimizer
from fedforge.core.schedules import ScheduleLike
from fedforge.core.tree import Params
from fedforge.server.optimizers import server_sgd

NORM_LAYERS: dict[str, tuple[str, ...]] = {
    "resnet18_gn": (r"re:(.*\.)?gn\d\..*", r"re:.*\.shortcut\.1\..*"),
    "convnet": ("features.1.*", "features.5.*", "features.9.*"),
    "transformer_tiny": (r"re:.*\.ln(\d|_f)\..*",),
    "transformer_lm": (r"re:.*\.ln(\d|_f)\..*",),
}
"""Each zoo model's GroupNorm/LayerNorm parameters as ``named_parameters`` patterns (a
model not listed has none); a test holds them to the models' modules."""


def norm_patterns(model: str) -> tuple[str, ...] | None:
    """The normalisation layers of zoo model ``model`` (``None``: it has none)."""
    return NORM_LAYERS.get(model)


@dataclass(frozen=True)
class FedBNSpec(Personal):
    """Keeps the parameters matching ``norm`` (none without patterns)."""

    norm: tuple[str, ...] | None = None

    def kept_names(self, params: Params) -> frozenset[str]:
        if not self.norm:
            return frozenset()
        return frozenset(head_names(list(params), self.norm, "algorithm.norm"))


@defaults_from("fedbn")
def fedbn(local_lr: ScheduleLike, client_optimizer: str, weight_decay: ScheduleLike,
          max_grad_norm: ScheduleLike | None, nar: bool, norm: Sequence[str] | None
          ) -> PersonalAlgorithm:
    """FedBN: FedAvg whose normalisation-layer parameters stay with each client."""
    opt = local_optimizer(client_optimizer, local_lr, weight_decay=weight_decay,
                          max_grad_norm=max_grad_norm, nar=nar)
    spec = FedBNSpec(norm=None if norm is None else tuple(norm), finetune=Phase(opt))
    return PersonalAlgorithm("fedbn", opt, server_sgd(1.0), parts=(PersonalPart(spec),),
                             description="FedBN (Li et al. 2021): normalisation layers stay "
                                         "local, the rest is averaged",
                             aggregation="num_samples", personal=spec)
