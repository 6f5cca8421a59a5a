"""Running moments shared by the client's and the server's optimizers, written once.

Adam's first and second moments and heavy-ball momentum appear on both sides of a round
(local Adam, FedAdam/FedAMS on the server; local momentum SGD, FedAvgM on the server); every
optimizer in fedforge builds on these, so the same arithmetic runs everywhere.
"""

from __future__ import annotations

from fedforge.core.tree import PyTree, tree_map2


def ema(avg: PyTree, x: PyTree, decay: float) -> PyTree:
    """Adam's first moment: ``decay * avg + (1 - decay) * x``."""
    return tree_map2(lambda a, g: decay * a + (1 - decay) * g, avg, x)


def ema_sq(avg: PyTree, x: PyTree, decay: float) -> PyTree:
    """Adam's second moment: ``decay * avg + (1 - decay) * x²``."""
    return tree_map2(lambda a, g: decay * a + (1 - decay) * g * g, avg, x)


def heavy_ball(buf: PyTree, x: PyTree, momentum: float) -> PyTree:
    """Momentum buffer without dampening (torch.optim.SGD): ``momentum * buf + x``."""
    return tree_map2(lambda b, g: momentum * b + g, buf, x)


def nesterov(x: PyTree, buf: PyTree, momentum: float) -> PyTree:
    """Nesterov's look-ahead direction from the updated buffer: ``x + momentum * buf``."""
    return tree_map2(lambda g, b: g + momentum * b, x, buf)
