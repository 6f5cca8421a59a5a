"""APFL (Deng, Kamani & Mahdavi, "Adaptive Personalized Federated Learning", 2020).

Each client keeps a personal model ``v_i`` and a mixing weight ``α_i``; its personalised
model is ``v̄_i = α_i v_i + (1 - α_i) w``. Every local step on batch ξ (Alg. 1, eq. 10):

    w   <- w - η ∇f_i(w; ξ)                          (the shared model, as FedAvg)
    v_i <- v_i - η α_i ∇f_i(v̄_i; ξ)                  (∇_v f_i(v̄_i) = α_i ∇f_i(v̄_i))
    α_i <- clip(α_i - η_α <v_i - w, ∇f_i(v̄_i; ξ)>, 0, 1)   (adaptive α only)

all three at the step's starting point; only ``w`` is averaged, ``v_i`` and ``α_i`` stay in
the client store and ``v̄_i`` is the client's evaluated model.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fedforge.algorithms.defaults import defaults_from
from fedforge.algorithms.personal.base import NAME, PersonalAlgorithm, Phase
from fedforge.algorithms.personal.stateful import (
    BatchPersonal,
    clone,
    own_state_algorithm,
    scalar,
    stepping,
)
from fedforge.client.optimizers import local_optimizer
from fedforge.client.transforms import at_round, local_step
from fedforge.core.schedules import ScheduleLike, as_schedule
from fedforge.core.tree import Params
from fedforge.protocol.step_batch import step_batch


@dataclass(frozen=True)
class APFLSpec(BatchPersonal):
    """The evaluated model is the mix ``α_i v_i + (1 - α_i) w`` of the client's state."""

    def covered_by_dp_sgd(self) -> bool:
        return True  # w steps on the loop's gradient alone; v_i and α_i stay on the client

    def client_params(self, global_params: Params, state: dict) -> Params:
        mine = state.get(NAME)
        if not mine:
            return dict(global_params)
        a = mine["alpha"]
        return {k: a * mine["v"][k] + (1 - a) * g for k, g in global_params.items()}


@defaults_from("apfl")
def apfl(local_lr: ScheduleLike, alpha: float, adaptive_alpha: bool,
         alpha_lr: ScheduleLike | None, client_optimizer: str, weight_decay: ScheduleLike,
         max_grad_norm: ScheduleLike | None, nar: bool) -> PersonalAlgorithm:
    """APFL: shared ``w`` trained as FedAvg; beside it the client's ``v_i`` on the mixed
    model's loss and, with ``adaptive_alpha``, the mixing weight ``α_i`` (step ``alpha_lr``,
    none: ``local_lr``)."""
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"algorithm.alpha: expected a mixing weight in [0, 1], got {alpha}")
    opt = local_optimizer(client_optimizer, local_lr, weight_decay=weight_decay,
                          max_grad_norm=max_grad_norm, nar=nar)
    lr = as_schedule(local_lr, "local_lr")
    a_lr = as_schedule(local_lr if alpha_lr is None else alpha_lr, "alpha_lr")

    def init(params, ctx):
        mine = ctx.client_state[NAME]
        return {"base": opt.init(params, ctx), "v": mine["v"], "alpha": mine["alpha"]}

    def step(grads, state, params, ctx):
        a, v = state["alpha"], state["v"]
        mixed = {k: a * v[k] + (1 - a) * w for k, w in params.items()}
        g = step_batch(ctx, "apfl").grad(mixed)
        eta = at_round(lr, ctx)
        new_v = {k: v[k] - eta * a * g[k] for k in v}
        if adaptive_alpha:
            slope = sum(((v[k] - params[k]) * g[k]).sum() for k in params)
            a = torch.clamp(a - at_round(a_lr, ctx) * slope, 0.0, 1.0)
        new_w, base = local_step(opt, grads, state["base"], params, ctx)
        return new_w, {"base": base, "v": new_v, "alpha": a}

    return own_state_algorithm(
        "apfl", stepping("apfl", init, step), APFLSpec(finetune=Phase(opt)),
        lambda p: {"v": clone(p), "alpha": scalar(alpha, p)},
        "APFL (Deng et al. 2020): personal v_i, adaptive mixing α_i v_i + (1-α_i) w")
