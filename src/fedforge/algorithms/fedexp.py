"""FedExP (Jhunjhunwala, Wang & Joshi, "FedExP: Speeding Up Federated Averaging via
Extrapolation", ICLR 2023): FedAvg local steps, an adaptive server step size.

With ``Δ_i = x - x_i`` and ``Δ̄`` their (aggregation-weighted) mean over the S sampled clients::

    η_g = max(1, ½ · mean_i ||Δ_i||² / (||Δ̄||² + S ε)),      x <- x - η_g Δ̄

and the model is *evaluated* at the average of the last two iterates ``(x^{t+1} + x^t) / 2``
(at ``x^1`` after round 1, as the FedExP/FedNAR code does). The mean of ``||Δ_i||²`` is a
uniform mean over the cohort (equal to the code's data-size weighting on equal-sized clients).
If every ``Δ_i`` is zero (and ε = 0) the step size is 1.

The step is the server stage :func:`extrapolation` (state ``server["opt"]``); its evaluation
point is the chain's ``eval_params``, and training continues from ``x^{t+1}``.
"""

from __future__ import annotations

import torch

from fedforge.algorithms.defaults import defaults_from, table_value
from fedforge.client.optimizers import local_optimizer
from fedforge.core.schedules import ScheduleLike, as_schedule, value_at
from fedforge.core.tree import Params, tree_clone, tree_map2, tree_sq_norm
from fedforge.protocol.algorithm import Algorithm, FinalizeInputs, Part
from fedforge.server.chain import ServerTransform


class ExtrapolationStats(Part):
    """Uploads each client's ``||Δ_i||²`` (one scalar besides the delta)."""

    name = "fedexp"
    uplink_models = 0.0  # one scalar besides the delta

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


_EPS = table_value("fedexp", "eps")  # the stage alone defaults to FedExP's ε


def extrapolation(eps: ScheduleLike = _EPS) -> ServerTransform:
    """FedExP's server stage: ``x <- x - η_g Δ̄``; evaluated at ``(x^{t} + x^{t-1}) / 2``.

    State: ``prev`` (the iterate before the last step), ``round`` (server steps done) and
    ``eta_g`` (the last step size, for logs).
    """
    eps = as_schedule(eps, "eps")

    def init(params):
        return {"prev": tree_clone(params), "round": torch.zeros((), dtype=torch.float64),
                "eta_g": torch.ones((), dtype=torch.float64)}

    def update(params, agg, state):
        t = state["round"] + 1
        sq = agg.uploads["fedexp"]["sq_norm"]
        eta = fedexp_step_size(sq, agg.delta, agg.num_sampled, value_at(eps, t))
        new_params = tree_map2(lambda p, d: p - eta.to(p.dtype) * d, params, agg.delta)
        return new_params, agg, {"prev": tree_clone(params), "round": t,
                                 "eta_g": eta.to(torch.float64)}

    def eval_params(params, state):
        """``(x^{t} + x^{t-1}) / 2`` after round ``t >= 2``, else ``x^t``."""
        later = state["round"] >= 2
        return {k: torch.where(later, 0.5 * (params[k] + state["prev"][k]), params[k])
                for k in params}

    return ServerTransform("opt", init, update, eval_params)


@defaults_from("fedexp")
def fedexp(
    local_lr: ScheduleLike, eps: ScheduleLike, client_optimizer: str,
    weight_decay: ScheduleLike, max_grad_norm: ScheduleLike | None, nar: bool,
) -> Algorithm:
    """FedExP; ``eps`` is the ε of ``S ε`` (the FedNAR release scripts pass 0)."""
    return Algorithm(
        "fedexp",
        local_optimizer(client_optimizer, local_lr, weight_decay=weight_decay,
                        max_grad_norm=max_grad_norm, nar=nar),
        extrapolation(eps),
        parts=(ExtrapolationStats(),),
        description="FedExP (Jhunjhunwala et al. 2023): adaptive server extrapolation step",
    )
