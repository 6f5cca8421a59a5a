"""FedNAR: weight decay co-clipped with the gradient (Li et al., "FedNAR: Federated
Optimization with Normalized Annealing Regularization", NeurIPS 2023).

A local step of client ``i`` in round ``t``, with ``g`` the gradient of the backbone's local
loss (mini-batch gradient plus, where the backbone has them, FedProx's ``mu (x - x^t)`` and
SCAFFOLD's ``c - c_i``, all of which the official code puts in the loss)::

    NAR:      x <- x - l_t * clip_A(g + λ_t x)          (decay inside the clip)
    vanilla:  x <- x - l_t * (clip_A(g) + λ_t x)        (decay added after clipping g)

with ``clip_A(v) = v * min(1, A / ||v||)``. In the paper's notation the per-step decay is
``u_t = l_t λ_t`` and the step is ``x <- (1 - μ_t(g, x)) x - λ_t(g, x) g`` with (Eqs. 21-22)::

    λ_t(g, x) = l_t * min(1, A / ||g + (u_t / l_t) x||),   μ_t(g, x) = u_t * min(1, A / ||.||)

so every NAR step has norm ``<= l_t * A``. The annealing of the official code is
``l_t = η_l γ^t`` (an exponential learning-rate schedule) with a constant ``λ``, hence
``u_t = λ η_l γ^t`` decays exponentially as Theorem 2 requires. Both ``lr`` and
``weight_decay`` (and ``A``) accept any :mod:`fedforge.core.schedules` schedule.
"""

from __future__ import annotations

import torch

from fedforge.client.transforms import (
    Transform,
    add_decayed_weights,
    at_round,
    chain,
    clip_by_global_norm,
    scale_by_learning_rate,
    trace,
)
from fedforge.core.schedules import ScheduleLike, as_optional_schedule, as_schedule, is_zero
from fedforge.core.tree import Params, tree_sq_norm

DEFAULT_MAX_GRAD_NORM = 10.0  # A of the official FedNAR code (never overridden by its scripts)


def clipped_sgd(
    lr: ScheduleLike,
    weight_decay: ScheduleLike = 0.0,
    max_grad_norm: ScheduleLike | None = None,
    momentum: float = 0.0,
    *,
    nar: bool = False,
    nesterov: bool = False,
) -> Transform:
    """Local SGD with gradient clipping and weight decay, FedNAR-style (``nar=True``) or not.

    ``nar=False``: ``g -> clip_A(g) + λ_t x`` (``torch.nn.utils.clip_grad_norm_`` followed by
    ``torch.optim.SGD(weight_decay=λ)``, the paper's baseline); without ``max_grad_norm`` this
    is plain SGD with L2 decay. ``nar=True``: ``g -> clip_A(g + λ_t x)``; ``max_grad_norm``
    defaults to A = 10. Momentum (heavy ball, after the clip) and ``-l_t`` come last; with
    momentum β the per-step bound becomes ``l_t A / (1 - β)``.
    """
    wd = as_schedule(weight_decay, "weight_decay")
    clip = as_optional_schedule(max_grad_norm, "max_grad_norm")
    if nar and clip is None:
        clip = as_schedule(DEFAULT_MAX_GRAD_NORM)
    parts = []
    if nar:
        if not is_zero(wd):
            parts.append(add_decayed_weights(wd))
        parts.append(clip_by_global_norm(clip))
    else:
        if clip is not None:
            parts.append(clip_by_global_norm(clip))
        if not is_zero(wd):
            parts.append(add_decayed_weights(wd))
    if momentum:
        parts.append(trace(momentum, nesterov))
    parts.append(scale_by_learning_rate(lr))
    return chain(*parts)


def nar(
    lr: ScheduleLike,
    weight_decay: ScheduleLike,
    max_grad_norm: ScheduleLike = DEFAULT_MAX_GRAD_NORM,
) -> Transform:
    """The FedNAR local step ``x <- x - l_t clip_A(g + λ_t x)`` as a transform."""
    return clipped_sgd(lr, weight_decay, max_grad_norm, nar=True)


def nar_coefficients(
    g: Params, x: Params, lr: float | torch.Tensor, weight_decay: float | torch.Tensor,
    max_grad_norm: float | torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(λ_t(g, x), μ_t(g, x))`` of the appendix's Eqs. (21)-(22) with ``u_t = l_t λ``.

    The NAR step equals ``-λ_t(g, x) g - μ_t(g, x) x``.
    """
    v = {k: g[k] + weight_decay * x[k] for k in g}
    norm = tree_sq_norm(v).sqrt()
    factor = torch.clamp(max_grad_norm / (norm + 1e-12), max=1.0)
    return lr * factor, lr * weight_decay * factor


__all__ = ["DEFAULT_MAX_GRAD_NORM", "at_round", "clipped_sgd", "nar", "nar_coefficients"]
