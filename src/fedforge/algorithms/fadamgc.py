"""FAdamGC, FA-NT and LocalAdam: federated local Adam with and without gradient correction.

Reference: Chen, Wang, Zhang, Han, Liu & Brinton, "Gradient Correction in Federated Learning
with Adaptive Optimization" (FAdamGC, Algorithm 1; FA-NT, Algorithm 2 in Appendix C).

FAdamGC (Algorithm 1), client i in round t, local steps k = 1..K::

    x_i = x^t,  m_i = 0,  v_i = v_i^t (carried per client),  v̂_i = v_i^t
    ĝ   = g_i(x_i) + y^t - y_i^t                  # correction BEFORE the moments
    m_i = β1 m_i + (1-β1) ĝ;   v_i = β2 v_i + (1-β2) ĝ²;   v̂_i = max(v̂_i, v_i)
    x_i = x_i - η_l m_i / (sqrt(v̂_i) + ε)        # no bias correction
    y_i^{t+1} = (1/K) Σ_k g_i^{t,k}  if i ∈ S̃^t else y_i^t   # raw, uncorrected gradients
    server: x^{t+1} = x^t - η_g mean_i (x^t - x_i)
            y^{t+1} = y^t + (1/n) Σ_{i∈S̃} (y_i^{t+1} - y_i^t)

FA-NT (Algorithm 2) moves the correction after the moments (``x_i -= η_l (Δ + y - y_i)``) and
tracks SCAFFOLD option II: ``y_i^{t+1} = y_i - y + (x^t - x_i^{t,K+1}) / (K η_l)``, which
equals the average Adam direction plus the correction (Appendix C).

LocalAdam is Algorithm 1 with ``y ≡ y_i ≡ 0``: the same local AMSGrad without bias correction,
``v_i`` carried per client, plain averaging — so FAdamGC/FA-NT reduce to it exactly when the
correction vanishes.

Choices the paper leaves open (see ``docs/fadamgc.md``):

* ``y^1 = y_i^1 = 0`` and ``v_i^1 = 0`` for every client (the theory's ``y_i = ∇f_i(x^1)``
  would need a full-participation warm-up round). With zeros, round 1 of FAdamGC is LocalAdam.
* ``v̂_i^{t,1} = v_i^t``: the AMSGrad max restarts each round from the carried ``v_i``; v̂ itself
  is not stored across rounds.
* S̃^t is a uniform sample without replacement of ``round(tracking_fraction * S)`` of the S
  sampled clients (at least one when ``tracking_fraction > 0``), drawn in ``round_info`` from the
  round's generator. The undefined set 𝒴^t of the y-update is S̃^t.
* K in the tracking updates is the number of steps the client actually took (clients with
  less data take fewer steps); a client that took no step keeps ``y_i`` and ``v_i``.
* The second moment is carried for every sampled client (not only trackers), as Algorithm 1.
"""

from __future__ import annotations

import math

import torch

from fedforge.algorithms.base import Algorithm, FinalizeInputs, Part
from fedforge.client.transforms import (
    RoundContext,
    Transform,
    add_correction,
    chain,
    scale_by_adam,
    scale_by_learning_rate,
)
from fedforge.core.tree import Params, tree_zeros_like
from fedforge.server.chain import population_mean_step
from fedforge.server.optimizers import server_sgd

ADAM_NAME = "adam"  # name of the scale_by_adam transform whose final v is carried


def num_tracking(num_sampled: int, fraction: float) -> int:
    """``|S̃| = round(fraction * S)``, at least 1 when ``fraction > 0``, at most S."""
    if fraction <= 0:
        return 0
    return max(1, min(num_sampled, math.floor(fraction * num_sampled + 0.5)))


def sample_tracking(num_sampled: int, fraction: float, generator: torch.Generator) -> torch.Tensor:
    """Bool mask ``[S]`` with ``num_tracking`` True entries, uniform without replacement."""
    mask = torch.zeros(num_sampled, dtype=torch.bool)
    k = num_tracking(num_sampled, fraction)
    if k == num_sampled:
        mask[:] = True
    elif k > 0:
        mask[torch.randperm(num_sampled, generator=generator)[:k]] = True
    return mask


class GradientTracking(Part):
    """Tracked correction ``y`` (server) and ``y_i`` (client) for a subset S̃ of the cohort.

    ``mode="gradient"``: ``y_i+ = (1/K) Σ_k g_i^k`` (raw mini-batch gradients; FAdamGC,
    SCAFFOLD-M). ``mode="delta"``: ``y_i+ = y_i - y + (x^t - x_i)/(K η_l)`` (SCAFFOLD option II;
    FA-NT). Non-tracking clients keep ``y_i`` and upload ``dy = 0``; the server adds
    ``(1/n) Σ_{i∈S̃} dy_i`` to ``y`` (= ``(S/n)`` times the cohort mean of ``dy``).
    The tracking mask arrives as ``ctx.info[info_key]`` (from :meth:`round_info`).
    """

    info_key = "tracking"

    def __init__(
        self,
        name: str = "tracking",
        mode: str = "gradient",
        fraction: float = 0.5,
        local_lr: float | None = None,
    ) -> None:
        if mode not in ("gradient", "delta"):
            raise ValueError(f"GradientTracking: mode must be 'gradient' or 'delta', got {mode!r}")
        if not 0.0 <= fraction <= 1.0:
            raise ValueError(f"algorithm.tracking_fraction: expected 0 <= f <= 1, got {fraction}")
        if mode == "delta" and not local_lr:
            raise ValueError("GradientTracking(mode='delta') needs local_lr")
        self.name = name
        self.mode = mode
        self.fraction = fraction
        self.local_lr = local_lr
        self.needs_grad_sum = mode == "gradient"
        # expected extra model-sized uploads per sampled client (byte accounting)
        self.uplink_models = fraction

    def client_init(self, params: Params) -> dict:
        return {"y": tree_zeros_like(params)}

    def server_init(self, params: Params) -> dict:
        return {"y": tree_zeros_like(params)}

    def broadcast(self, server_state: dict) -> dict:
        return {"y": server_state["y"]}

    def round_info(self, num_sampled: int, generator: torch.Generator) -> dict:
        return {self.info_key: sample_tracking(num_sampled, self.fraction, generator)}

    def finalize(self, fin: FinalizeInputs) -> tuple[dict, dict]:
        yi = fin.ctx.client_state[self.name]["y"]
        if self.info_key not in fin.ctx.info:
            raise KeyError(f"{self.name}: ctx.info[{self.info_key!r}] missing; pass "
                           "info=algorithm.round_info(num_sampled, generator) to the round")
        steps = fin.num_steps
        update = fin.ctx.info[self.info_key] & (steps > 0)
        k = steps.clamp_min(1.0)
        if self.mode == "gradient":
            target = {n: fin.grad_sum[n] / k for n in yi}
        else:
            y = fin.ctx.broadcast[self.name]["y"]
            scale = 1.0 / (k * self.local_lr)
            target = {n: yi[n] - y[n] + fin.delta[n] * scale for n in yi}
        new_yi = {n: torch.where(update, target[n], yi[n]) for n in yi}
        return {"y": new_yi}, {"dy": {n: new_yi[n] - yi[n] for n in yi}}

    def server_update(self, server_state, mean_uploads, agg) -> dict:
        # (1/n) Σ_{S̃} dy = (S/n) mean_S dy
        return {"y": population_mean_step(server_state["y"], mean_uploads["dy"], agg)}


class CarriedSecondMoment(Part):
    """Per-client Adam second moment ``v_i`` kept across rounds (never communicated).

    The local ``scale_by_adam`` starts from it (``initial_v``); at the end of the round the
    final ``v`` of the transform named ``transform`` becomes the new ``v_i``.
    """

    uplink_models = 0.0

    def __init__(self, name: str = "adam_v", transform: str = ADAM_NAME) -> None:
        self.name = name
        self.transform = transform

    def client_init(self, params: Params) -> dict:
        return {"v": tree_zeros_like(params)}

    def initial_v(self, ctx: RoundContext) -> Params:
        return ctx.client_state[self.name]["v"]

    def finalize(self, fin: FinalizeInputs) -> tuple[dict, dict]:
        # masked (padding) steps leave the optimizer state untouched, so a client with no
        # data returns its v_i unchanged
        return {"v": fin.opt_state[self.transform]["v"]}, {}


def _local_adam(
    local_lr: float, b1: float, b2: float, eps: float, *, amsgrad: bool, bias_correction: bool,
    v_part: CarriedSecondMoment | None, pre: tuple[Transform, ...] = (),
    post: tuple[Transform, ...] = (),
) -> Transform:
    adam = scale_by_adam(
        b1, b2, eps, amsgrad=amsgrad, bias_correction=bias_correction,
        initial_v=v_part.initial_v if v_part is not None else None, name=ADAM_NAME,
    )
    return chain(*pre, adam, *post, scale_by_learning_rate(local_lr))


def fadamgc(
    local_lr: float = 1e-3, server_lr: float = 1.0, b1: float = 0.9, b2: float = 0.99,
    eps: float = 1e-8, tracking_fraction: float = 0.5,
) -> Algorithm:
    """FAdamGC (Algorithm 1): correction ``y - y_i`` on the raw gradient before local AMSGrad."""
    tracking = GradientTracking("tracking", "gradient", tracking_fraction)
    v_part = CarriedSecondMoment()
    return Algorithm(
        "fadamgc",
        _local_adam(local_lr, b1, b2, eps, amsgrad=True, bias_correction=False, v_part=v_part,
                    pre=(add_correction("tracking", "y", "y"),)),
        server_sgd(server_lr),
        parts=(tracking, v_part),
        description="FAdamGC (Chen et al.): local AMSGrad on g + y - y_i, selective tracking",
    )


def fa_nt(
    local_lr: float = 1e-3, server_lr: float = 1.0, b1: float = 0.9, b2: float = 0.99,
    eps: float = 1e-8, tracking_fraction: float = 0.5,
) -> Algorithm:
    """FA-NT (Algorithm 2): local AMSGrad, correction added to the Adam direction afterwards."""
    tracking = GradientTracking("tracking", "delta", tracking_fraction, local_lr=local_lr)
    v_part = CarriedSecondMoment()
    return Algorithm(
        "fa_nt",
        _local_adam(local_lr, b1, b2, eps, amsgrad=True, bias_correction=False, v_part=v_part,
                    post=(add_correction("tracking", "y", "y"),)),
        server_sgd(server_lr),
        parts=(tracking, v_part),
        description="FA-NT (Chen et al., Alg. 2): local AMSGrad + post-moment SCAFFOLD correction",
    )


def localadam(
    local_lr: float = 1e-3, server_lr: float = 1.0, b1: float = 0.9, b2: float = 0.99,
    eps: float = 1e-8, amsgrad: bool = True, bias_correction: bool = False, carry_v: bool = True,
) -> Algorithm:
    """LocalAdam: FAdamGC without correction (defaults: AMSGrad, no bias correction, v_i kept)."""
    v_part = CarriedSecondMoment() if carry_v else None
    return Algorithm(
        "localadam",
        _local_adam(local_lr, b1, b2, eps, amsgrad=amsgrad, bias_correction=bias_correction,
                    v_part=v_part),
        server_sgd(server_lr),
        parts=(v_part,) if v_part is not None else (),
        description="LocalAdam: local AMSGrad (v_i carried, no bias correction), model averaging",
    )
