"""FedALA (Zhang et al., "FedALA: Adaptive Local Aggregation for Personalized Federated
Learning", AAAI 2023).

Each client keeps its local model θ_i and element-wise weights W_i ∈ [0, 1] on the top
``layer_idx`` parameter tensors. Before its local training, a client aggregates the global
model θ into its own:

    θ̂ = θ_i + (θ - θ_i) ⊙ W_i   on the top layers,   θ̂ = θ   below them,

learning W_i on the first ``rand_percent`` % of the round's batches (one pass):

    W_i <- clip(W_i - η ∇f_i(θ̂; ξ) ⊙ (θ - θ_i), 0, 1),   θ̂ recomputed from W_i.

Local training (the local optimizer) then starts from θ̂, the client's trained model is
averaged as in FedAvg and kept as its θ_i; the client's evaluated model is θ̂ from its kept
θ_i and W_i and the current global model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch

from fedforge.algorithms.defaults import defaults_from
from fedforge.algorithms.personal.base import NAME, Personal, PersonalAlgorithm, Phase, Train
from fedforge.algorithms.personal.stateful import PersonalStatePart, clone, stepping
from fedforge.client.optimizers import local_optimizer
from fedforge.client.transforms import RoundContext, Transform
from fedforge.core.schedules import ScheduleLike
from fedforge.core.tree import Params
from fedforge.protocol.algorithm import FinalizeInputs
from fedforge.protocol.step_batch import step_batch
from fedforge.server.optimizers import server_sgd


def top(names, layer_idx: int) -> tuple[str, ...]:
    """The last ``layer_idx`` parameter tensors (the official code's ``params[-layer_idx:]``)."""
    names = list(names)
    return tuple(names[len(names) - min(layer_idx, len(names)):])


def aggregate(global_params: Params, local: Params, weights: Params) -> Params:
    """θ̂: the local model pulled to the global one by ``weights`` on their leaves, the global
    model elsewhere."""
    return {k: local[k] + (g - local[k]) * weights[k] if k in weights else g
            for k, g in global_params.items()}


def ala(eta: float, rand_percent: float) -> Transform:
    """The weight learning as a local optimizer over θ̂ (its state: the weights and the count
    of steps taken)."""

    def init(params, ctx):
        ref = next(iter(params.values()))
        return {"weights": ctx.client_state[NAME]["weights"],
                "taken": torch.zeros((), dtype=ref.dtype, device=ref.device)}

    def step(grads, state, params, ctx):
        batch = step_batch(ctx, "fedala")
        active = (batch.round_weights.sum(-1) > 0).sum()
        learn = (state["taken"] < torch.ceil(active * (rand_percent / 100.0))).to(
            state["taken"].dtype)
        local, glob = ctx.client_state[NAME]["local"], ctx.global_params
        weights = {k: torch.clamp(w - learn * eta * grads[k] * (glob[k] - local[k]), 0.0, 1.0)
                   for k, w in state["weights"].items()}
        return (aggregate(glob, local, weights),
                {"weights": weights, "taken": state["taken"] + 1})

    return stepping("ala", init, step)


class ALAPart(PersonalStatePart):
    """Keeps the client's trained model as its θ_i and the weights ``begin`` learned."""

    def finalize(self, fin: FinalizeInputs) -> tuple[dict, dict]:
        return {"local": dict(fin.params),
                "weights": fin.ctx.client_state[NAME]["weights"]}, {}


@dataclass(frozen=True)
class FedALASpec(Personal):
    """Adaptive local aggregation before the shared round (``begin``)."""

    step_batch: ClassVar[bool] = True
    ala: Transform | None = None

    def begin(self, train: Train, ctx: RoundContext) -> tuple[Params, RoundContext]:
        mine = ctx.client_state[NAME]
        start = aggregate(ctx.global_params, mine["local"], mine["weights"])
        start, state = train(start, self.ala, ctx, 1)[:2]
        mine = {**mine, "weights": state["weights"]}
        return start, ctx._replace(client_state={**ctx.client_state, NAME: mine})

    def client_params(self, global_params: Params, state: dict) -> Params:
        mine = state.get(NAME)
        if not mine:
            return dict(global_params)
        return aggregate(global_params, mine["local"], mine["weights"])


@defaults_from("fedala")
def fedala(local_lr: ScheduleLike, eta: float, rand_percent: float, layer_idx: int,
           client_optimizer: str, weight_decay: ScheduleLike,
           max_grad_norm: ScheduleLike | None, nar: bool) -> PersonalAlgorithm:
    """FedALA: ALA weights (step ``eta``) on the top ``layer_idx`` tensors, learned on
    ``rand_percent`` % of the round's batches; then FedAvg's local training from θ̂."""
    if not 0 < rand_percent <= 100:
        raise ValueError(f"algorithm.rand_percent: expected a percentage in (0, 100], got "
                         f"{rand_percent}")
    if int(layer_idx) < 1:
        raise ValueError(f"algorithm.layer_idx: expected an integer >= 1, got {layer_idx}")
    if math.isnan(eta) or eta < 0:
        raise ValueError(f"algorithm.eta: expected eta >= 0, got {eta}")
    opt = local_optimizer(client_optimizer, local_lr, weight_decay=weight_decay,
                          max_grad_norm=max_grad_norm, nar=nar)

    def client_init(params):
        return {"local": clone(params),
                "weights": {k: torch.ones_like(params[k]) for k in top(params, int(layer_idx))}}

    spec = FedALASpec(ala=ala(float(eta), float(rand_percent)), finetune=Phase(opt))
    return PersonalAlgorithm(
        "fedala", opt, server_sgd(1.0), parts=(ALAPart(client_init),),
        description="FedALA (Zhang et al. 2023): adaptive element-wise local aggregation, "
                    "then FedAvg", aggregation="num_samples", personal=spec)
