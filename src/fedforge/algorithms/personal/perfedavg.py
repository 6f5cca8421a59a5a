"""Per-FedAvg (Fallah, Mokhtari & Ozdaglar, "Personalized Federated Learning with
Theoretical Guarantees: A Model-Agnostic Meta-Learning Approach", NeurIPS 2020).

The shared model is trained for one step of adaptation: each local step cuts its batch into
D, D' (and D'' for the Hessian-free variant) and, with ``temp = w - α ∇f_i(w; D)``,

    FO:  w <- w - β ∇f_i(temp; D')
    HF:  w <- w - β (∇f_i(temp; D') - α d),
         d = (∇f_i(w + δ g; D'') - ∇f_i(w - δ g; D'')) / (2δ),  g = ∇f_i(temp; D')

(``d`` is the finite-difference Hessian-vector product ∇²f_i(w; D'') g). A client's model is
the global one after one SGD step of ``α`` on its own training data (at evaluation).
"""

from __future__ import annotations

import torch

from fedforge.algorithms.defaults import defaults_from
from fedforge.algorithms.personal.base import PersonalAlgorithm, Phase
from fedforge.algorithms.personal.stateful import BatchPersonal, stepping
from fedforge.client.optimizers import local_optimizer
from fedforge.client.transforms import at_round, local_step
from fedforge.core.schedules import ScheduleLike, as_schedule
from fedforge.protocol.step_batch import step_batch
from fedforge.server.optimizers import server_sgd

VARIANTS = ("fo", "hf")


def parts_of(weights: torch.Tensor, parts: int) -> list[torch.Tensor]:
    """``weights`` [B] cut into ``parts`` consecutive, disjoint slices of the batch (the
    other positions zero): Per-FedAvg's D, D' (and D'') from one batch."""
    size = weights.shape[-1]
    pos = torch.arange(size, device=weights.device)
    bounds = [(size * j) // parts for j in range(parts + 1)]
    return [weights * ((pos >= lo) & (pos < hi)).to(weights.dtype)
            for lo, hi in zip(bounds[:-1], bounds[1:])]


def _per_fedavg(name: str, variant: str, local_lr: ScheduleLike, beta: ScheduleLike,
                delta: float, finetune_steps: int, client_optimizer: str,
                weight_decay: ScheduleLike, max_grad_norm: ScheduleLike | None, nar: bool
                ) -> PersonalAlgorithm:
    if variant not in VARIANTS:
        raise ValueError(f"per_fedavg variant: expected one of {VARIANTS}, got {variant!r}")
    if variant == "hf" and delta <= 0:
        raise ValueError(f"algorithm.delta: expected delta > 0, got {delta}")
    # the meta step: client_optimizer's chain with learning rate β
    outer = local_optimizer(client_optimizer, beta, weight_decay=weight_decay,
                            max_grad_norm=max_grad_norm, nar=nar)
    alpha = as_schedule(local_lr, "local_lr")
    parts = 3 if variant == "hf" else 2

    def init(params, ctx):
        return {"base": outer.init(params, ctx)}

    def step(grads, state, params, ctx):
        del grads  # every gradient is on a part of the batch
        batch = step_batch(ctx, name)
        d, d1, *d2 = parts_of(batch.weights, parts)
        a = at_round(alpha, ctx)
        g0 = batch.grad(params, d)
        g = batch.grad({k: w - a * g0[k] for k, w in params.items()}, d1)
        if d2:  # Hessian-free: the Hessian at w times g, by central differences on D''
            plus = batch.grad({k: w + delta * g[k] for k, w in params.items()}, d2[0])
            minus = batch.grad({k: w - delta * g[k] for k, w in params.items()}, d2[0])
            g = {k: g[k] - a * (plus[k] - minus[k]) / (2 * delta) for k in g}
        new_w, base = local_step(outer, g, state["base"], params, ctx)
        return new_w, {"base": base}

    tune = local_optimizer("sgd", local_lr)
    spec = BatchPersonal(finetune=Phase(tune), finetune_steps=_steps(finetune_steps))
    return PersonalAlgorithm(name, stepping(name, init, step), server_sgd(1.0),
                             description=DESCRIPTIONS[variant], aggregation="num_samples",
                             personal=spec)


def _steps(value: int) -> int:
    if int(value) < 0:
        raise ValueError(f"algorithm.finetune_steps: expected >= 0, got {value}")
    return int(value)


DESCRIPTIONS = {
    "fo": "Per-FedAvg FO (Fallah et al. 2020): first-order MAML step, 1 SGD step at eval",
    "hf": "Per-FedAvg HF (Fallah et al. 2020): Hessian-free MAML step, 1 SGD step at eval",
}


@defaults_from("per_fedavg_fo")
def per_fedavg_fo(local_lr: ScheduleLike, beta: ScheduleLike, finetune_steps: int,
                  client_optimizer: str, weight_decay: ScheduleLike,
                  max_grad_norm: ScheduleLike | None, nar: bool) -> PersonalAlgorithm:
    """Per-FedAvg, first order: ``temp`` on D, the meta step of ``beta`` on D'."""
    return _per_fedavg("per_fedavg_fo", "fo", local_lr, beta, 0.0, finetune_steps,
                       client_optimizer, weight_decay, max_grad_norm, nar)


@defaults_from("per_fedavg_hf")
def per_fedavg_hf(local_lr: ScheduleLike, beta: ScheduleLike, delta: float,
                  finetune_steps: int, client_optimizer: str, weight_decay: ScheduleLike,
                  max_grad_norm: ScheduleLike | None, nar: bool) -> PersonalAlgorithm:
    """Per-FedAvg, Hessian-free: the FO step corrected by ``α`` times the Hessian-vector
    product on D'' (central differences of width ``delta``)."""
    return _per_fedavg("per_fedavg_hf", "hf", local_lr, beta, delta, finetune_steps,
                       client_optimizer, weight_decay, max_grad_norm, nar)
