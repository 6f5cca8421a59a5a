"""Server optimizers applied to the pseudo-gradient ``Δ = x^t - mean_i x_i`` (FedOpt family).

Each is ``ServerOptimizer(init(params) -> state, update(pseudo_grad, state, params) ->
(updates, state))`` and the new model is ``params + updates``. With this sign convention
FedAvg is server SGD with lr 1 (Reddi et al. 2021, "Adaptive Federated Optimization").
Hyper-parameter names follow that paper: η (``lr``), β1, β2, τ (``tau``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch

from fedforge.core.tree import Params, tree_map, tree_map2, tree_zeros_like


class ServerOptimizer(NamedTuple):
    name: str
    init: Callable[[Params], dict]
    update: Callable[[Params, dict, Params], tuple[Params, dict]]


def server_sgd(lr: float = 1.0, momentum: float = 0.0, *, nesterov: bool = False) -> ServerOptimizer:
    """``x <- x - lr * v`` with ``v = momentum * v + Δ`` (FedAvgM, Hsu et al. 2019)."""

    def init(params):
        return {"v": tree_zeros_like(params)} if momentum else {}

    def update(g, state, params):
        del params
        if not momentum:
            return tree_map(lambda x: -lr * x, g), state
        v = tree_map2(lambda vi, gi: momentum * vi + gi, state["v"], g)
        step = tree_map2(lambda gi, vi: gi + momentum * vi, g, v) if nesterov else v
        return tree_map(lambda x: -lr * x, step), {"v": v}

    return ServerOptimizer("sgd", init, update)


def _adaptive(
    name: str,
    second_moment: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    lr: float,
    b1: float,
    tau: float,
    initial_accumulator: float,
    amsgrad: bool,
    floor: float | None,
) -> ServerOptimizer:
    def init(params):
        state = {
            "m": tree_zeros_like(params),
            "v": tree_map(lambda p: torch.full_like(p, initial_accumulator), params),
        }
        if amsgrad:
            state["vhat"] = tree_map(lambda p: torch.full_like(p, initial_accumulator), params)
        return state

    def update(g, state, params):
        del params
        m = tree_map2(lambda mi, gi: b1 * mi + (1 - b1) * gi, state["m"], g)
        v = tree_map2(second_moment, state["v"], g)
        new_state = {"m": m, "v": v}
        denom = v
        if amsgrad:
            denom = tree_map2(torch.maximum, state["vhat"], v)
            if floor is not None:
                denom = tree_map(lambda x: x.clamp_min(floor), denom)
            new_state["vhat"] = denom
        if floor is not None:
            updates = {k: -lr * m[k] / denom[k].sqrt() for k in m}
        else:
            updates = {k: -lr * m[k] / (denom[k].sqrt() + tau) for k in m}
        return updates, new_state

    return ServerOptimizer(name, init, update)


def server_adam(
    lr: float = 1e-2,
    b1: float = 0.9,
    b2: float = 0.99,
    tau: float = 1e-3,
    *,
    initial_accumulator: float = 0.0,
    amsgrad: bool = False,
    floor: float | None = None,
) -> ServerOptimizer:
    """FedAdam (Reddi et al. 2021, Alg. 2): no bias correction, ``x <- x - η m/(sqrt(v)+τ)``.

    ``amsgrad=True`` keeps ``v_hat = max(v_hat, v)``. With ``floor`` set the step is
    ``η m / sqrt(max(v_hat, v, floor))`` as in FedAMS (Wang et al. 2022, Alg. 2, ε = ``floor``).
    ``initial_accumulator`` is v_{-1} (Reddi: any value ≥ τ² is allowed; 0 by default).
    """
    return _adaptive(
        "adam", lambda v, g: b2 * v + (1 - b2) * g * g, lr, b1, tau, initial_accumulator,
        amsgrad, floor,
    )


def server_yogi(
    lr: float = 1e-2, b1: float = 0.9, b2: float = 0.99, tau: float = 1e-3,
    *, initial_accumulator: float = 0.0,
) -> ServerOptimizer:
    """FedYogi: ``v <- v - (1-β2) Δ² sign(v - Δ²)`` (Reddi et al. 2021, Alg. 2)."""

    def second(v, g):
        g2 = g * g
        return v - (1 - b2) * g2 * torch.sign(v - g2)

    return _adaptive("yogi", second, lr, b1, tau, initial_accumulator, False, None)


def server_adagrad(
    lr: float = 1e-2, tau: float = 1e-3, *, b1: float = 0.0, initial_accumulator: float = 0.0
) -> ServerOptimizer:
    """FedAdagrad: ``v <- v + Δ²`` (Reddi et al. 2021, Alg. 2; β1 = 0 by default)."""
    return _adaptive("adagrad", lambda v, g: v + g * g, lr, b1, tau, initial_accumulator, False, None)
