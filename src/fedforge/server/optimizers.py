"""Server optimizers applied to the pseudo-gradient ``Δ = x^t - mean_i x_i`` (FedOpt family).

Each is ``ServerOptimizer(init(params) -> state, update(pseudo_grad, state, params) ->
(updates, state))`` and the new model is ``params + updates``. With this sign convention
FedAvg is server SGD with lr 1 (Reddi et al. 2021, "Adaptive Federated Optimization").
Hyper-parameter names follow that paper: η (``lr``), β1, β2, τ (``tau``).

``lr`` and ``tau`` (ε) accept per-round schedules (:mod:`fedforge.core.schedules`). The
server learns the round from its own state: an optimizer with a non-constant schedule keeps
``state["count"]`` (updates done so far, checkpointed with the state), and update number
``count + 1`` is round ``t = count + 1`` of the runner. Constant hyper-parameters keep the
state exactly as before (no ``count``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch

from fedforge.core.moments import ema, ema_sq, heavy_ball
from fedforge.core.moments import nesterov as nesterov_step
from fedforge.core.schedules import Schedule, ScheduleLike, as_schedule, value_at
from fedforge.core.tree import Params, tree_map, tree_map2, tree_zeros_like


class ServerOptimizer(NamedTuple):
    name: str
    init: Callable[[Params], dict]
    update: Callable[[Params, dict, Params], tuple[Params, dict]]


class _RoundClock:
    """Gives schedules the round: ``t = state["count"] + 1`` when any schedule varies."""

    def __init__(self, *schedules: Schedule) -> None:
        self.needed = any(not s.is_constant for s in schedules)

    def init(self, state: dict) -> dict:
        if self.needed:
            state["count"] = torch.zeros((), dtype=torch.float64)
        return state

    def round(self, state: dict) -> torch.Tensor | None:
        return state["count"] + 1 if self.needed else None

    def tick(self, old: dict, new: dict) -> dict:
        if self.needed:
            new["count"] = old["count"] + 1
        return new


def server_sgd(
    lr: ScheduleLike = 1.0, momentum: float = 0.0, *, nesterov: bool = False
) -> ServerOptimizer:
    """``x <- x - lr_t * v`` with ``v = momentum * v + Δ`` (FedAvgM, Hsu et al. 2019)."""
    lr = as_schedule(lr, "server_lr")
    clock = _RoundClock(lr)

    def init(params):
        return clock.init({"v": tree_zeros_like(params)} if momentum else {})

    def update(g, state, params):
        del params
        eta = value_at(lr, clock.round(state))
        if not momentum:
            return tree_map(lambda x: -eta * x, g), clock.tick(state, dict(state))
        v = heavy_ball(state["v"], g, momentum)
        step = nesterov_step(g, v, momentum) if nesterov else v
        return tree_map(lambda x: -eta * x, step), clock.tick(state, {"v": v})

    return ServerOptimizer("sgd", init, update)


def _adaptive(
    name: str,
    second_moment: Callable[[Params, Params], Params],
    lr: ScheduleLike,
    b1: float,
    tau: ScheduleLike,
    initial_accumulator: float,
    amsgrad: bool,
    floor: float | None,
    rule: str = "textbook",
    b2: float = 0.99,
) -> ServerOptimizer:
    lr, tau = as_schedule(lr, "server_lr"), as_schedule(tau, "tau")
    clock = _RoundClock(lr, tau)

    def init(params):
        state = {
            "m": tree_zeros_like(params),
            "v": tree_map(lambda p: torch.full_like(p, initial_accumulator), params),
        }
        if amsgrad:
            state["vhat"] = tree_map(lambda p: torch.full_like(p, initial_accumulator), params)
        return clock.init(state)

    def update(g, state, params):
        del params
        t = clock.round(state)
        eta, eps = value_at(lr, t), value_at(tau, t)
        m = ema(state["m"], g, b1)
        if rule == "fednar_code":
            # ljb121002/fednar main.py: v from the new momentum m (not from Δ), both moments
            # rescaled by 1/(1-β) (not a bias correction), ε inside the square root.
            v = ema_sq(state["v"], m, b2)
            updates = {k: -eta * (m[k] / (1 - b1)) / (v[k] / (1 - b2) + eps).sqrt() for k in m}
            return updates, clock.tick(state, {"m": m, "v": v})
        v = second_moment(state["v"], g)
        new_state = {"m": m, "v": v}
        denom = v
        if amsgrad:
            denom = tree_map2(torch.maximum, state["vhat"], v)
        if floor is not None:  # max(v̂, v, floor): never a 0/0 where a coordinate of Δ is 0
            denom = tree_map(lambda x: x.clamp_min(floor), denom)
        if amsgrad:
            new_state["vhat"] = denom
        if floor is not None:
            updates = {k: -eta * m[k] / denom[k].sqrt() for k in m}
        else:
            updates = {k: -eta * m[k] / (denom[k].sqrt() + eps) for k in m}
        return updates, clock.tick(state, new_state)

    if rule not in ("textbook", "fednar_code"):
        raise ValueError(f"adam_rule: expected 'textbook' or 'fednar_code', got {rule!r}")
    return ServerOptimizer(name, init, update)


def server_adam(
    lr: ScheduleLike = 1e-2,
    b1: float = 0.9,
    b2: float = 0.99,
    tau: ScheduleLike = 1e-3,
    *,
    initial_accumulator: float = 0.0,
    amsgrad: bool = False,
    floor: float | None = None,
    rule: str = "textbook",
) -> ServerOptimizer:
    """FedAdam (Reddi et al. 2021, Alg. 2): no bias correction, ``x <- x - η m/(sqrt(v)+τ)``.

    ``rule="fednar_code"`` is the FedAdam of the FedNAR/FedExP code (ljb121002/fednar,
    ``main.py``): ``m <- β1 m + (1-β1) Δ``, then ``v <- β2 v + (1-β2) m²`` (the *momentum*
    squared, where the textbook squares Δ), and ``x <- x - η (m/(1-β1)) / sqrt(v/(1-β2) + ε_t)``
    with ε = ``tau`` inside the root (the code decays it, ``ε_t = ε_0 γ^(2t)``: pass an
    exponential schedule with ``gamma = γ²``). ``amsgrad``/``floor`` apply to the textbook rule.

    ``amsgrad=True`` keeps ``v_hat = max(v_hat, v)``. With ``floor`` set the step is
    ``η m / sqrt(max(v_hat, v, floor))`` as in FedAMS (Wang et al. 2022, Alg. 2, ε = ``floor``).
    ``initial_accumulator`` is v_{-1} (Reddi: any value ≥ τ² is allowed; 0 by default).
    """
    return _adaptive(
        "adam", lambda v, g: ema_sq(v, g, b2), lr, b1, tau, initial_accumulator,
        amsgrad, floor, rule, b2,
    )


def server_yogi(
    lr: float = 1e-2, b1: float = 0.9, b2: float = 0.99, tau: float = 1e-3,
    *, initial_accumulator: float = 0.0,
) -> ServerOptimizer:
    """FedYogi: ``v <- v - (1-β2) Δ² sign(v - Δ²)`` (Reddi et al. 2021, Alg. 2)."""

    def second(v, g):
        def one(vi, gi):
            g2 = gi * gi
            return vi - (1 - b2) * g2 * torch.sign(vi - g2)

        return tree_map2(one, v, g)

    return _adaptive("yogi", second, lr, b1, tau, initial_accumulator, False, None)


def server_adagrad(
    lr: float = 1e-2, tau: float = 1e-3, *, b1: float = 0.0, initial_accumulator: float = 0.0
) -> ServerOptimizer:
    """FedAdagrad: ``v <- v + Δ²`` (Reddi et al. 2021, Alg. 2; β1 = 0 by default)."""
    return _adaptive(
        "adagrad", lambda v, g: tree_map2(lambda vi, gi: vi + gi * gi, v, g), lr, b1, tau,
        initial_accumulator, False, None
    )
