"""SCAFFOLD's option II control variate, written once.

``c_i+ = c_i - c + (x - x_i) / (K η_l)`` (Karimireddy et al. 2020, Alg. 1, line 12): the
client's new control variate from its own model change over the K steps it took. SCAFFOLD's
``c_i``, FedDC's ``G_i`` and FA-NT's tracking term ``y_i`` all follow this rule.
"""

from __future__ import annotations

import torch

from fedforge.core.tree import Params


def option_ii(
    ci: Params, c: Params, delta: Params, num_steps: torch.Tensor, lr: float | torch.Tensor,
    update: torch.Tensor | None = None,
) -> Params:
    """``c_i - c + delta / (K lr)`` where the client trained (and ``update``), else ``c_i``.

    ``delta = x - x_i`` (server minus client); ``num_steps`` is K, the steps actually taken, so
    a client without data keeps its ``c_i``.
    """
    scale = 1.0 / (num_steps.clamp_min(1.0) * lr)
    keep = num_steps > 0 if update is None else update & (num_steps > 0)
    return {k: torch.where(keep, ci[k] - c[k] + delta[k] * scale, ci[k]) for k in ci}
