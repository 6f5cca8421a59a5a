"""FedExP (Jhunjhunwala, Wang & Joshi, "FedExP: Speeding Up Federated Averaging via
Extrapolation", ICLR 2023): FedAvg local steps, an adaptive server step size.

With ``Δ_i = x - x_i`` and ``Δ̄`` their (aggregation-weighted) mean over the S sampled clients::

    η_g = max(1, ½ · mean_i ||Δ_i||² / (||Δ̄||² + S ε)),      x <- x - η_g Δ̄

and the model is *evaluated* at the average of the last two iterates ``(x^{t+1} + x^t) / 2``
(at ``x^1`` after round 1, as the FedExP/FedNAR code does). The mean of ``||Δ_i||²`` is a
uniform mean over the cohort (equal to the code's data-size weighting on equal-sized clients).
If every ``Δ_i`` is zero (and ε = 0) the step size is 1.

Server state ``parts["fedexp"]``: ``prev`` (``x^t``, the iterate before the last step),
``round`` (server steps done) and ``eta_g`` (the last step size, for logs). The evaluation
point is :meth:`FedExPAlgorithm.eval_params`, which the runner evaluates
(:func:`fedforge.experiment.runner.eval_params`); training continues from ``x^{t+1}``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fedforge.algorithms.base import Algorithm, FinalizeInputs, Part
from fedforge.client.optimizers import local_optimizer
from fedforge.core.schedules import ScheduleLike, as_schedule, value_at
from fedforge.core.tree import Params, tree_clone, tree_map2, tree_sq_norm
from fedforge.server.optimizers import ServerOptimizer


class ExtrapolationStats(Part):
    """Uploads each client's ``||Δ_i||²``; keeps the previous iterate for evaluation."""

    name = "fedexp"
    uplink_models = 0.0  # one scalar besides the delta

    def server_init(self, params: Params) -> dict:
        return {"prev": tree_clone(params), "round": torch.zeros((), dtype=torch.float64),
                "eta_g": torch.ones((), dtype=torch.float64)}

    def finalize(self, fin: FinalizeInputs) -> tuple[dict, dict]:
        return {}, {"sq_norm": tree_sq_norm(fin.delta)}


def fedexp_step_size(
    mean_sq_norm: torch.Tensor, mean_delta: Params, num_sampled: int, eps: float | torch.Tensor
) -> torch.Tensor:
    """``max(1, ½ mean_i ||Δ_i||² / (||Δ̄||² + S ε))``; 1 when the denominator is 0."""
    denom = tree_sq_norm(mean_delta) + num_sampled * eps
    safe = torch.where(denom > 0, denom, torch.ones_like(denom))
    ratio = torch.where(denom > 0, 0.5 * mean_sq_norm / safe, torch.ones_like(denom))
    return torch.clamp(ratio, min=1.0)


def _identity_server() -> ServerOptimizer:
    return ServerOptimizer("fedexp", lambda params: {}, lambda g, state, params: (g, state))


@dataclass(frozen=True)
class FedExPAlgorithm(Algorithm):
    eps: ScheduleLike = 1e-3

    def server_step(self, params, server_state, mean_delta, mean_uploads, num_sampled,
                    num_clients):
        part = server_state["parts"]["fedexp"]
        t = part["round"] + 1
        eps = value_at(as_schedule(self.eps, "eps"), t)
        sq = mean_uploads["fedexp"]["sq_norm"]
        eta = fedexp_step_size(sq, mean_delta, num_sampled, eps)
        new_params = tree_map2(lambda p, d: p - eta.to(p.dtype) * d, params, mean_delta)
        new_part = {"prev": tree_clone(params), "round": t, "eta_g": eta.to(torch.float64)}
        return new_params, {"opt": server_state["opt"], "parts": {"fedexp": new_part}}

    def eval_params(self, params: Params, server_state: dict) -> Params:
        """Where to evaluate: ``(x^{t} + x^{t-1}) / 2`` after round ``t >= 2``, else ``x^t``."""
        part = server_state["parts"]["fedexp"]
        later = part["round"] >= 2
        return {k: torch.where(later, 0.5 * (params[k] + part["prev"][k]), params[k])
                for k in params}


def fedexp(
    local_lr: ScheduleLike = 0.01, eps: ScheduleLike = 1e-3, client_optimizer: str = "sgd",
    weight_decay: ScheduleLike = 0.0, max_grad_norm: ScheduleLike | None = None,
    nar: bool = False,
) -> Algorithm:
    """FedExP; ``eps`` is the ε of ``S ε`` (1e-3 in the FedExP CIFAR configs; the FedNAR
    release scripts pass 0)."""
    return FedExPAlgorithm(
        "fedexp",
        local_optimizer(client_optimizer, local_lr, weight_decay=weight_decay,
                        max_grad_norm=max_grad_norm, nar=nar),
        _identity_server(),
        parts=(ExtrapolationStats(),),
        description="FedExP (Jhunjhunwala et al. 2023): adaptive server extrapolation step",
        eps=eps,
    )
