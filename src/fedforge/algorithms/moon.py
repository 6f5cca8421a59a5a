"""MOON (Li, He & Song, "Model-Contrastive Federated Learning", CVPR 2021; official code
QinbinLi/MOON ``main.py``).

FedAvg whose local loss pulls the local model's representation of each sample towards the
global model's and away from the client's previous local model's. With ``z``, ``z_glob`` and
``z_prev`` the representations of one sample under the local model, the round's global model
x^t and the client's model at the end of the last round it trained (both frozen), a local step
descends the batch's masked mean of

    CE(logits, y) + μ · ℓ_con,   ℓ_con = −log( e^{cos(z, z_glob)/τ} /
                                      (e^{cos(z, z_glob)/τ} + e^{cos(z, z_prev)/τ}) ),

(the paper's Eq. 3 and 4; the code's cross-entropy over ``[cos(z, z_glob), cos(z, z_prev)] / τ``
with label 0). ``z`` is the input of the model's head (:mod:`.personal.representation`), and
the frozen models run with dropout off, as the code's ``eval()`` models. A client that has never
trained has no previous model: its ℓ_con is 0, as every client's in the code's first round
(its model pool starts empty). The server averages the models weighted by n_i / n.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch
import torch.nn.functional as F

from fedforge.algorithms.defaults import defaults_from
from fedforge.algorithms.personal.representation import features_and_logits, head_weight
from fedforge.client.optimizers import local_optimizer
from fedforge.client.transforms import RoundContext
from fedforge.core.schedules import ScheduleLike
from fedforge.core.tree import Params
from fedforge.protocol.algorithm import Algorithm, FinalizeInputs, Part
from fedforge.server.optimizers import server_sgd

NAME = "moon"


@contextmanager
def frozen(model: torch.nn.Module) -> Iterator[None]:
    """``model`` in eval mode (dropout off) for the frozen models' forward passes."""
    was = model.training
    model.train(False)
    try:
        yield
    finally:
        model.train(was)


def contrastive_loss(z: torch.Tensor, z_glob: torch.Tensor, z_prev: torch.Tensor,
                     temperature: float) -> torch.Tensor:
    """ℓ_con per sample ``[B]``: cross-entropy of ``[cos(z, z_glob), cos(z, z_prev)] / τ``
    with the global model's representation as the positive."""
    pos = F.cosine_similarity(z, z_glob, dim=-1)
    neg = F.cosine_similarity(z, z_prev, dim=-1)
    logits = torch.stack([pos, neg], dim=-1) / temperature
    return F.cross_entropy(logits, torch.zeros_like(pos, dtype=torch.long), reduction="none")


class ModelContrast(Part):
    """Keeps the client's last local model (``prev``, and ``trained`` = 1 once it exists) and
    is MOON's local objective (:class:`~fedforge.protocol.algorithm.LocalObjective`)."""

    name = NAME
    sends_uploads = False

    def __init__(self, mu: float, temperature: float, patterns: tuple[str, ...] | None) -> None:
        self.mu, self.temperature, self.patterns = mu, temperature, patterns
        self.model: torch.nn.Module | None = None

    def bind_model(self, model: torch.nn.Module) -> None:
        self.model = model

    def client_init(self, params: Params) -> dict:
        ref = next(iter(params.values()))
        return {"prev": {k: v.detach().clone() for k, v in params.items()},
                "trained": torch.zeros((), dtype=ref.dtype, device=ref.device)}

    def finalize(self, fin: FinalizeInputs) -> tuple[dict, dict]:
        trained = fin.ctx.client_state[NAME]["trained"]
        return {"prev": dict(fin.params), "trained": torch.ones_like(trained)}, {}

    def loss(self, params: Params, x: torch.Tensor, y: torch.Tensor, w: torch.Tensor,
             ctx: RoundContext) -> torch.Tensor:
        if self.model is None:
            raise ValueError("moon: call algorithm.bind_model(model) first (the runner does)")
        head = head_weight(params, self.patterns, NAME)
        z, logits = features_and_logits(self.model, head, params, x)
        mine = ctx.client_state[NAME]
        with frozen(self.model):
            z_glob = features_and_logits(self.model, head, ctx.global_params, x)[0]
            z_prev = features_and_logits(self.model, head, mine["prev"], x)[0]
        n = w.sum().clamp_min(1.0)
        ce = (F.cross_entropy(logits, y, reduction="none") * w).sum() / n
        con = (contrastive_loss(z, z_glob, z_prev, self.temperature) * w).sum() / n
        return ce + self.mu * mine["trained"].to(con.dtype) * con


@defaults_from("moon")
def moon(local_lr: ScheduleLike, local_momentum: float, weight_decay: ScheduleLike,
         mu: float, temperature: float, head: Sequence[str] | None) -> Algorithm:
    """MOON: FedAvg with the model-contrastive term on the head's input representation."""
    if mu < 0:
        raise ValueError(f"algorithm.mu: expected mu >= 0, got {mu}")
    if temperature <= 0:
        raise ValueError(f"algorithm.temperature: expected τ > 0, got {temperature}")
    if not 0 <= local_momentum < 1:
        raise ValueError(f"algorithm.local_momentum: expected 0 <= ρ < 1, got {local_momentum}")
    part = ModelContrast(float(mu), float(temperature), None if head is None else tuple(head))
    opt = local_optimizer("momentum", local_lr, momentum=local_momentum,
                          weight_decay=weight_decay)
    return Algorithm(NAME, opt, server_sgd(1.0), parts=(part,), objective=part,
                     aggregation="num_samples",
                     description="MOON (Li et al. 2021): local CE + μ·(−log softmax([cos(z, "
                                 "z_glob), cos(z, z_prev)]/τ)[0]), z the head's input, z_prev "
                                 "the client's last local model; FedAvg server")
