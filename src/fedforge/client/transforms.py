"""Gradient transformations for client-side local steps (optax's shape, in PyTorch).

A :class:`Transform` is a pair of pure functions::

    state = t.init(params, ctx)
    updates, state = t.update(grads, state, params, ctx)

``ctx`` is the :class:`RoundContext` of the client's round (global model, what the server
broadcast, the client's persistent state), so a correction such as SCAFFOLD's ``c - c_i`` or
FedProx's anchor is read from it instead of being copied into per-step state. States are dicts
of tensors, which makes them vmappable and checkpointable. The last transform of a local
optimizer turns directions into *additive* updates (``scale(-lr)``), so a local step is always
``params + updates`` (:func:`local_step`, which fuses that last scaling into the addition).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import torch

from fedforge.core.moments import ema, ema_sq, heavy_ball
from fedforge.core.moments import nesterov as nesterov_step
from fedforge.core.schedules import ScheduleLike, as_schedule, is_zero, value_at
from fedforge.core.tree import Params, tree_map, tree_map2, tree_sq_norm, tree_zeros_like

State = dict[str, Any]


class RoundContext(NamedTuple):
    """What one client knows during one round (read-only for transforms)."""

    global_params: Params  # x^t, as broadcast
    broadcast: dict  # extra server tensors, by part name (e.g. {"scaffold": {"c": ...}})
    client_state: dict  # this client's persistent state, by part name
    info: dict  # per-client scalars for this round (e.g. {"tracking": tensor(True)})

    @property
    def round(self) -> torch.Tensor:
        """The current round t (1-based) as a 0-d float tensor, for schedules."""
        return self.broadcast["round"]


def at_round(schedule: ScheduleLike, ctx: RoundContext):
    """Value of a hyper-parameter schedule in this round (a constant is returned as is)."""
    return value_at(as_schedule(schedule), ctx.broadcast.get("round"))


class Transform(NamedTuple):
    name: str
    init: Callable[[Params, RoundContext], State]
    update: Callable[[Params, State, Params, RoundContext], tuple[Params, State]]
    # optional: ``params + updates`` computed in one pass (see :func:`local_step`)
    step: Callable[[Params, State, Params, RoundContext], tuple[Params, State]] | None = None
    # optional: ``step`` writing into ``params``, returning the new state (:func:`step_in_place`)
    in_place: Callable[[Params, State, Params, RoundContext], State] | None = None
    # whether the new state may hold a step's ``params`` tensors, which an update in place
    # would change under it; ``True`` (the safe answer) unless the transform says otherwise
    keeps_params: bool = True


def local_step(t: Transform, grads: Params, state: State, params: Params,
               ctx: RoundContext) -> tuple[Params, State]:
    """One local step, ``(params + updates, new state)``. A transform with a ``step`` fuses
    the last scaling into the addition: for a large layer the separate ``-lr * g`` pass was
    8 % of a CPU step (``benchmarks/history/``)."""
    if t.step is not None:
        return t.step(grads, state, params, ctx)
    updates, new_state = t.update(grads, state, params, ctx)
    return tree_map2(torch.add, params, updates), new_state


def steps_in_place(t: Transform) -> bool:
    """Whether :func:`step_in_place` gives :func:`local_step`'s numbers bit for bit: nothing
    keeps a step's parameters, and a fused ``step`` has its in-place twin (an unfused
    addition rounds otherwise than a fused one)."""
    return not t.keeps_params and (t.step is None or t.in_place is not None)


def step_in_place(t: Transform, grads: Params, state: State, params: Params,
                  ctx: RoundContext) -> State:
    """:func:`local_step` writing ``params + updates`` into ``params`` (the same kernels,
    without allocating a model per step); only where :func:`steps_in_place`."""
    if t.in_place is not None:
        return t.in_place(grads, state, params, ctx)
    updates, new_state = t.update(grads, state, params, ctx)
    for k, p in params.items():
        p.add_(updates[k])
    return new_state


def _stateless(name: str, fn: Callable[[Params, Params, RoundContext], Params]) -> Transform:
    def init(params, ctx):
        del params, ctx
        return {}

    def update(grads, state, params, ctx):
        return fn(grads, params, ctx), state

    return Transform(name, init, update, keeps_params=False)  # its state is its init's


def chain(*transforms: Transform) -> Transform:
    """Apply transforms in order; the state is a dict keyed by each transform's name."""
    names = [t.name for t in transforms]
    if len(set(names)) != len(names):
        raise ValueError(f"chain: transform names must be unique, got {names}")

    def init(params, ctx):
        return {t.name: t.init(params, ctx) for t in transforms}

    def run(parts, grads, state, params, ctx):
        new_state = {}
        for t in parts:
            grads, new_state[t.name] = t.update(grads, state[t.name], params, ctx)
        return grads, new_state

    def update(grads, state, params, ctx):
        return run(transforms, grads, state, params, ctx)

    *first, last = transforms

    def step(grads, state, params, ctx):  # the last transform fuses its update and the add
        grads, new_state = run(first, grads, state, params, ctx)
        new_params, new_state[last.name] = local_step(last, grads, state[last.name], params,
                                                      ctx)
        return new_params, new_state

    def in_place(grads, state, params, ctx):
        grads, new_state = run(first, grads, state, params, ctx)
        new_state[last.name] = step_in_place(last, grads, state[last.name], params, ctx)
        return new_state

    keeps = any(t.keeps_params for t in transforms)
    return Transform("chain", init, update, step if last.step is not None else None,
                     in_place if steps_in_place(last) else None, keeps)


def identity() -> Transform:
    return _stateless("identity", lambda g, p, ctx: g)


def scale(factor: ScheduleLike, name: str = "scale") -> Transform:
    """``g -> factor * g`` (``factor`` may be a per-round schedule)."""
    factor = as_schedule(factor, name)

    def fn(g, p, ctx):
        f = at_round(factor, ctx)
        return tree_map(lambda x: f * x, g)

    return _stateless(name, fn)


def scale_by_learning_rate(lr: ScheduleLike) -> Transform:
    """``g -> -lr_t * g``: the last step of every local optimizer (descent direction)."""
    lr = as_schedule(lr, "lr")

    def fn(g, p, ctx):
        f = at_round(lr, ctx)
        return tree_map(lambda x: -f * x, g)

    def neg_lr(ctx):
        f = at_round(lr, ctx)
        # a 0-d float64 tensor (cast to the params' dtype by the kernel, as a Python number
        # would be): unlike ``alpha=``, it takes any float (a diverging run's 1e40 -> inf)
        return -f if isinstance(f, torch.Tensor) else torch.tensor(-f, dtype=torch.float64)

    def step(g, state, p, ctx):  # p - lr_t * g in one kernel
        neg = neg_lr(ctx)
        return tree_map2(lambda pi, gi: torch.addcmul(pi, gi, neg), p, g), state

    def in_place(g, state, p, ctx):  # the same kernel, into p
        neg = neg_lr(ctx)
        for k, pi in p.items():
            pi.addcmul_(g[k], neg)
        return state

    return _stateless("lr", fn)._replace(step=step, in_place=in_place)


def add_decayed_weights(weight_decay: ScheduleLike) -> Transform:
    """``g -> g + wd_t * x`` (L2 / coupled weight decay, as ``torch.optim.SGD``)."""
    weight_decay = as_schedule(weight_decay, "weight_decay")

    def fn(g, p, ctx):
        wd = at_round(weight_decay, ctx)
        return tree_map2(lambda gi, pi: gi + wd * pi, g, p)

    return _stateless("weight_decay", fn)


def add_prox(mu: float) -> Transform:
    """FedProx: ``g -> g + mu (x - x^t)``, the gradient of ``mu/2 ||x - x^t||^2``."""
    return _stateless(
        "prox",
        lambda g, p, ctx: {k: g[k] + mu * (p[k] - ctx.global_params[k]) for k in g},
    )


def add_correction(part: str, server_key: str, client_key: str) -> Transform:
    """Control-variate correction ``g -> g + c - c_i`` (SCAFFOLD, FAdamGC's ``y - y_i``).

    ``c`` is read from ``ctx.broadcast[part][server_key]`` and ``c_i`` from
    ``ctx.client_state[part][client_key]``.
    """

    def fn(g, p, ctx):
        c, ci = ctx.broadcast[part][server_key], ctx.client_state[part][client_key]
        return {k: g[k] + c[k] - ci[k] for k in g}

    return _stateless(f"correction_{part}", fn)


def clip_by_global_norm(max_norm: ScheduleLike) -> Transform:
    """Rescale ``g`` to global norm at most ``max_norm`` (no-op below it; may be a schedule).

    Its state counts, over the round's steps, how many were clipped and the sum of the
    pre-clip norms: clipping can only matter when it fires (:func:`clip_statistics`)."""
    max_norm = as_schedule(max_norm, "max_grad_norm")

    def init(params, ctx):
        p0 = next(iter(params.values()))
        zero = torch.zeros((), dtype=p0.dtype, device=p0.device)
        return {"clipped": zero, "norm_sum": zero.clone()}

    def update(g, state, params, ctx):
        norm = tree_sq_norm(g).sqrt()
        bound = at_round(max_norm, ctx)
        factor = torch.clamp(bound / (norm + 1e-12), max=1.0)
        state = {"clipped": state["clipped"] + (norm > bound).to(state["clipped"].dtype),
                 "norm_sum": state["norm_sum"] + norm.to(state["norm_sum"].dtype)}
        return tree_map(lambda x: x * factor, g), state

    return Transform("clip", init, update, keeps_params=False)


def _find_state(state: Any, name: str) -> State | None:
    """The state of the transform ``name`` anywhere in a (nested) chain's state."""
    if not isinstance(state, dict):
        return None
    if isinstance(state.get(name), dict) and state[name]:
        return state[name]
    for sub in state.values():
        found = _find_state(sub, name)
        if found is not None:
            return found
    return None


def clip_statistics(state: State, steps: torch.Tensor) -> dict[str, torch.Tensor]:
    """``clip_fraction`` (share of the round's steps clipped) and ``clip_norm`` (mean
    pre-clip norm) from a local optimizer's final state; ``{}`` without a clip."""
    clip = _find_state(state, "clip")
    if not clip:
        return {}
    n = steps.clamp_min(1.0)
    return {"clip_fraction": clip["clipped"] / n, "clip_norm": clip["norm_sum"] / n}


def trace(momentum: float, nesterov: bool = False, name: str = "momentum") -> Transform:
    """Heavy-ball momentum ``m = beta m + g`` (``torch.optim.SGD`` convention, no dampening)."""

    def init(params, ctx):
        return {"m": tree_zeros_like(params)}

    def update(g, state, params, ctx):
        m = heavy_ball(state["m"], g, momentum)
        out = nesterov_step(g, m, momentum) if nesterov else m
        return out, {"m": m}

    return Transform(name, init, update, keeps_params=False)


def scale_by_adam(
    b1: float = 0.9,
    b2: float = 0.999,
    eps: ScheduleLike = 1e-8,
    *,
    amsgrad: bool = False,
    bias_correction: bool = True,
    initial_v: Callable[[RoundContext], Params] | None = None,
    name: str = "adam",
) -> Transform:
    """Adam / AMSGrad direction ``m_hat / (sqrt(v_hat) + eps)``.

    Args:
      b1, b2, eps: Adam's β1, β2, ε.
      amsgrad: keep ``v_hat = max(v_hat, v)`` (Reddi et al. 2018) and divide by it.
      bias_correction: divide m, v by ``1 - b^t`` (Kingma & Ba); FAdamGC uses none.
      initial_v: read the starting second moment from the round context (FAdamGC carries
        ``v_i`` across rounds); ``v_hat`` then starts at the same value. Default: zeros.
    """
    eps = as_schedule(eps, "eps")

    def init(params, ctx):
        v = initial_v(ctx) if initial_v is not None else tree_zeros_like(params)
        dtype = next(iter(params.values())).dtype  # the step count t of β^t, in the model's
        state = {"m": tree_zeros_like(params), "v": v, "count": torch.zeros((), dtype=dtype)}
        if amsgrad:
            state["vhat"] = v
        return state

    def update(g, state, params, ctx):
        count = state["count"] + 1
        m = ema(state["m"], g, b1)
        v = ema_sq(state["v"], g, b2)
        new_state = {"m": m, "v": v, "count": count}
        e = at_round(eps, ctx)
        denom_v = v
        if amsgrad:
            denom_v = tree_map2(torch.maximum, state["vhat"], v)
            new_state["vhat"] = denom_v
        if bias_correction:
            c1, c2 = 1 - b1**count, 1 - b2**count
            out = {k: (m[k] / c1) / ((denom_v[k] / c2).sqrt() + e) for k in m}
        else:
            out = {k: m[k] / (denom_v[k].sqrt() + e) for k in m}
        return out, new_state

    return Transform(name, init, update, keeps_params=False)


def sgd(
    lr: ScheduleLike, momentum: float = 0.0, weight_decay: ScheduleLike = 0.0, *,
    nesterov: bool = False,
) -> Transform:
    """Client SGD, optionally with momentum and weight decay (``torch.optim.SGD`` semantics)."""
    parts = []
    if not is_zero(as_schedule(weight_decay, "weight_decay")):
        parts.append(add_decayed_weights(weight_decay))
    if momentum:
        parts.append(trace(momentum, nesterov))
    parts.append(scale_by_learning_rate(lr))
    return chain(*parts)


def adam(
    lr: ScheduleLike,
    b1: float = 0.9,
    b2: float = 0.999,
    eps: ScheduleLike = 1e-8,
    weight_decay: ScheduleLike = 0.0,
    *,
    amsgrad: bool = False,
    bias_correction: bool = True,
) -> Transform:
    """Client Adam (or AMSGrad with ``amsgrad=True``), coupled L2 weight decay."""
    parts = []
    if not is_zero(as_schedule(weight_decay, "weight_decay")):
        parts.append(add_decayed_weights(weight_decay))
    parts.append(scale_by_adam(b1, b2, eps, amsgrad=amsgrad, bias_correction=bias_correction))
    parts.append(scale_by_learning_rate(lr))
    return chain(*parts)
