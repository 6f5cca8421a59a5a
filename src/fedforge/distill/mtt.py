"""Matching Training Trajectories (MTT, Cazenavette et al. 2022), as FedPTR's Algorithm 1 uses it.

A synthetic set D̃ (inputs ``syn_x`` with fixed hard labels ``syn_y``) and a learnable student
lr β are optimised so that R full-batch gradient-descent steps on D̃, started at ``w_start``,
land near ``w_end``::

    ŵ_0 = w_start,   ŵ_{r+1} = ŵ_r - β ∇L(ŵ_r; D̃)          (r < R)
    L_MTT(D̃, β) = ||ŵ_R - w_end||² / ||w_end - w_start||²    (sums over every parameter)

and ``(syn_x, β)`` take H outer SGD-with-momentum steps on ``∇L_MTT`` — the gradient flows
through the unrolled student steps (``torch.func.grad`` of a function that itself calls
``torch.func.grad``). Everything runs eagerly on one set; FedPTR calls it per client, outside
the vmapped local round.

Defaults not given by the FedPTR paper are MTT's public defaults (images: SGD lr 1000,
momentum 0.5; β: SGD lr 1e-5, momentum 0.5; full-batch student). Momentum buffers start at
zero on every call (the warm start across rounds is of ``syn_x`` and β only).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch

from fedforge.core.tree import Params

LossFn = Callable[[Params, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
Augment = Callable[[torch.Tensor, int], torch.Tensor]


class MTTResult(NamedTuple):
    syn_x: torch.Tensor  # updated synthetic inputs (detached)
    syn_lr: torch.Tensor  # updated student lr β (0-d, detached)
    losses: list[float]  # L_MTT before each of the H outer steps


def student_descent(
    loss_fn: LossFn,
    params: Params,
    syn_x: torch.Tensor,
    syn_y: torch.Tensor,
    lr: torch.Tensor | float,
    steps: int,
    augment: Augment | None = None,
) -> Params:
    """``steps`` full-batch GD steps on ``(syn_x, syn_y)``; differentiable in every input."""
    w = torch.ones(syn_y.shape, dtype=syn_x.dtype, device=syn_x.device)  # [n] all real
    grad = torch.func.grad(lambda p, x: loss_fn(p, x, syn_y, w))
    for r in range(steps):
        g = grad(params, augment(syn_x, r) if augment is not None else syn_x)
        params = {k: params[k] - lr * g[k] for k in params}
    return params


def sq_dist(a: Params, b: Params) -> torch.Tensor:
    return sum(((a[k] - b[k]) ** 2).sum() for k in a)  # type: ignore[return-value]


def matching_loss(
    loss_fn: LossFn,
    w_start: Params,
    w_end: Params,
    syn_x: torch.Tensor,
    syn_y: torch.Tensor,
    syn_lr: torch.Tensor,
    inner_steps: int,
    augment: Augment | None = None,
) -> torch.Tensor:
    """``||ŵ_R - w_end||² / ||w_end - w_start||²`` (Algorithm 1's L_MTT)."""
    w_hat = student_descent(loss_fn, w_start, syn_x, syn_y, syn_lr, inner_steps, augment)
    return sq_dist(w_hat, w_end) / sq_dist(w_end, w_start).clamp_min(1e-30)


def match_trajectory(
    loss_fn: LossFn,
    w_start: Params,
    w_end: Params,
    syn_x: torch.Tensor,
    syn_y: torch.Tensor,
    syn_lr: torch.Tensor | float = 0.01,
    *,
    outer_steps: int = 20,
    inner_steps: int = 10,
    lr_img: float = 1000.0,
    lr_lr: float = 1e-5,
    momentum: float = 0.5,
    augment: Augment | None = None,
) -> MTTResult:
    """Algorithm 1: H = ``outer_steps`` updates of ``(syn_x, β)`` on L_MTT (R = ``inner_steps``).

    Args:
      loss_fn: ``loss_fn(params, x, y, w)`` of the model (e.g. masked cross-entropy).
      w_start, w_end: the trajectory segment to match (FedPTR: w^{t-m} and w^t).
      syn_x, syn_y: synthetic inputs (optimised) and their fixed hard labels.
      syn_lr: the student lr β (optimised; FedPTR initialises it to 0.01).
      lr_img, lr_lr, momentum: SGD on ``syn_x`` and on β (MTT's public defaults).
      augment: optional differentiable augmentation ``augment(x, r)`` applied to the
        synthetic batch at student step r (off by default; see :mod:`fedforge.distill.augment`).

    A segment with ``w_end == w_start`` carries no signal: the inputs are returned unchanged.
    """
    w_start = {k: v.detach() for k, v in w_start.items()}
    w_end = {k: v.detach() for k, v in w_end.items()}
    x = syn_x.detach().clone()
    lr = torch.as_tensor(syn_lr, dtype=x.dtype, device=x.device).detach().clone()
    if float(sq_dist(w_end, w_start)) == 0.0:
        return MTTResult(x, lr, [])

    def objective(sx, slr, h):
        aug = None if augment is None else (lambda a, r: augment(a, h * inner_steps + r))
        return matching_loss(loss_fn, w_start, w_end, sx, syn_y, slr, inner_steps, aug)

    grad_fn = torch.func.grad_and_value(objective, argnums=(0, 1))
    buf_x, buf_lr = torch.zeros_like(x), torch.zeros_like(lr)
    losses = []
    for h in range(outer_steps):
        (g_x, g_lr), loss = grad_fn(x, lr, h)
        losses.append(float(loss))
        if not (torch.isfinite(loss) and torch.isfinite(g_x).all() and torch.isfinite(g_lr)):
            raise FloatingPointError(
                f"trajectory matching diverged at outer step {h} (L_MTT = {float(loss)}); "
                "lower algorithm.lr_img / algorithm.lr_lr or algorithm.inner_steps"
            )
        buf_x = momentum * buf_x + g_x  # torch.optim.SGD momentum, no dampening
        buf_lr = momentum * buf_lr + g_lr
        x = (x - lr_img * buf_x).detach()
        lr = (lr - lr_lr * buf_lr).detach()
    return MTTResult(x, lr, losses)
