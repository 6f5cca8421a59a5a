"""Named local optimizers built from transforms (what configs call ``client.optimizer``)."""

from __future__ import annotations

from fedforge.client.transforms import Transform, adam, sgd

LOCAL_OPTIMIZERS = ("sgd", "momentum", "adam", "amsgrad")


def local_optimizer(
    name: str = "sgd",
    lr: float = 0.01,
    *,
    momentum: float = 0.9,
    weight_decay: float = 0.0,
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-8,
) -> Transform:
    """``sgd`` | ``momentum`` (heavy ball) | ``adam`` | ``amsgrad``, each with L2 weight decay."""
    if lr <= 0:
        raise ValueError(f"client.lr: expected a positive learning rate, got {lr}")
    if name == "sgd":
        return sgd(lr, weight_decay=weight_decay)
    if name == "momentum":
        return sgd(lr, momentum=momentum, weight_decay=weight_decay)
    if name in ("adam", "amsgrad"):
        return adam(lr, b1, b2, eps, weight_decay, amsgrad=name == "amsgrad")
    raise ValueError(f"client.optimizer: unknown {name!r}; expected one of {list(LOCAL_OPTIMIZERS)}")
