"""FedPTR and FedPTR-S (Chen, Cao, Wang, Hsieh, Chen, "Federated Learning with Projected
Trajectory Regularization", arXiv:2312.14380, 2023), Algorithms 2 and 3.

Each round a synthetic set D̃ is fitted by trajectory matching (MTT, :mod:`fedforge.distill`)
so that R GD steps on it carry w^{t-m} to w^t; K more GD steps on D̃ from w^t give the
projected model w̃^{t+1}. Local training adds the layer-adaptive proximal term

    Σ_j (λ / ||w_j - w̃_j||) / 2 · ||w_j - w̃_j||²        (j: layers; App. B.1)

with λ_j = λ/||w_j - w̃_j|| recomputed every step and treated as a constant (detached), so
layer j is pulled towards w̃_j with gradient ``λ (w_j - w̃_j)/||w_j - w̃_j||`` of norm λ.
λ̃ = 0 while t ≤ m (warm-up: plain FedAvg local training). Aggregation is FedAvg's.

* FedPTR (client side): each client keeps, in the ClientStore, the last m+1 global models it
  received, its D̃_i (real images of its present classes, noise for absent ones) and β_i.
  With partial participation a client matches the oldest model in its window (the model it
  received m participations ago), per the paper's footnote 1. The MTT and projection run
  eagerly per client before the vmapped local round (``Part.prepare_cohort``).
* FedPTR-S (server side): one D̃ from noise on the server (``Part.server_prepare``); w̃^{t+1}
  is broadcast with w^t (two models down). λ̃ is not sent: clients use λ̃ = λ iff w̃ ≠ w^t.

See ``docs/fedptr.md`` for every choice the paper leaves open.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from fedforge.algorithms.defaults import defaults_from, table_value
from fedforge.client.optimizers import local_optimizer
from fedforge.client.transforms import RoundContext, Transform, chain
from fedforge.core.schedules import ScheduleLike
from fedforge.core.tree import Params, tree_index, tree_stack
from fedforge.distill import flip_shift, init_synthetic, match_trajectory, student_descent
from fedforge.distill.synthetic import synthetic_labels
from fedforge.protocol.algorithm import (
    PREP_SAMPLES,
    PREP_SECONDS,
    SERVER_PREP_SAMPLES,
    SERVER_PREP_SECONDS,
    Algorithm,
    FinalizeInputs,
    Part,
    PrepareInputs,
)
from fedforge.server.optimizers import server_sgd

AnchorFn = Callable[[RoundContext], tuple[Params, torch.Tensor]]


def layer_of(name: str) -> str:
    """A parameter's layer: its module path (``features.0.weight`` -> ``features.0``)."""
    return name.rsplit(".", 1)[0] if "." in name else name


def add_layer_prox(anchor_fn: AnchorFn, *, adaptive: bool = True, eps: float = 1e-12) -> Transform:
    """``g_j -> g_j + λ̃ (w_j - w̃_j) / ||w_j - w̃_j||`` per layer j (``adaptive``), else
    ``g -> g + λ̃ (w - w̃)`` (the fixed-λ ablation, Table 4). ``anchor_fn(ctx) -> (w̃, λ̃)``."""

    def init(params, ctx):
        del params, ctx
        return {}

    def update(g, state, params, ctx):
        anchor, lam = anchor_fn(ctx)
        diff = {k: params[k] - anchor[k] for k in g}
        if not adaptive:
            return {k: g[k] + lam * diff[k] for k in g}, state
        sq: dict[str, torch.Tensor] = {}
        for k in g:
            sq[layer_of(k)] = sq.get(layer_of(k), 0.0) + (diff[k] ** 2).sum()
        scale = {layer: lam / s.sqrt().clamp_min(eps) for layer, s in sq.items()}
        return {k: g[k] + scale[layer_of(k)] * diff[k] for k in g}, state

    return Transform("layer_prox", init, update, keeps_params=False)  # stateless


@dataclass(frozen=True)
class ProjectionConfig:
    """MTT (Algorithm 1) and projection hyper-parameters; defaults: FedPTR's, from the table."""

    window: int = table_value("fedptr", "window")  # m: match w^{t-m} -> w^t
    ipc: int = table_value("fedptr", "ipc")  # images per class
    outer_steps: int = table_value("fedptr", "outer_steps")  # H
    inner_steps: int = table_value("fedptr", "inner_steps")  # R
    syn_lr: float = table_value("fedptr", "syn_lr")  # β init
    lr_img: float = table_value("fedptr", "lr_img")
    lr_lr: float = table_value("fedptr", "lr_lr")
    proj_steps: int = table_value("fedptr", "proj_steps")  # K
    proj_lr: float = table_value("fedptr", "proj_lr")  # η of the projection steps (plain GD)
    # refit D̃ every this many eligible rounds; else reuse it
    mtt_every: int = table_value("fedptr", "mtt_every")
    augment: bool = table_value("fedptr", "augment")

    def __post_init__(self) -> None:
        for key in ("window", "ipc", "inner_steps", "mtt_every"):
            if getattr(self, key) < 1:
                raise ValueError(f"algorithm.{key}: expected an int >= 1, got {getattr(self, key)}")
        for key in ("outer_steps", "proj_steps"):
            if getattr(self, key) < 0:
                raise ValueError(f"algorithm.{key}: expected an int >= 0, got {getattr(self, key)}")
        if self.lr_img <= 0:
            raise ValueError(f"algorithm.lr_img: expected > 0, got {self.lr_img}")


def push(window: Params, params: Params) -> Params:
    """Drop the oldest of the stacked models ``[m+1, ...]`` and append ``params``."""
    return {
        k: torch.cat([window[k][1:], params[k].detach()[None].to(window[k].dtype)]) for k in window
    }


class _Projector(Part):
    """Shared state layout and the distil-then-project step of both variants."""

    prepares = True

    def __init__(self, cfg: ProjectionConfig, lam: float = 0.0, adaptive: bool = True,
                 eval_projected_every: int = 0) -> None:
        self.cfg, self.lam, self.adaptive = cfg, lam, adaptive
        self.eval_every = int(eval_projected_every)
        if self.eval_every < 0:
            raise ValueError(f"algorithm.eval_projected_every: expected an int >= 0, got "
                             f"{eval_projected_every!r}")
        self.input_shape: tuple[int, ...] | None = None
        self.num_classes = 0
        # Diagnostics of the last round, host-side (not checkpointed): MTT and projection
        # seconds, and the projected model to score on the test set (see server_metrics).
        self._timing = {"fedptr_mtt_s": 0.0, "fedptr_proj_s": 0.0}
        self._projected: tuple[int, Params] | None = None
        self._evaluate: Callable[[Params], dict] | None = None

    def bind_eval(self, evaluate: Callable[[Params], dict]) -> None:
        self._evaluate = evaluate

    def _start_round(self) -> None:
        self._timing = dict.fromkeys(self._timing, 0.0)

    def _keep_projected(self, round_: int, anchor: Params, active: bool) -> None:
        """Remember w̃ of round ``round_`` when it is to be scored (every eval_every rounds)."""
        if self.eval_every and active and round_ % self.eval_every == 0:
            self._projected = (round_, {k: v.detach() for k, v in anchor.items()})

    def anchor(self, ctx: RoundContext) -> tuple[Params, torch.Tensor]:
        """(w̃, λ̃) of this client's round (set by the subclass)."""
        raise NotImplementedError

    def client_metrics(self, fin: FinalizeInputs) -> dict:
        """Per layer j: drift ||x_i,j - x_j||, distance ||x_j - w̃_j|| of the global model to
        the projected one, and the prox gradient's norm at the client's final iterate."""
        anchor, lam = self.anchor(fin.ctx)
        x = fin.ctx.global_params
        drift, dist, final = {}, {}, {}
        for k in fin.delta:
            layer = layer_of(k)
            drift[layer] = drift.get(layer, 0.0) + (fin.delta[k] ** 2).sum()
            dist[layer] = dist.get(layer, 0.0) + ((x[k] - anchor[k]) ** 2).sum()
            final[layer] = final.get(layer, 0.0) + ((fin.params[k] - anchor[k]) ** 2).sum()
        out = {}
        for layer in drift:
            gap = final[layer].sqrt()
            prox = lam * (gap > 0).to(gap.dtype) if self.adaptive else lam * gap
            out[f"fedptr_drift/{layer}"] = drift[layer].sqrt()
            out[f"fedptr_anchor_dist/{layer}"] = dist[layer].sqrt()
            out[f"fedptr_prox/{layer}"] = prox
        return out

    def server_metrics(self, server_state: dict, client_states: dict) -> dict:
        out = dict(self._timing)
        if self._projected is not None and self._evaluate is not None:
            round_, params = self._projected
            out["fedptr_projected_accuracy"] = self._evaluate(params)["test_accuracy"]
            out["fedptr_projected_round"] = round_
            self._projected = None
        return out

    def bind_data(self, input_shape: tuple[int, ...], num_classes: int) -> None:
        self.input_shape, self.num_classes = tuple(input_shape), int(num_classes)

    def _template(self, params: Params) -> dict:
        m = self.cfg.window
        dtype = next(iter(params.values())).dtype  # synthetic set and lr in the model's dtype
        state = {
            "window": {
                k: torch.zeros((m + 1, *v.shape), dtype=v.dtype, device=v.device)
                for k, v in params.items()
            },
            "seen": torch.zeros(()),
            "syn_lr": torch.tensor(self.cfg.syn_lr, dtype=dtype),
        }
        if self.input_shape is not None:
            n = self.cfg.ipc * self.num_classes
            state["syn_x"] = torch.zeros((n, *self.input_shape), dtype=dtype)
        return state

    def _labels(self, device) -> torch.Tensor:
        return synthetic_labels(self.num_classes, self.cfg.ipc, device)

    def _advance(
        self, state: dict, params: Params, loss_fn: Callable, seed: int
    ) -> tuple[dict, Params, bool, float, float]:
        """Push x^t; if t > m, refit D̃ by MTT (every ``mtt_every``) and project K steps.

        -> (new state, anchor w̃^{t+1}, active (λ̃ = λ), seconds spent on MTT + projection,
        work in per-sample training-gradient units for the simulated clock: each of the H·R
        unrolled student steps on n images costs ~3 n (its forward/backward, then twice that
        again in the meta-backward), each of the K projection steps n).
        """
        cfg = self.cfg
        state = {**state, "window": push(state["window"], params), "seen": state["seen"] + 1}
        seen = int(state["seen"])  # = t + 1 under full participation (t 0-based)
        if seen < cfg.window + 2:  # t <= m: warm-up
            return state, params, False, 0.0, 0.0
        if "syn_x" not in state:
            raise ValueError(
                f"{self.name}: the synthetic set's shape is unknown; call "
                "algorithm.bind_data(input_shape, num_classes) first (the runner does)"
            )
        t0 = time.perf_counter()
        mtt_s = 0.0
        syn_y = self._labels(state["syn_x"].device)
        syn_x, syn_lr = state["syn_x"], state["syn_lr"]
        n = syn_x.shape[0]
        work = float(cfg.proj_steps * n)
        if (seen - cfg.window - 2) % cfg.mtt_every == 0:
            work += 3.0 * cfg.outer_steps * cfg.inner_steps * n
            start = {k: v[0] for k, v in state["window"].items()}  # w^{t-m} (oldest seen)
            aug = flip_shift(seed) if cfg.augment else None
            res = match_trajectory(
                loss_fn,
                start,
                params,
                syn_x,
                syn_y,
                syn_lr,
                outer_steps=cfg.outer_steps,
                inner_steps=cfg.inner_steps,
                lr_img=cfg.lr_img,
                lr_lr=cfg.lr_lr,
                augment=aug,
            )
            syn_x, syn_lr = res.syn_x, res.syn_lr.to(state["syn_lr"].dtype)
            mtt_s = time.perf_counter() - t0
        with torch.no_grad():
            anchor = student_descent(
                loss_fn,
                {k: v.detach() for k, v in params.items()},
                syn_x,
                syn_y,
                cfg.proj_lr,
                cfg.proj_steps,
            )
        state = {**state, "syn_x": syn_x, "syn_lr": syn_lr}
        sec = time.perf_counter() - t0
        self._timing["fedptr_mtt_s"] += mtt_s
        self._timing["fedptr_proj_s"] += sec - mtt_s
        return state, anchor, True, sec, work


class ClientProjection(_Projector):
    """FedPTR's per-client window, D̃_i and β_i; sets the round's anchor w̃_i and λ̃_i."""

    name = "fedptr"

    def anchor(self, ctx: RoundContext) -> tuple[Params, torch.Tensor]:
        return _client_anchor(ctx)

    def client_init(self, params: Params) -> dict:
        return self._template(params)

    def round_info(self, num_sampled: int, generator: torch.Generator) -> dict:
        return {"fedptr_seed": torch.randint(2**31 - 1, (num_sampled,), generator=generator)}

    def prepare_cohort(self, prep: PrepareInputs) -> tuple[dict, dict, dict]:
        self._start_round()
        stacked = prep.client_states[self.name]
        num = prep.sample_idx.shape[0]
        seeds = prep.info.get("fedptr_seed")
        states, anchors, lams, secs, works = [], [], [], [], []
        for c in range(num):
            seed = int(seeds[c]) if seeds is not None else c
            state = tree_index(stacked, c)
            if int(state["seen"]) == 0 and "syn_x" in state:  # first participation: init D̃_i
                idx = prep.sample_idx[c][prep.weights[c] > 0]  # this round's real samples
                gen = torch.Generator().manual_seed(seed)
                state["syn_x"] = init_synthetic(
                    prep.x_all[idx],
                    prep.y_all[idx],
                    self.num_classes,
                    self.cfg.ipc,
                    gen,
                    self.input_shape,
                ).to(state["syn_x"].dtype)
            state, anchor, active, sec, work = self._advance(
                state, prep.global_params, prep.loss_fn, seed
            )
            works.append(work)
            states.append(state)
            anchors.append(anchor)
            lams.append(self.lam if active else 0.0)
            secs.append(sec)
        dtype = next(iter(prep.global_params.values())).dtype
        dev = prep.sample_idx.device
        info = {
            "fedptr_anchor": tree_stack(anchors),  # [C, ...]
            "fedptr_lam": torch.tensor(lams, dtype=dtype, device=dev),  # [C]
        }
        metrics = {PREP_SECONDS: torch.tensor(secs), PREP_SAMPLES: torch.tensor(works)}
        if self.eval_every:  # the cohort's mean projected model, for server_metrics
            mean = {k: v.mean(0) for k, v in info["fedptr_anchor"].items()}
            self._keep_projected(int(prep.broadcast["round"]), mean, any(lams))
        return tree_stack(states), info, metrics


class ServerProjection(_Projector):
    """FedPTR-S's server-side window, D̃ (noise init) and β; broadcasts w̃^{t+1}."""

    name = "fedptr_s"

    def server_init(self, params: Params) -> dict:
        state = self._template(params)
        state["anchor"] = {k: v.detach().clone() for k, v in params.items()}
        if "syn_x" in state:
            syn = state["syn_x"]  # global RNG: seeded by the run; the template gives the dtype
            state["syn_x"] = torch.randn(syn.shape, dtype=syn.dtype, device=syn.device)
        return state

    def broadcast(self, server_state: dict) -> dict:
        return {"anchor": server_state["anchor"]}

    def anchor(self, ctx: RoundContext) -> tuple[Params, torch.Tensor]:
        return _server_anchor(self.lam)(ctx)

    def server_prepare(self, params, server_state, loss_fn) -> tuple[dict, dict]:
        self._start_round()
        seed = int(server_state["seen"])
        state, anchor, active, sec, work = self._advance(server_state, params, loss_fn, seed)
        state["anchor"] = {k: v.detach() for k, v in anchor.items()}
        self._keep_projected(seed + 1, state["anchor"], active)  # seen before = rounds - 1
        return state, {
            SERVER_PREP_SECONDS: torch.tensor(sec),
            SERVER_PREP_SAMPLES: torch.tensor(work),
        }


def _client_anchor(ctx: RoundContext) -> tuple[Params, torch.Tensor]:
    return ctx.info["fedptr_anchor"], ctx.info["fedptr_lam"]  # set by ClientProjection


def _server_anchor(lam: float) -> AnchorFn:
    def fn(ctx):
        anchor, x = ctx.broadcast["fedptr_s"]["anchor"], ctx.global_params
        moved = torch.stack([(anchor[k] != x[k]).any() for k in x]).any()  # w̃ ≠ w^t: t > m
        return anchor, moved.to(next(iter(x.values())).dtype) * lam

    return fn


def _build(
    name: str,
    server_side: bool,
    local_lr,
    lam,
    adaptive,
    client_optimizer,
    local_momentum,
    weight_decay,
    eval_projected_every=0,
    **mtt,
) -> Algorithm:
    if lam < 0:
        raise ValueError(f"algorithm.lam: expected lam >= 0, got {lam}")
    cfg = ProjectionConfig(**mtt)
    kind_of = ServerProjection if server_side else ClientProjection
    part = kind_of(cfg, lam, adaptive, eval_projected_every)
    anchor = _server_anchor(lam) if server_side else _client_anchor
    opt = local_optimizer(
        client_optimizer, local_lr, momentum=local_momentum, weight_decay=weight_decay
    )
    kind = "layer-adaptive" if adaptive else "fixed"
    where = "server-side MTT (one noise-initialised D̃)" if server_side else "client-side MTT"
    return Algorithm(
        name,
        chain(add_layer_prox(anchor, adaptive=adaptive), opt),
        server_sgd(1.0),
        parts=(part,),
        description=f"{'FedPTR-S' if server_side else 'FedPTR'} (Chen et al. 2023): {where}, "
        f"{kind} prox towards the projected model",
        hparams={"lam": lam, "adaptive": adaptive, "eval_projected_every": eval_projected_every,
                 **mtt},
    )


@defaults_from("fedptr")
def fedptr(
    local_lr: ScheduleLike, lam: float, adaptive: bool, client_optimizer: str,
    local_momentum: float, weight_decay: ScheduleLike, window: int, ipc: int, outer_steps: int,
    inner_steps: int, syn_lr: float, lr_img: float, lr_lr: float, proj_steps: int,
    proj_lr: float, mtt_every: int, augment: bool, eval_projected_every: int,
) -> Algorithm:
    """FedPTR, client-side (Algorithm 2); the defaults follow Sec. 5.1 and MTT's code, each
    with its source in ``fedforge algorithms --params fedptr``.
    ``eval_projected_every = n`` scores the projected model w̃ on the test set every n rounds
    (``fedptr_projected_accuracy``; FedPTR: the cohort's mean w̃_i)."""
    return _build("fedptr", False, **locals())  # locals() here = exactly the parameters


def fedptr_s(**hparams) -> Algorithm:
    """FedPTR-S, server-side (Algorithm 3); same hyper-parameters and defaults as
    :func:`fedptr`."""
    bound = inspect.signature(fedptr).bind(**hparams)  # unknown names raise TypeError
    bound.apply_defaults()
    return _build("fedptr_s", True, **bound.arguments)


fedptr_s.__signature__ = inspect.signature(fedptr)  # the registry reads hparams from it
