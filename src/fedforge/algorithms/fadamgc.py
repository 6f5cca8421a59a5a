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
import time

import torch

from fedforge.algorithms.defaults import defaults_from, table_value
from fedforge.client.control_variates import option_ii
from fedforge.client.transforms import (
    RoundContext,
    Transform,
    add_correction,
    chain,
    scale_by_adam,
    scale_by_learning_rate,
)
from fedforge.core.tree import Params, tree_add, tree_nbytes, tree_zeros_like
from fedforge.protocol.algorithm import (
    PREP_SAMPLES,
    PREP_SECONDS,
    Algorithm,
    FinalizeInputs,
    Part,
    PrepareInputs,
)
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


TRACKING_INITS = ("zeros", "full_gradient")


def _sq_norm(tree: Params) -> torch.Tensor:
    return sum(t.double().pow(2).sum() for t in tree.values())


def _grad_at(loss_fn, params: Params, x: torch.Tensor, y: torch.Tensor,
             chunk: int = 1024) -> Params:
    """``∇ (1/|x|) Σ_j loss(params; x_j, y_j)`` in chunks (a full local gradient)."""
    grads = {k: torch.zeros_like(v) for k, v in params.items()}
    for start in range(0, len(x), chunk):
        xb, yb = x[start:start + chunk], y[start:start + chunk]
        w = torch.ones(len(xb), dtype=params[next(iter(params))].dtype, device=xb.device)
        g = torch.func.grad(loss_fn)(params, xb, yb, w)
        for k in grads:
            grads[k] += g[k] * (len(xb) / len(x))
    return grads


class GradientTracking(Part):
    """Tracked correction ``y`` (server) and ``y_i`` (client) for a subset S̃ of the cohort.

    ``mode="gradient"``: ``y_i+ = (1/K) Σ_k g_i^k`` (raw mini-batch gradients; FAdamGC,
    SCAFFOLD-M). ``mode="model_change"``: ``y_i+ = y_i - y + (x^t - x_i)/(K η_l)`` from the
    model change (SCAFFOLD option II; FA-NT). Non-tracking clients keep ``y_i`` and upload
    ``dy = 0``; the server adds ``(1/n) Σ_{i∈S̃} dy_i`` to ``y`` (= ``(S/n)`` times the
    cohort mean of ``dy``).
    The tracking mask arrives as ``ctx.info[info_key]`` (from :meth:`round_info`).

    ``init="full_gradient"`` starts from the theory's ``y_i = ∇f_i(x^1)`` instead of zeros.
    A client computes it when it is first sampled (a preparation before its local round, at
    the initial model x^1, which every client knows from the shared seed, on the samples of
    that round's schedule: its whole dataset when it holds at most K·B samples), so an
    unsampled client never pays for it; the samples are charged to simulated time. It
    uploads ``∇f_i(x^1)`` once; until every client has done so the server estimates
    ``(1/n) Σ_i ∇f_i(x^1)`` by the mean over the clients that have, and sets ``y`` to that
    estimate plus the tracking increments ``(1/n) Σ dy``; once all n clients have joined,
    ``y = (1/n) Σ_i y_i`` exactly.

    Each client also counts how often it tracked (``count``), for the diagnostics.
    """

    info_key = "tracking"
    fresh_key = "tracking_fresh"  # per-client info: initialised its y_i this round

    def __init__(
        self,
        name: str = "tracking",
        mode: str = "gradient",
        fraction: float = table_value("fadamgc", "tracking_fraction"),
        local_lr: float | None = None,
        init: str = table_value("fadamgc", "tracking_init"),
    ) -> None:
        if mode not in ("gradient", "model_change"):
            raise ValueError(
                f"GradientTracking: mode must be 'gradient' or 'model_change', got {mode!r}")
        if not 0.0 <= fraction <= 1.0:
            raise ValueError(f"algorithm.tracking_fraction: expected 0 <= f <= 1, got {fraction}")
        if mode == "model_change" and not local_lr:
            raise ValueError("GradientTracking(mode='model_change') needs local_lr")
        if init not in TRACKING_INITS:
            raise ValueError(f"algorithm.tracking_init: expected one of {TRACKING_INITS}, "
                             f"got {init!r}")
        self.name = name
        self.mode = mode
        self.fraction = fraction
        self.local_lr = local_lr
        self.init = init
        self.prepares = init == "full_gradient"
        # raw gradients: the tracking target (gradient mode) and the diagnostics' reference
        self.needs_grad_sum = True
        # expected extra model-sized uploads per sampled client (byte accounting); the
        # one-off ∇f_i(x^1) uploads of full_gradient are logged as ``<name>_init_bytes_up``
        self.uplink_models = fraction
        self._x1: Params | None = None  # the initial model (full_gradient init)

    def client_init(self, params: Params) -> dict:
        ref = next(iter(params.values()))
        state = {"y": tree_zeros_like(params), "count": ref.new_zeros(())}
        if self.init == "full_gradient":
            state["ready"] = ref.new_zeros(())
        return state

    def server_init(self, params: Params) -> dict:
        state = {"y": tree_zeros_like(params)}
        if self.init == "full_gradient":
            self._x1 = {k: v.detach().clone() for k, v in params.items()}
            ref = next(iter(params.values()))
            state.update(increments=tree_zeros_like(params), g0_sum=tree_zeros_like(params),
                         joined=ref.new_zeros(()))
        return state

    def broadcast(self, server_state: dict) -> dict:
        return {"y": server_state["y"]}

    def round_info(self, num_sampled: int, generator: torch.Generator) -> dict:
        return {self.info_key: sample_tracking(num_sampled, self.fraction, generator)}

    def prepare_cohort(self, prep: PrepareInputs) -> tuple[dict, dict, dict]:
        """``full_gradient``: a client sampled for the first time sets ``y_i = ∇f_i(x^1)``."""
        state = dict(prep.client_states[self.name])
        if self._x1 is None:
            raise RuntimeError(f"{self.name}: server_init must run before prepare_cohort")
        num = prep.sample_idx.shape[0]
        fresh = torch.zeros(num, dtype=torch.bool, device=prep.sample_idx.device)
        secs, samples = torch.zeros(num), torch.zeros(num)
        y = {k: v.clone() for k, v in state["y"].items()}
        for c in range(num):
            if bool(state["ready"][c] > 0):
                continue
            idx = prep.sample_idx[c][prep.weights[c] > 0].unique()
            if idx.numel() == 0:  # a client without data keeps y_i = 0
                continue
            t0 = time.perf_counter()
            g = _grad_at(prep.loss_fn, self._x1, prep.x_all[idx], prep.y_all[idx])
            for k in y:
                y[k][c] = g[k]
            fresh[c] = True
            secs[c], samples[c] = time.perf_counter() - t0, float(idx.numel())
        state["y"] = y
        state["ready"] = torch.where(fresh, torch.ones_like(state["ready"]), state["ready"])
        metrics = {PREP_SECONDS: secs, PREP_SAMPLES: samples}
        return state, {self.fresh_key: fresh}, metrics

    def finalize(self, fin: FinalizeInputs) -> tuple[dict, dict]:
        state = fin.ctx.client_state[self.name]
        yi = state["y"]
        if self.info_key not in fin.ctx.info:
            raise KeyError(f"{self.name}: ctx.info[{self.info_key!r}] missing; pass "
                           "info=algorithm.round_info(num_sampled, generator) to the round")
        steps = fin.num_steps
        update = fin.ctx.info[self.info_key] & (steps > 0)
        k = steps.clamp_min(1.0)
        if self.mode == "gradient":
            target = {n: fin.grad_sum[n] / k for n in yi}
            new_yi = {n: torch.where(update, target[n], yi[n]) for n in yi}
        else:  # SCAFFOLD's option II on y_i
            new_yi = option_ii(yi, fin.ctx.broadcast[self.name]["y"], fin.delta, steps,
                               self.local_lr, update=fin.ctx.info[self.info_key])
        new_state = {**state, "y": new_yi, "count": state["count"] + update.to(yi_dtype(yi))}
        uploads = {"dy": {n: new_yi[n] - yi[n] for n in yi}}
        if self.init == "full_gradient":  # y_i was set to ∇f_i(x^1) just before this round
            fresh = fin.ctx.info[self.fresh_key]
            uploads["g0"] = {n: torch.where(fresh, yi[n], torch.zeros_like(yi[n])) for n in yi}
            uploads["joined"] = fresh.to(yi_dtype(yi))
        return new_state, uploads

    def server_update(self, server_state, mean_uploads, agg) -> dict:
        if self.init == "zeros":  # (1/n) Σ_{S̃} dy = (S/n) mean_S dy
            return {"y": population_mean_step(server_state["y"], mean_uploads["dy"], agg)}
        increments = population_mean_step(server_state["increments"], mean_uploads["dy"], agg)
        g0_sum = tree_add(server_state["g0_sum"], mean_uploads["g0"], alpha=agg.num_sampled)
        joined = server_state["joined"] + mean_uploads["joined"] * agg.num_sampled
        g0_mean = {k: v / joined.clamp_min(1.0) for k, v in g0_sum.items()}
        y = tree_add(increments, g0_mean)
        return {"y": y, "increments": increments, "g0_sum": g0_sum, "joined": joined}

    def client_metrics(self, fin: FinalizeInputs) -> dict:
        """``‖y − y_i‖`` this round and its size relative to the mean raw gradient."""
        yi = fin.ctx.client_state[self.name]["y"]
        y = fin.ctx.broadcast[self.name]["y"]
        corr = _sq_norm({n: y[n] - yi[n] for n in yi}).sqrt()
        k = fin.num_steps.clamp_min(1.0)
        grad = _sq_norm({n: fin.grad_sum[n] / k for n in yi}).sqrt()
        return {f"{self.name}_corr_norm": corr,
                f"{self.name}_corr_rel": corr / grad.clamp_min(1e-12)}

    def server_metrics(self, server_state: dict, client_states: dict) -> dict:
        """Over all clients: mean ``‖y − y_i‖``, share tracked at least once, mean count."""
        if not client_states:
            return {}
        y = server_state["y"]
        yi = client_states["y"]
        dev = sum((yi[n] - y[n].unsqueeze(0)).double().pow(2).flatten(1).sum(1) for n in yi)
        count = client_states["count"].double()
        out = {f"{self.name}_dev_all": dev.sqrt().mean(),
               f"{self.name}_tracked_share": (count > 0).double().mean(),
               f"{self.name}_tracked_mean": count.mean()}
        if self.init == "full_gradient":  # the one-off ∇f_i(x^1) uploads so far
            out[f"{self.name}_joined"] = server_state["joined"]
            out[f"{self.name}_init_bytes_up"] = server_state["joined"] * tree_nbytes(y)
        return out


def yi_dtype(tree: Params) -> torch.dtype:
    return next(iter(tree.values())).dtype


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


@defaults_from("fadamgc")
def fadamgc(
    local_lr: float, server_lr: float, b1: float, b2: float, eps: float,
    tracking_fraction: float, tracking_init: str,
) -> Algorithm:
    """FAdamGC (Algorithm 1): correction ``y - y_i`` on the raw gradient before local AMSGrad."""
    tracking = GradientTracking("tracking", "gradient", tracking_fraction, init=tracking_init)
    v_part = CarriedSecondMoment()
    return Algorithm(
        "fadamgc",
        _local_adam(local_lr, b1, b2, eps, amsgrad=True, bias_correction=False, v_part=v_part,
                    pre=(add_correction("tracking", "y", "y"),)),
        server_sgd(server_lr),
        parts=(tracking, v_part),
        description="FAdamGC (Chen et al.): local AMSGrad on g + y - y_i, selective tracking",
    )


@defaults_from("fa_nt")
def fa_nt(
    local_lr: float, server_lr: float, b1: float, b2: float, eps: float,
    tracking_fraction: float, tracking_init: str,
) -> Algorithm:
    """FA-NT (Algorithm 2): local AMSGrad, correction added to the Adam direction afterwards."""
    tracking = GradientTracking("tracking", "model_change", tracking_fraction, local_lr=local_lr,
                                init=tracking_init)
    v_part = CarriedSecondMoment()
    return Algorithm(
        "fa_nt",
        _local_adam(local_lr, b1, b2, eps, amsgrad=True, bias_correction=False, v_part=v_part,
                    post=(add_correction("tracking", "y", "y"),)),
        server_sgd(server_lr),
        parts=(tracking, v_part),
        description="FA-NT (Chen et al., Alg. 2): local AMSGrad + post-moment SCAFFOLD correction",
    )


@defaults_from("localadam")
def localadam(
    local_lr: float, server_lr: float, b1: float, b2: float, eps: float, amsgrad: bool,
    bias_correction: bool, carry_v: bool,
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
