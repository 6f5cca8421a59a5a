"""FedOpt family: local SGD, adaptive server optimizer on the pseudo-gradient.

Reference: Reddi et al., "Adaptive Federated Optimization", ICLR 2021 (Alg. 2: FedAdagrad,
FedAdam, FedYogi; Sec. 5 gives the default β1, β2 and τ). FedAMS: Wang, Lin & Chen,
"Communication-Efficient Adaptive Federated Learning", ICML 2022 (AMSGrad max at the server).
"""

from __future__ import annotations

from fedforge.algorithms.defaults import defaults_from
from fedforge.client.optimizers import local_optimizer
from fedforge.core.schedules import ScheduleLike
from fedforge.protocol.algorithm import Algorithm
from fedforge.server.optimizers import server_adagrad, server_adam, server_yogi


@defaults_from("fedadam")
def fedadam(
    local_lr: ScheduleLike, server_lr: ScheduleLike, b1: float, b2: float, tau: ScheduleLike,
    client_optimizer: str, weight_decay: ScheduleLike, max_grad_norm: ScheduleLike | None,
    nar: bool, adam_rule: str,
) -> Algorithm:
    """FedAdam. ``adam_rule="fednar_code"``: the FedNAR code's variant (v from the momentum,
    ε inside the root; see :func:`fedforge.server.optimizers.server_adam`)."""
    return Algorithm(
        "fedadam",
        local_optimizer(client_optimizer, local_lr, weight_decay=weight_decay,
                        max_grad_norm=max_grad_norm, nar=nar),
        server_adam(server_lr, b1, b2, tau, rule=adam_rule),
        description="FedAdam (Reddi et al. 2021): server Adam on the mean delta, "
                    "no bias correction",
    )


@defaults_from("fedyogi")
def fedyogi(
    local_lr: ScheduleLike, server_lr: ScheduleLike, b1: float, b2: float, tau: ScheduleLike,
    client_optimizer: str, weight_decay: ScheduleLike, max_grad_norm: ScheduleLike | None,
    nar: bool,
) -> Algorithm:
    return Algorithm(
        "fedyogi",
        local_optimizer(client_optimizer, local_lr, weight_decay=weight_decay,
                        max_grad_norm=max_grad_norm, nar=nar),
        server_yogi(server_lr, b1, b2, tau),
        description="FedYogi (Reddi et al. 2021): server Yogi on the mean delta",
    )


@defaults_from("fedadagrad")
def fedadagrad(
    local_lr: ScheduleLike, server_lr: ScheduleLike, tau: ScheduleLike, client_optimizer: str,
    weight_decay: ScheduleLike, max_grad_norm: ScheduleLike | None, nar: bool,
) -> Algorithm:
    return Algorithm(
        "fedadagrad",
        local_optimizer(client_optimizer, local_lr, weight_decay=weight_decay,
                        max_grad_norm=max_grad_norm, nar=nar),
        server_adagrad(server_lr, tau),
        description="FedAdagrad (Reddi et al. 2021): server Adagrad on the mean delta",
    )


@defaults_from("fedams")
def fedams(
    local_lr: ScheduleLike, server_lr: ScheduleLike, b1: float, b2: float, eps: float,
    client_optimizer: str, weight_decay: ScheduleLike, max_grad_norm: ScheduleLike | None,
    nar: bool,
) -> Algorithm:
    """FedAMS: ``v_hat = max(v_hat, v, eps)``, step ``η m / sqrt(v_hat)`` (Wang et al. 2022)."""
    return Algorithm(
        "fedams",
        local_optimizer(client_optimizer, local_lr, weight_decay=weight_decay,
                        max_grad_norm=max_grad_norm, nar=nar),
        server_adam(server_lr, b1, b2, amsgrad=True, floor=eps),
        description="FedAMS (Wang et al. 2022): server AMSGrad with an eps floor on v_hat",
    )
