"""pFedMe (T Dinh, Tran & Nguyen, "Personalized Federated Learning with Moreau Envelopes",
NeurIPS 2020).

The client's personal model θ_i approximately solves the Moreau envelope's inner problem
``min_θ f_i(θ) + λ/2 ||θ - w_i||²`` at its local copy ``w_i`` of the shared model; each
local step on batch ξ (Alg. 1):

    K times:  θ <- θ - p_lr (∇f_i(θ; ξ) + λ (θ - w_i) + μ θ)
    w_i <- w_i - η λ (w_i - θ)

θ starts each round at the global model and carries over between the round's steps; the
server mixes ``w <- (1 - β) w + β mean_i w_i``. The client's evaluated model is its last θ.
"""

from __future__ import annotations

from dataclasses import dataclass

from fedforge.algorithms.defaults import defaults_from
from fedforge.algorithms.personal.base import NAME, PersonalAlgorithm, Phase
from fedforge.algorithms.personal.stateful import (
    BatchPersonal,
    clone,
    own_state_algorithm,
    stepping,
)
from fedforge.client.optimizers import local_optimizer
from fedforge.client.transforms import at_round, local_step
from fedforge.core.schedules import ScheduleLike, as_schedule
from fedforge.core.tree import Params
from fedforge.protocol.step_batch import step_batch


@dataclass(frozen=True)
class PFedMeSpec(BatchPersonal):
    """The evaluated model is the client's θ_i from its last round."""

    def client_params(self, global_params: Params, state: dict) -> Params:
        theta = state.get(NAME, {}).get("theta", {})
        return {k: theta.get(k, g) for k, g in global_params.items()}


@defaults_from("pfedme")
def pfedme(local_lr: ScheduleLike, personal_lr: ScheduleLike, lam: float, inner_steps: int,
           mu: float, beta: ScheduleLike, client_optimizer: str, weight_decay: ScheduleLike,
           max_grad_norm: ScheduleLike | None, nar: bool) -> PersonalAlgorithm:
    """pFedMe: ``inner_steps`` (K) steps of ``personal_lr`` on the prox problem for θ_i, then
    ``w_i`` moves towards θ_i with step ``local_lr · lam`` (through ``client_optimizer``);
    the server takes a ``beta`` step towards the clients' mean."""
    if lam <= 0:
        raise ValueError(f"algorithm.lam: expected lam > 0, got {lam}")
    if int(inner_steps) < 1:
        raise ValueError(f"algorithm.inner_steps: expected an integer >= 1, got {inner_steps}")
    opt = local_optimizer(client_optimizer, local_lr, weight_decay=weight_decay,
                          max_grad_norm=max_grad_norm, nar=nar)
    p_lr = as_schedule(personal_lr, "personal_lr")

    def init(params, ctx):  # θ restarts from the model the round starts from
        return {"base": opt.init(params, ctx), "theta": dict(params)}

    def step(grads, state, params, ctx):
        del grads  # pFedMe never uses the gradient at w_i
        batch, theta, eta = step_batch(ctx, "pfedme"), state["theta"], at_round(p_lr, ctx)
        for _ in range(int(inner_steps)):
            g = batch.grad(theta)
            theta = {k: t - eta * (g[k] + lam * (t - params[k]) + mu * t)
                     for k, t in theta.items()}
        pull = {k: lam * (w - theta[k]) for k, w in params.items()}
        new_w, base = local_step(opt, pull, state["base"], params, ctx)
        return new_w, {"base": base, "theta": theta}

    return own_state_algorithm(
        "pfedme", stepping("pfedme", init, step), PFedMeSpec(finetune=Phase(opt)),
        lambda p: {"theta": clone(p)},
        "pFedMe (T Dinh et al. 2020): Moreau-envelope personal θ_i, server β-mixing",
        server_lr=beta)
