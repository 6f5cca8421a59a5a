"""FedAvg, FedAvgM and FedProx: local SGD-family steps, server SGD on the mean delta.

References:
  McMahan et al., "Communication-Efficient Learning of Deep Networks from Decentralized
  Data", AISTATS 2017.  Hsu et al., "Measuring the Effects of Non-Identical Data Distribution
  for Federated Visual Classification", 2019 (server momentum).  Li et al., "Federated
  Optimization in Heterogeneous Networks", MLSys 2020 (proximal term μ).
"""

from __future__ import annotations

from fedforge.algorithms.defaults import defaults_from
from fedforge.client.optimizers import local_optimizer
from fedforge.client.transforms import add_prox, chain
from fedforge.core.schedules import ScheduleLike
from fedforge.protocol.algorithm import Algorithm
from fedforge.server.optimizers import server_sgd


@defaults_from("fedavg")
def fedavg(
    local_lr: ScheduleLike, server_lr: ScheduleLike, client_optimizer: str,
    weight_decay: ScheduleLike, local_momentum: float, max_grad_norm: ScheduleLike | None,
    nar: bool,
) -> Algorithm:
    """FedAvg: ``x <- x - server_lr * mean_i (x - x_i)`` (server_lr 1 = plain averaging).

    Every float hyper-parameter may be a schedule; ``max_grad_norm`` clips the local
    gradient and ``nar=True`` is FedNAR (decay inside the clip, :mod:`fedforge.client.nar`).
    """
    return Algorithm(
        "fedavg",
        local_optimizer(client_optimizer, local_lr, weight_decay=weight_decay,
                        momentum=local_momentum, max_grad_norm=max_grad_norm, nar=nar),
        server_sgd(server_lr),
        description="FedAvg (McMahan et al. 2017): local SGD, average of client models",
        aggregation="num_samples",  # McMahan et al. 2017, Alg. 1: n_k / n
    )


@defaults_from("fedavg_server_momentum")
def fedavgm(
    local_lr: ScheduleLike, server_lr: ScheduleLike, server_momentum: float,
    client_optimizer: str, weight_decay: ScheduleLike, max_grad_norm: ScheduleLike | None,
    nar: bool,
) -> Algorithm:
    """FedAvgM: server heavy-ball momentum on the pseudo-gradient (Hsu et al. 2019)."""
    return Algorithm(
        "fedavg_server_momentum",
        local_optimizer(client_optimizer, local_lr, weight_decay=weight_decay,
                        max_grad_norm=max_grad_norm, nar=nar),
        server_sgd(server_lr, momentum=server_momentum),
        description="FedAvgM (Hsu et al. 2019): FedAvg with server momentum; alias fedavgm",
        aggregation="num_samples",  # n_i / n, as FedAvg
    )


@defaults_from("fedprox")
def fedprox(
    local_lr: ScheduleLike, mu: float, server_lr: ScheduleLike, client_optimizer: str,
    weight_decay: ScheduleLike, max_grad_norm: ScheduleLike | None, nar: bool,
) -> Algorithm:
    """FedProx: local gradient ``g + mu (x - x^t)`` (Li et al. 2020, Eq. 2)."""
    if mu < 0:
        raise ValueError(f"algorithm.mu: expected mu >= 0, got {mu}")
    return Algorithm(
        "fedprox",
        chain(add_prox(mu), local_optimizer(client_optimizer, local_lr, weight_decay=weight_decay,
                                            max_grad_norm=max_grad_norm, nar=nar)),
        server_sgd(server_lr),
        description="FedProx (Li et al. 2020): FedAvg + proximal term mu/2 ||x - x_global||^2",
        aggregation="num_samples",  # the FedProx code (flearn) weights by samples
    )
