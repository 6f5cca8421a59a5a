"""SCAFFOLD (Karimireddy et al., "SCAFFOLD: Stochastic Controlled Averaging for Federated
Learning", ICML 2020), Algorithm 1 with option II control variates.

Local step: ``x_i <- x_i - η_l (g_i(x_i) + c - c_i)``.
Option II:  ``c_i+ = c_i - c + (x - x_i) / (K η_l)`` with K the steps this client took.
Server:     ``x <- x + η_g mean_i (x_i - x)``,  ``c <- c + (|S|/N) mean_i (c_i+ - c_i)``.
"""

from __future__ import annotations

import torch

from fedforge.algorithms.base import Algorithm, FinalizeInputs, Part
from fedforge.client.optimizers import local_optimizer
from fedforge.client.transforms import add_correction, chain
from fedforge.core.tree import Params, tree_add, tree_zeros_like
from fedforge.server.optimizers import server_sgd


class ControlVariates(Part):
    """SCAFFOLD's c (server) and c_i (client); uploads ``dc = c_i+ - c_i``."""

    name = "scaffold"
    uplink_models = 1.0  # dc travels beside the delta

    def __init__(self, local_lr: float) -> None:
        self.local_lr = local_lr

    def client_init(self, params: Params) -> dict:
        return {"c": tree_zeros_like(params)}

    def server_init(self, params: Params) -> dict:
        return {"c": tree_zeros_like(params)}

    def broadcast(self, server_state: dict) -> dict:
        return {"c": server_state["c"]}

    def finalize(self, fin: FinalizeInputs) -> tuple[dict, dict]:
        ci, c = fin.ctx.client_state[self.name]["c"], fin.ctx.broadcast[self.name]["c"]
        steps = fin.num_steps
        scale = 1.0 / (steps.clamp_min(1.0) * self.local_lr)
        trained = steps > 0  # a client with no data keeps its c_i
        new_ci = {k: torch.where(trained, ci[k] - c[k] + fin.delta[k] * scale, ci[k]) for k in ci}
        return {"c": new_ci}, {"dc": {k: new_ci[k] - ci[k] for k in ci}}

    def server_update(self, server_state, mean_uploads, num_sampled, num_clients) -> dict:
        frac = num_sampled / num_clients
        return {"c": tree_add(server_state["c"], mean_uploads["dc"], alpha=frac)}


def scaffold(
    local_lr: float = 0.01, server_lr: float = 1.0, weight_decay: float = 0.0
) -> Algorithm:
    return Algorithm(
        "scaffold",
        chain(
            add_correction("scaffold", "c", "c"),
            local_optimizer("sgd", local_lr, weight_decay=weight_decay),
        ),
        server_sgd(server_lr),
        parts=(ControlVariates(local_lr),),
        description="SCAFFOLD (Karimireddy et al. 2020): control variates, option II",
    )
