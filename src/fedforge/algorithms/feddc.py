"""FedDC (Gao et al., "FedDC: Federated Learning with Non-IID Data via Local Drift Decoupling
and Correction", CVPR 2022).

Client i keeps a drift h_i and a gradient-correction state G_i (SCAFFOLD-like; server G).
Local gradient of ``L_i(θ) + (α/2)||θ + h_i - w||² + <θ, G - G_i>``::

    ∇L_i(θ) + α (θ + h_i - w) + G - G_i

After K local steps with lr η: ``h_i <- h_i + (θ_i - w)`` and
``G_i+ = G_i - G + (w - θ_i)/(K η)``. Server: ``G <- G + (1/N) Σ_{i∈P} (G_i+ - G_i)`` and
``w <- mean_{i∈P} θ_i + mean_{all i} h_i``. The server tracks ``h̄ = mean_all h_i`` as
``h̄ <- h̄ - (|P|/N) mean_P delta_i`` (only participants' h_i change), so
``w <- w - mean delta + h̄``. Aggregation weights as in :mod:`fedforge.algorithms.feddyn`.
"""

from __future__ import annotations

from fedforge.algorithms.defaults import defaults_from
from fedforge.client.control_variates import option_ii
from fedforge.client.optimizers import local_optimizer
from fedforge.client.transforms import Transform, _stateless, at_round, chain
from fedforge.core.schedules import ScheduleLike, as_schedule
from fedforge.core.tree import Params, tree_add, tree_sub, tree_zeros_like
from fedforge.protocol.algorithm import Algorithm, FinalizeInputs, Part
from fedforge.server.chain import population_mean_step
from fedforge.server.optimizers import server_sgd


def add_drift_correction(alpha: float) -> Transform:
    """``g -> g + α (θ + h_i - w) + G - G_i``."""

    def fn(g, p, ctx):
        st, G = ctx.client_state["feddc"], ctx.broadcast["feddc"]["G"]
        w = ctx.global_params
        return {k: g[k] + alpha * (p[k] + st["h"][k] - w[k]) + G[k] - st["G"][k] for k in g}

    return _stateless("feddc_reg", fn)


class DriftCorrection(Part):
    """FedDC's h_i, G_i (clients), G and h̄ = mean_all h_i (server)."""

    name = "feddc"
    uplink_models = 1.0  # dG travels beside the delta

    def __init__(self, local_lr: ScheduleLike) -> None:
        self.local_lr = as_schedule(local_lr, "local_lr")

    def client_init(self, params: Params) -> dict:
        return {"h": tree_zeros_like(params), "G": tree_zeros_like(params)}

    def server_init(self, params: Params) -> dict:
        return {"G": tree_zeros_like(params), "hbar": tree_zeros_like(params)}

    def broadcast(self, server_state: dict) -> dict:
        return {"G": server_state["G"]}

    def finalize(self, fin: FinalizeInputs) -> tuple[dict, dict]:
        st, G = fin.ctx.client_state[self.name], fin.ctx.broadcast[self.name]["G"]
        # SCAFFOLD's option II; a client with no data keeps G_i (its delta, so dh, is 0)
        new_g = option_ii(st["G"], G, fin.delta, fin.num_steps, at_round(self.local_lr, fin.ctx))
        new_h = tree_sub(st["h"], fin.delta)  # h_i + (θ_i - w)
        uploads = {"dG": tree_sub(new_g, st["G"]), "delta": fin.delta}
        return {"h": new_h, "G": new_g}, uploads

    def server_update(self, server_state, mean_uploads, agg) -> dict:
        return {
            "G": population_mean_step(server_state["G"], mean_uploads["dG"], agg),
            "hbar": population_mean_step(server_state["hbar"], mean_uploads["delta"], agg,
                                         scale=-1.0),
        }

    def adjust_params(self, params: Params, server_state: dict) -> Params:
        return tree_add(params, server_state["hbar"])


@defaults_from("feddc")
def feddc(
    local_lr: ScheduleLike, alpha: float, client_optimizer: str, local_momentum: float,
    weight_decay: ScheduleLike,
) -> Algorithm:
    """FedDC with drift-penalty coefficient α >= 0."""
    if alpha < 0:
        raise ValueError(f"algorithm.alpha: expected alpha >= 0, got {alpha}")
    return Algorithm(
        "feddc",
        chain(
            add_drift_correction(alpha),
            local_optimizer(
                client_optimizer, local_lr, momentum=local_momentum, weight_decay=weight_decay
            ),
        ),
        server_sgd(1.0),
        parts=(DriftCorrection(local_lr),),
        description="FedDC (Gao et al. 2022): local drift h_i + SCAFFOLD-style correction",
        hparams={"alpha": alpha},
    )
