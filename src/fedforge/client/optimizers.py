"""Named local optimizers built from transforms (what configs call ``client.optimizer``)."""

from __future__ import annotations

from fedforge.client.nar import clipped_sgd
from fedforge.client.transforms import Transform, adam, chain, clip_by_global_norm
from fedforge.core.schedules import ScheduleLike, as_schedule, first_value

LOCAL_OPTIMIZERS = ("sgd", "momentum", "adam", "amsgrad")


def local_optimizer(
    name: str = "sgd",
    lr: ScheduleLike = 0.01,
    *,
    momentum: float = 0.9,
    weight_decay: ScheduleLike = 0.0,
    b1: float = 0.9,
    b2: float = 0.999,
    eps: ScheduleLike = 1e-8,
    max_grad_norm: ScheduleLike | None = None,
    nar: bool = False,
) -> Transform:
    """``sgd`` | ``momentum`` (heavy ball) | ``adam`` | ``amsgrad``, each with L2 weight decay.

    ``lr``, ``weight_decay``, ``eps`` and ``max_grad_norm`` may be per-round schedules
    (:mod:`fedforge.core.schedules`). ``max_grad_norm`` clips the gradient before the decay
    is added; ``nar=True`` (FedNAR, SGD/momentum only) puts the decay inside the clip.
    """
    lr = as_schedule(lr, "local_lr")
    if first_value(lr) <= 0:
        raise ValueError(f"client.lr: expected a positive learning rate, got {first_value(lr)}")
    if name == "sgd":
        return clipped_sgd(lr, weight_decay, max_grad_norm, nar=nar)
    if name == "momentum":
        return clipped_sgd(lr, weight_decay, max_grad_norm, momentum, nar=nar)
    if name in ("adam", "amsgrad"):
        if nar:
            raise ValueError(f"nar: FedNAR needs an SGD-family client optimizer, got {name!r}")
        opt = adam(lr, b1, b2, eps, weight_decay, amsgrad=name == "amsgrad")
        return opt if max_grad_norm is None else chain(clip_by_global_norm(max_grad_norm), opt)
    raise ValueError(
        f"client.optimizer: unknown {name!r}; expected one of {list(LOCAL_OPTIMIZERS)}"
    )
