"""FedAST's request allocation: variance estimates (Alg. 4) and Realloc (Alg. 3).

The dominant error term of Theorem 1 summed over tasks, ``sum_m eta_s eta_c tau / R_m *
sigma_m^2`` under ``sum_m R_m = R``, is minimised by ``R_m ∝ sigma_hat_m`` where
``sigma_hat_m^2 = eta_c eta_s tau * sigma_tilde_m^2`` (App. A). ``sigma_tilde^2`` is the
spread of the last V updates normalised by the squared norm of their mean, so larger models
do not win requests just for being larger. (The authors' code allocates ∝ the variance, not
its square root, because ``float(v)**1/2`` parses as ``v/2``; we follow the paper.)
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

from fedforge.core.tree import Params


def normalized_variance(window: Sequence[Params]) -> float:
    """Alg. 4 lines 2-3: ``(1/V) sum_i ||D_i - mean||^2 / ||mean||^2`` over flattened deltas."""
    if len(window) < 2:
        raise ValueError("normalized_variance: need at least 2 updates in the window")
    flat = torch.stack([torch.cat([t.reshape(-1).double() for t in d.values()]) for d in window])
    mean = flat.mean(0)  # [d]
    spread = ((flat - mean) ** 2).sum(1).mean()
    return float(spread / mean.pow(2).sum().clamp_min(1e-30))


def estimate_variance(window: Sequence[Params], local_lr: float, server_lr: float,
                      tau: int) -> float:
    """Alg. 4 line 4: ``sigma_hat^2 = eta_c eta_s tau * sigma_tilde^2``."""
    return local_lr * server_lr * tau * normalized_variance(window)


def proportional_split(total: int, weights: Sequence[float], minimum: int = 1) -> list[int]:
    """Integers ``>= minimum`` summing to ``total``, proportional to ``weights``.

    Largest-remainder rounding; ties go to the lower index, so the split is deterministic.
    """
    w = np.asarray(weights, dtype=np.float64)
    k = len(w)
    if k == 0:
        return []
    if total < minimum * k:
        raise ValueError(f"cannot give {k} tasks >= {minimum} of {total} requests")
    if not np.isfinite(w).all() or w.sum() <= 0:
        w = np.ones(k)
    floor = 0 if (total * w / w.sum() >= minimum).all() else minimum  # reserve only if needed
    spare = total - floor * k
    raw = spare * w / w.sum()
    out = np.floor(raw).astype(np.int64)
    order = np.argsort(-(raw - out), kind="stable")
    out[order[: spare - int(out.sum())]] += 1
    return (out + floor).tolist()


def realloc(requests: Sequence[int], sigma2_hat: Sequence[float], minimum: int = 1) -> list[int]:
    """Alg. 3 line 3: keep ``sum R_m``, set ``R_m ∝ sqrt(sigma_hat_m^2)``."""
    return proportional_split(int(sum(requests)), [math.sqrt(max(v, 0.0)) for v in sigma2_hat],
                              minimum)


def buffer_size(requests: int, ratio: float = 32.0) -> int:
    """``b_m = max(1, ceil(R_m / ratio))`` (R/b held near 32, App. A and the authors' code)."""
    return max(1, math.ceil(requests / ratio))
