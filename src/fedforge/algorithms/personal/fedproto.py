"""FedProto (Tan et al., "FedProto: Federated Prototype Learning across Heterogeneous
Clients", AAAI 2022; official code yuetan031/FedProto).

No model travels: every client keeps its whole model, and clients and server exchange class
prototypes, the mean representation ``r = f(x)`` of each class at the head's input. A client's
local step descends

    CE(h(f(x)), y) + λ · mean_b m_b ‖f(x_b) − C̄_{y_b}‖² / d

(the official code's ``nn.MSELoss`` over the batch: ``m_b`` = 1 where the server has a
prototype of ``y_b``, d the representation's width) and adds each sample's ``f(x)``, taken
before the step, to its class's sum. The server's prototype of class j is the mean of the
cohort's class-j representations, ``Σ_i sum_ij / Σ_i n_ij`` (``weights = "samples"``: each
client's prototype weighted by its count, the paper's Eq. 6), or the plain mean over the
clients that hold class j (``"clients"``: the official code's ``proto_aggregation``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import ClassVar

import torch
import torch.nn.functional as F

from fedforge.algorithms.defaults import defaults_from
from fedforge.algorithms.personal.base import Personal, PersonalAlgorithm, PersonalPart, Phase
from fedforge.algorithms.personal.representation import features_and_logits, head_weight
from fedforge.algorithms.personal.stateful import stepping
from fedforge.client.optimizers import local_optimizer
from fedforge.client.transforms import local_step
from fedforge.core.schedules import ScheduleLike
from fedforge.core.tree import Params, tree_nbytes
from fedforge.protocol.algorithm import Algorithm, FinalizeInputs, Part
from fedforge.protocol.step_batch import step_batch
from fedforge.server.optimizers import server_sgd

NAME = "fedproto"
WEIGHTS = ("samples", "clients")


class Prototypes(Part):
    """The server's prototypes ``[K, d]`` and which classes have one; each client uploads its
    class sums and counts (or, ``"clients"``, its class means and 0/1 holdings)."""

    name = NAME

    def __init__(self, patterns: tuple[str, ...] | None, weights: str) -> None:
        self.patterns, self.weights, self.model = patterns, weights, None

    def bind_model(self, model: torch.nn.Module) -> None:
        self.model = model

    def server_init(self, params: Params) -> dict:
        w = params[head_weight(params, self.patterns)]  # [K, d]
        return {"protos": torch.zeros_like(w), "present": torch.zeros_like(w[:, 0])}

    def broadcast(self, server_state: dict) -> dict:
        return server_state

    def finalize(self, fin: FinalizeInputs) -> tuple[dict, dict]:
        sums, counts = fin.opt_state["sums"], fin.opt_state["counts"]  # [K, d], [K]
        if self.weights == "clients":
            held = (counts > 0).to(sums.dtype)
            sums, counts = sums / counts.clamp_min(1.0).unsqueeze(1) * held.unsqueeze(1), held
        return {}, {"sums": sums, "counts": counts}

    def server_update(self, server_state: dict, mean_uploads: dict, agg) -> dict:
        """A class some client of the cohort holds gets the mean; the others keep theirs."""
        sums, counts = mean_uploads["sums"], mean_uploads["counts"]
        seen = counts > 0
        mean = sums / counts.clamp_min(torch.finfo(counts.dtype).tiny).unsqueeze(1)
        return {"protos": torch.where(seen.unsqueeze(1), mean, server_state["protos"]),
                "present": torch.maximum(server_state["present"], seen.to(counts.dtype))}

    def upload_nbytes(self, params: Params, server_state: dict) -> int:
        return tree_nbytes(server_state)  # sums [K, d] + counts [K], the prototypes' shapes


def _local_step(part: Prototypes, lam: float, opt):
    """FedProto's local optimizer: the gradient of CE + λ·(prototype distance) at the step's
    batch, then ``opt``'s step; the class sums and counts of ``f(x)`` accumulate."""

    def loss(params, x, y, w, protos, present, head):
        r, logits = features_and_logits(part.model, head, params, x)
        n = w.sum().clamp_min(1.0)
        ce = (F.cross_entropy(logits, y, reduction="none") * w).sum() / n
        near = ((r - protos[y]) ** 2).mean(-1) * present[y] * w  # [B]
        return ce + lam * near.sum() / n, r.detach()

    grad = torch.func.grad(loss, has_aux=True)

    def init(params, ctx):
        protos = ctx.broadcast[NAME]["protos"]
        return {"base": opt.init(params, ctx), "sums": torch.zeros_like(protos),
                "counts": torch.zeros_like(protos[:, 0])}

    def step(grads, state, params, ctx):
        del grads  # the loss is FedProto's, not the loop's cross-entropy
        if part.model is None:
            raise ValueError("fedproto: call algorithm.bind_model(model) first (the runner does)")
        batch, server = step_batch(ctx, NAME), ctx.broadcast[NAME]
        head = head_weight(params, part.patterns)
        with batch.around():
            g, r = grad(params, batch.x, batch.labels, batch.weights, server["protos"],
                        server["present"], head)
        classes = torch.arange(server["protos"].shape[0], device=r.device)
        hits = (batch.labels.unsqueeze(1) == classes).to(r.dtype) \
            * batch.weights.to(r.dtype).unsqueeze(1)  # [B, K]
        new, base = local_step(opt, g, state["base"], params, ctx)
        return new, {"base": base, "sums": state["sums"] + hits.T @ r,
                     "counts": state["counts"] + hits.sum(0)}

    return stepping(NAME, init, step)


@dataclass(frozen=True)
class ProtoSpec(Personal):
    """The whole model is the client's own; its local step reads the step's batch. Bound to
    the server's prototypes (:meth:`evaluated_at`), it also scores the paper's inference."""

    step_batch: ClassVar[bool] = True
    protos: torch.Tensor | None = field(default=None, compare=False, repr=False)  # [K, d]
    present: torch.Tensor | None = field(default=None, compare=False, repr=False)  # [K]

    def evaluated_at(self, parts: dict) -> ProtoSpec:
        server = parts[NAME]
        return replace(self, protos=server["protos"], present=server["present"])

    @torch.no_grad()
    def accuracies(self, model: torch.nn.Module, models: Params, x: torch.Tensor,
                   y: torch.Tensor, indices: list[torch.Tensor]) -> dict[str, torch.Tensor]:
        """``prototype_accuracy``: the paper's inference, the class of the global prototype
        nearest to ``f(x)`` (a class without one is never predicted); none while the server
        has no prototype."""
        if self.protos is None or not bool(self.present.any()):
            return {}
        acc = torch.zeros(len(indices), dtype=torch.float64)
        training = model.training
        model.eval()
        try:
            for c, idx in enumerate(indices):
                if len(idx):
                    mine = {k: v[c] for k, v in models.items()}
                    f = features_and_logits(model, head_weight(mine, self.head), mine, x[idx])[0]
                    acc[c] = (self.nearest(f) == y[idx]).double().mean().cpu()
        finally:
            model.train(training)
        return {"prototype_accuracy": acc}

    def nearest(self, features: torch.Tensor) -> torch.Tensor:
        """``[B]`` the class of the present prototype nearest to each row of ``features``."""
        dist = ((features.unsqueeze(1) - self.protos.to(features.dtype)) ** 2).sum(-1)
        return dist.masked_fill(self.present.unsqueeze(0) <= 0, float("inf")).argmin(-1)


@defaults_from("fedproto")
def fedproto(local_lr: ScheduleLike, lam: float, weights: str, client_optimizer: str,
             local_momentum: float, weight_decay: ScheduleLike,
             max_grad_norm: ScheduleLike | None, nar: bool, head: Sequence[str] | None
             ) -> PersonalAlgorithm:
    """FedProto: personal whole models trained on CE + λ·prototype distance; only class
    prototypes travel. Evaluation uses each client's own model and head, and beside it the
    nearest global prototype (the paper's inference, ``prototype_accuracy_*``)."""
    if lam < 0:
        raise ValueError(f"algorithm.lam: expected lam >= 0, got {lam}")
    if weights not in WEIGHTS:
        raise ValueError(f"algorithm.weights: expected one of {WEIGHTS}, got {weights!r}")
    patterns = None if head is None else tuple(head)
    opt = local_optimizer(client_optimizer, local_lr, momentum=local_momentum,
                          weight_decay=weight_decay, max_grad_norm=max_grad_norm, nar=nar)
    part = Prototypes(patterns, weights)
    spec = ProtoSpec(kept="all", head=patterns, finetune=Phase(opt))
    return Algorithm(NAME, _local_step(part, float(lam), opt), server_sgd(1.0),
                     parts=(PersonalPart(spec), part), aggregation="num_samples",
                     personal=spec, sends_model=False,
                     description="FedProto (Tan et al. 2022): personal models, class "
                                 "prototypes averaged by the server")
