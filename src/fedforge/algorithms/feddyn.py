"""FedDyn (Acar et al., "Federated Learning Based on Dynamic Regularization", ICLR 2021).

Client i (state g_i = ∇L_i(θ_i^{t-1}), zero at start) minimises
``L_i(θ) - <g_i, θ> + (α/2) ||θ - θ^{t-1}||²``, i.e. local gradient
``∇L_i(θ) - g_i + α(θ - θ^{t-1})``, then ``g_i <- g_i - α (θ_i^t - θ^{t-1})``.
Server (state h, zero at start)::

    h   <- h - (α/N) Σ_{i∈P} (θ_i^t - θ^{t-1})
    θ^t  = mean_{i∈P} θ_i^t - h/α

With ``delta_i = θ^{t-1} - θ_i^t`` this is ``g_i += α delta_i``, ``h += α (|P|/N) mean_P delta``
and ``θ^t = θ^{t-1} - mean delta - h/α``. The ``mean delta`` is the run's aggregation
(``server.aggregation``; the paper's is uniform); h always uses the uniform cohort mean. A
client with no data has delta 0 and keeps g_i.
"""

from __future__ import annotations

from fedforge.algorithms.defaults import defaults_from
from fedforge.client.optimizers import local_optimizer
from fedforge.client.transforms import Transform, _stateless, chain
from fedforge.core.schedules import ScheduleLike
from fedforge.core.tree import Params, tree_add, tree_zeros_like
from fedforge.protocol.algorithm import Algorithm, FinalizeInputs, Part
from fedforge.server.chain import population_mean_step
from fedforge.server.optimizers import server_sgd


def add_dynamic_regularizer(alpha: float) -> Transform:
    """``g -> g - g_i + α (θ - θ^{t-1})`` (gradient of FedDyn's local objective)."""
    return _stateless(
        "feddyn_reg",
        lambda g, p, ctx: {
            k: g[k] - ctx.client_state["feddyn"]["grad"][k] + alpha * (p[k] - ctx.global_params[k])
            for k in g
        },
    )


class DynamicRegularizer(Part):
    """FedDyn's per-client linear term g_i and the server's h (uploads a copy of the delta)."""

    name = "feddyn"

    def __init__(self, alpha: float) -> None:
        self.alpha = alpha

    def client_init(self, params: Params) -> dict:
        return {"grad": tree_zeros_like(params)}

    def server_init(self, params: Params) -> dict:
        return {"h": tree_zeros_like(params)}

    def finalize(self, fin: FinalizeInputs) -> tuple[dict, dict]:
        g = fin.ctx.client_state[self.name]["grad"]
        return {"grad": tree_add(g, fin.delta, alpha=self.alpha)}, {"delta": fin.delta}

    def server_update(self, server_state, mean_uploads, agg) -> dict:
        return {"h": population_mean_step(server_state["h"], mean_uploads["delta"], agg,
                                          scale=self.alpha)}

    def adjust_params(self, params: Params, server_state: dict) -> Params:
        return tree_add(params, server_state["h"], alpha=-1.0 / self.alpha)


@defaults_from("feddyn")
def feddyn(
    local_lr: ScheduleLike, alpha: float, client_optimizer: str, local_momentum: float,
    weight_decay: ScheduleLike,
) -> Algorithm:
    """FedDyn with coefficient α > 0 (the paper tunes it over {0.1, 0.01, 0.001})."""
    if alpha <= 0:
        raise ValueError(f"algorithm.alpha: expected alpha > 0, got {alpha}")
    return Algorithm(
        "feddyn",
        chain(
            add_dynamic_regularizer(alpha),
            local_optimizer(
                client_optimizer, local_lr, momentum=local_momentum, weight_decay=weight_decay
            ),
        ),
        server_sgd(1.0),
        parts=(DynamicRegularizer(alpha),),
        description="FedDyn (Acar et al. 2021): dynamic linear + prox regularizer, server h",
        hparams={"alpha": alpha},
    )
