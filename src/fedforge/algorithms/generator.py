"""FedGen's conditional generator G(z | y), written as pure functions of its tensors.

As in the official code (zhuangdizhu/FedGen ``FLAlgorithms/trainmodel/generator.py``):
the input is uniform noise ``ε ~ U(0, 1)^noise_dim`` concatenated with the one-hot label,
then ``Linear -> BatchNorm1d -> ReLU -> Linear`` to a latent of the head's input width. The
generator lives in the server state, so it is written as functions of a dict of tensors
rather than a module: the server trains it, every client runs it frozen, and checkpoints
store it like any other server tensor. Batch normalisation uses the batch's statistics while
the server trains (updating running statistics, momentum 0.1, as ``nn.BatchNorm1d``) and the
running statistics on the clients (the code's ``generative_model.eval()``).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from fedforge.core.moments import ema, ema_sq

BN_EPS, BN_MOMENTUM = 1e-5, 0.1
ADAM_B1, ADAM_B2, ADAM_EPS = 0.9, 0.999, 1e-8  # the code's torch.optim.Adam


def init_generator(noise_dim: int, num_classes: int, hidden: int, latent: int, seed: int,
                   like: torch.Tensor) -> dict:
    """``{"params", "stats"}``: weights drawn as ``nn.Linear`` draws them (U(±1/√fan_in)),
    from a generator seeded by ``seed``, in ``like``'s dtype and device; BN scale 1, shift 0,
    running mean 0, variance 1."""
    g = torch.Generator().manual_seed(int(seed))

    def linear(fan_in: int, fan_out: int) -> tuple[torch.Tensor, torch.Tensor]:
        bound = 1.0 / math.sqrt(fan_in)
        w = (torch.rand(fan_out, fan_in, generator=g, dtype=torch.float64) * 2 - 1) * bound
        b = (torch.rand(fan_out, generator=g, dtype=torch.float64) * 2 - 1) * bound
        return w.to(like), b.to(like)

    fc_w, fc_b = linear(noise_dim + num_classes, hidden)
    out_w, out_b = linear(hidden, latent)
    ones, zeros = torch.ones(hidden).to(like), torch.zeros(hidden).to(like)
    return {"params": {"fc.weight": fc_w, "fc.bias": fc_b, "bn.weight": ones.clone(),
                       "bn.bias": zeros.clone(), "out.weight": out_w, "out.bias": out_b},
            "stats": {"mean": zeros.clone(), "var": ones.clone()}}


def generate(params: dict, stats: dict, labels: torch.Tensor, eps: torch.Tensor,
             train: bool) -> tuple[torch.Tensor, dict]:
    """``(z [B, latent], running statistics after this batch)`` for ``labels`` ``[B]`` and
    noise ``eps`` ``[B, noise_dim]``; ``train``: normalise by the batch (and update the
    running statistics), else by the running statistics (which then stay)."""
    num_classes = params["fc.weight"].shape[1] - eps.shape[-1]
    classes = torch.arange(num_classes, device=labels.device)
    onehot = (labels.unsqueeze(-1) == classes).to(eps.dtype)  # vmappable, unlike F.one_hot
    h = F.linear(torch.cat([eps, onehot], dim=-1), params["fc.weight"], params["fc.bias"])
    if train:
        mean, var = h.mean(0), h.var(0, unbiased=False)
        n = h.shape[0]
        stats = {"mean": (1 - BN_MOMENTUM) * stats["mean"] + BN_MOMENTUM * mean.detach(),
                 "var": (1 - BN_MOMENTUM) * stats["var"]
                 + BN_MOMENTUM * var.detach() * n / max(n - 1, 1)}
    else:
        mean, var = stats["mean"], stats["var"]
    h = (h - mean) / torch.sqrt(var + BN_EPS) * params["bn.weight"] + params["bn.bias"]
    return F.linear(F.relu(h), params["out.weight"], params["out.bias"]), stats


def diversity_loss(eps: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    """The code's ``DiversityLoss('l1')``: ``exp(−mean_ij(d_ε(i, j) · d_z(i, j)))`` with
    ``d_z`` the mean absolute and ``d_ε`` the mean squared difference of rows i and j: small
    when different noise gives different latents."""
    dz = (z.unsqueeze(0) - z.unsqueeze(1)).abs().mean(-1)
    de = ((eps.unsqueeze(0) - eps.unsqueeze(1)) ** 2).mean(-1)
    return torch.exp(-(de * dz).mean())


def adam_step(params: dict, grads: dict, opt: dict, lr: float, weight_decay: float) -> tuple:
    """One step of ``torch.optim.Adam(lr, betas=(0.9, 0.999), eps=1e-8, weight_decay)``
    (weight decay added to the gradient, bias-corrected moments): ``(params, opt)``."""
    grads = {k: g + weight_decay * params[k] for k, g in grads.items()}
    count = opt["count"] + 1
    m, v = ema(opt["m"], grads, ADAM_B1), ema_sq(opt["v"], grads, ADAM_B2)
    c1, c2 = 1 - ADAM_B1 ** count, 1 - ADAM_B2 ** count
    new = {k: p - lr * (m[k] / c1) / (torch.sqrt(v[k] / c2) + ADAM_EPS)
           for k, p in params.items()}
    return new, {"m": m, "v": v, "count": count}


def adam_init(params: dict) -> dict:
    """Adam's zero moments and step count for the generator's weights."""
    ref = next(iter(params.values()))
    return {"m": {k: torch.zeros_like(p) for k, p in params.items()},
            "v": {k: torch.zeros_like(p) for k, p in params.items()},
            "count": torch.zeros((), dtype=ref.dtype, device=ref.device)}
