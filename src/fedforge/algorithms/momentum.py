"""FedAvg-M and SCAFFOLD-M with a broadcast global momentum (the FAdamGC paper's baselines).

Reference: Cheng, Huang, Wu & Yuan, "Momentum Benefits Non-IID Federated Learning Simply and
Provably", ICLR 2024 (arXiv 2306.16504), as summarised in ``docs/fadamgc.md``. The server
keeps and broadcasts a momentum ``g^t``; client i in round t runs, for k = 1..K::

    FedAvg-M:    x_i <- x_i - η_l (β g_i(x_i) + (1 - β) g^t)
    SCAFFOLD-M:  x_i <- x_i - η_l (β (g_i(x_i) - c_i + c) + (1 - β) g^t)

and the server sets ``g^{t+1} = mean_i (x^t - x_i) / (η_l K)`` and ``x^{t+1} = x^t - η_g mean_i
(x^t - x_i)`` (η_g = 1: plain averaging; Cheng's ``γ`` equals ``η_g η_l K``). SCAFFOLD-M's
control variates are the mean raw local gradients ``c_i = (1/K) Σ_k g_i^k`` of every sampled
client, ``c += (1/n) Σ_{i∈S} (c_i+ - c_i)`` (the FAdamGC tracking part with S̃ = S).

β weights the fresh gradient (β = 1 is FedAvg / SCAFFOLD). Not to be confused with
``fedavg_server_momentum`` (alias ``fedavgm``: server heavy-ball momentum, Hsu et al. 2019).
Registered as ``fedavg_global_momentum``, alias ``fedavg_m``. Choices (``docs/fadamgc.md``):
``g^1 = 0``; K per client is the number of steps it took; β's default is ours (the FAdamGC
paper gives no value; :mod:`fedforge.algorithms.defaults`).
"""

from __future__ import annotations

from fedforge.algorithms.defaults import defaults_from
from fedforge.algorithms.fadamgc import GradientTracking
from fedforge.client.transforms import Transform, add_correction, chain, scale_by_learning_rate
from fedforge.core.tree import Params, tree_zeros_like
from fedforge.protocol.algorithm import Algorithm, FinalizeInputs, Part
from fedforge.server.optimizers import server_sgd


class GlobalMomentum(Part):
    """Server momentum ``g`` broadcast to clients; ``g+ = mean_i (x^t - x_i) / (η_l K_i)``.

    The upload ``delta_i / (η_l K_i)`` is a rescaled copy of the model delta the client sends
    anyway, so it adds no uplink bytes (``uplink_models = 0``); ``g`` costs one downlink model.
    """

    uplink_models = 0.0

    def __init__(self, local_lr: float, name: str = "momentum") -> None:
        self.name = name
        self.local_lr = local_lr

    def server_init(self, params: Params) -> dict:
        return {"g": tree_zeros_like(params)}

    def broadcast(self, server_state: dict) -> dict:
        return {"g": server_state["g"]}

    def finalize(self, fin: FinalizeInputs) -> tuple[dict, dict]:
        scale = 1.0 / (fin.num_steps.clamp_min(1.0) * self.local_lr)
        return {}, {"g": {k: d * scale for k, d in fin.delta.items()}}

    def server_update(self, server_state, mean_uploads, agg) -> dict:
        return {"g": mean_uploads["g"]}


def mix_global_momentum(part: str, beta: float) -> Transform:
    """``d -> β d + (1 - β) g`` with ``g = ctx.broadcast[part]["g"]`` (stateless)."""

    def init(params, ctx):
        del params, ctx
        return {}

    def update(grads, state, params, ctx):
        g = ctx.broadcast[part]["g"]
        return {k: beta * grads[k] + (1 - beta) * g[k] for k in grads}, state

    return Transform(f"mix_{part}", init, update, keeps_params=False)  # stateless


def _check_beta(beta: float) -> None:
    if not 0.0 < beta <= 1.0:
        raise ValueError(f"algorithm.beta: expected 0 < beta <= 1, got {beta}")


@defaults_from("fedavg_global_momentum")
def fedavg_m(local_lr: float, server_lr: float, beta: float) -> Algorithm:
    """FedAvg-M (Cheng et al. 2023): local SGD on ``β g + (1-β) g^t``."""
    _check_beta(beta)
    mom = GlobalMomentum(local_lr)
    return Algorithm(
        "fedavg_global_momentum",
        chain(mix_global_momentum(mom.name, beta), scale_by_learning_rate(local_lr)),
        server_sgd(server_lr),
        parts=(mom,),
        description="FedAvg-M (Cheng et al. 2023): local steps mix in a broadcast global "
                    "momentum; alias fedavg_m",
    )


@defaults_from("scaffold_m")
def scaffold_m(local_lr: float, server_lr: float, beta: float) -> Algorithm:
    """SCAFFOLD-M (Cheng et al. 2023): ``β (g - c_i + c) + (1-β) g^t``, c_i = mean raw grads."""
    _check_beta(beta)
    mom = GlobalMomentum(local_lr)
    tracking = GradientTracking("scaffold_m", "gradient", fraction=1.0)
    return Algorithm(
        "scaffold_m",
        chain(add_correction(tracking.name, "y", "y"), mix_global_momentum(mom.name, beta),
              scale_by_learning_rate(local_lr)),
        server_sgd(server_lr),
        parts=(tracking, mom),
        description="SCAFFOLD-M (Cheng et al. 2023): control variates + broadcast global momentum",
    )


__all__ = ["GlobalMomentum", "fedavg_m", "mix_global_momentum", "scaffold_m"]
