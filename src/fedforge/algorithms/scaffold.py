"""SCAFFOLD (Karimireddy et al., "SCAFFOLD: Stochastic Controlled Averaging for Federated
Learning", ICML 2020), Algorithm 1 with option II control variates.

Local step: ``x_i <- x_i - η_l (g_i(x_i) + c - c_i)``.
Option II:  ``c_i+ = c_i - c + (x - x_i) / (K η_l)`` with K the steps this client took
            (η_l is the local lr of the round when it is a schedule).
Server:     ``x <- x + η_g mean_i (x_i - x)``,  ``c <- c + (|S|/N) mean_i (c_i+ - c_i)``.
"""

from __future__ import annotations

from fedforge.algorithms.defaults import defaults_from
from fedforge.client.control_variates import option_ii
from fedforge.client.optimizers import local_optimizer
from fedforge.client.transforms import add_correction, at_round, chain
from fedforge.core.schedules import ScheduleLike, as_schedule
from fedforge.core.tree import Params, tree_zeros_like
from fedforge.protocol.algorithm import Algorithm, FinalizeInputs, Part
from fedforge.server.chain import population_mean_step
from fedforge.server.optimizers import server_sgd


class ControlVariates(Part):
    """SCAFFOLD's c (server) and c_i (client); uploads ``dc = c_i+ - c_i``."""

    name = "scaffold"
    uplink_models = 1.0  # dc travels beside the delta

    def __init__(self, local_lr: ScheduleLike) -> None:
        self.local_lr = as_schedule(local_lr, "local_lr")

    def client_init(self, params: Params) -> dict:
        return {"c": tree_zeros_like(params)}

    def server_init(self, params: Params) -> dict:
        return {"c": tree_zeros_like(params)}

    def broadcast(self, server_state: dict) -> dict:
        return {"c": server_state["c"]}

    def finalize(self, fin: FinalizeInputs) -> tuple[dict, dict]:
        ci, c = fin.ctx.client_state[self.name]["c"], fin.ctx.broadcast[self.name]["c"]
        new_ci = option_ii(ci, c, fin.delta, fin.num_steps, at_round(self.local_lr, fin.ctx))
        return {"c": new_ci}, {"dc": {k: new_ci[k] - ci[k] for k in ci}}

    def server_update(self, server_state, mean_uploads, agg) -> dict:
        return {"c": population_mean_step(server_state["c"], mean_uploads["dc"], agg)}


@defaults_from("scaffold")
def scaffold(
    local_lr: ScheduleLike, server_lr: ScheduleLike, weight_decay: ScheduleLike,
    max_grad_norm: ScheduleLike | None, nar: bool,
) -> Algorithm:
    """SCAFFOLD; with ``max_grad_norm``/``nar`` the correction ``c - c_i`` sits inside the clip
    (it is part of the local loss's gradient, as in the FedNAR code)."""
    return Algorithm(
        "scaffold",
        chain(
            add_correction("scaffold", "c", "c"),
            local_optimizer("sgd", local_lr, weight_decay=weight_decay,
                            max_grad_norm=max_grad_norm, nar=nar),
        ),
        server_sgd(server_lr),
        parts=(ControlVariates(local_lr),),
        description="SCAFFOLD (Karimireddy et al. 2020): control variates, option II",
    )
