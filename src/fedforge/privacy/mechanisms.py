"""The privacy mechanisms as pure tensor functions (vmappable, no RNG state).

Clipping scales a whole pytree to L2 norm at most C. Noise inside a client's local round
(local DP, DP-SGD) comes from :mod:`fedforge.comm.rng`'s counter-based Gaussians keyed by a
per-client key drawn from the round's generator, so the loop and vmap engines add exactly
the same noise and a resumed run draws what an uninterrupted one would. That hash is a
simulation device, not a cryptographic generator: a deployment must draw its noise from a
secure source (``docs/privacy.md``).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from fedforge.comm.rng import mix32, normal
from fedforge.core.tree import Params, tree_sq_norm


def clip_tree(tree: Params, clip: torch.Tensor | float) -> tuple[Params, torch.Tensor]:
    """``tree · min(1, C / ‖tree‖)`` and ``‖tree‖`` (the norm before clipping)."""
    norm = tree_sq_norm(tree).sqrt()
    scale = torch.clamp(clip / norm.clamp_min(1e-12), max=1.0)
    return {k: v * scale.to(v.dtype) for k, v in tree.items()}, norm


def noise_like(tree: Params, key: torch.Tensor, stream: int | torch.Tensor) -> Params:
    """Standard normal noise shaped like ``tree``: leaf j of ``stream`` under ``key``."""
    out = {}
    for j, (name, v) in enumerate(tree.items()):
        leaf_key = mix32(mix32(key * 0x9E3779B1 + stream) + j * 0x85EBCA6B)
        idx = torch.arange(v.numel(), device=v.device)
        out[name] = normal(leaf_key, idx, v.dtype).reshape(v.shape)
    return out


def add_noise(tree: Params, std: torch.Tensor | float, key: torch.Tensor,
              stream: int | torch.Tensor) -> Params:
    """``tree + std · N(0, I)`` with the counter-based noise of :func:`noise_like`."""
    noise = noise_like(tree, key, stream)
    return {k: v + std * noise[k] for k, v in tree.items()}


def dp_sgd_grad(loss_fn: Callable, clip: float, sigma: float) -> Callable:
    """DP-SGD's gradient (Abadi et al. 2016) with the signature of ``grad_and_value``
    plus ``(key, step)``: per-sample gradients under ``vmap``, each clipped to ``clip``,
    summed, plus ``N(0, σ²C²)``, divided by the batch size B (padding rows count in B and
    contribute zero, so the sensitivity of the mean is C/B for every step)."""
    per_sample = torch.func.vmap(torch.func.grad_and_value(_one_sample(loss_fn)),
                                 in_dims=(None, 0, 0, 0))

    def grad_and_loss(params, x, y, w, key, step):
        grads, losses = per_sample(params, x, y, w)  # leaves [B, ...], [B]
        sq = sum(g.reshape(g.shape[0], -1).pow(2).sum(1) for g in grads.values())  # [B]
        scale = torch.clamp(clip / sq.sqrt().clamp_min(1e-12), max=1.0)
        summed = {k: torch.tensordot(scale.to(g.dtype), g, dims=1) for k, g in grads.items()}
        batch = x.shape[0]
        noisy = add_noise(summed, sigma * clip, key, step)
        loss = losses.sum() / w.sum().clamp_min(1.0)  # each is w_b · loss_b
        return {k: g / batch for k, g in noisy.items()}, loss

    return grad_and_loss


def _one_sample(loss_fn: Callable) -> Callable:
    """The run's masked-mean loss on one example (weight 0 or 1: its own loss, or 0)."""

    def loss(params, x, y, w):
        return loss_fn(params, x.unsqueeze(0), y.unsqueeze(0), w.unsqueeze(0))

    return loss
