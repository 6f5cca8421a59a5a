"""The client's local round as one pure function of tensors.

``make_local_update`` builds ``local_update(global_params, broadcast, client_state, info, xs,
ys, ws)`` for one client. It has no Python state, no RNG and no data-dependent control flow,
so ``LoopEngine`` calls it per client and ``VmapEngine`` vmaps it over a chunk of clients;
both must agree to float tolerance.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from fedforge.algorithms.base import Algorithm, FinalizeInputs
from fedforge.algorithms.personal.batch import StepBatch, with_step_batch
from fedforge.client.transforms import RoundContext, clip_statistics, local_step
from fedforge.core.tree import (
    Params,
    tree_map2,
    tree_sub,
    tree_where,
    tree_zeros_like,
    upcast,
)
from fedforge.engine.pooling import TiledPoolMode
from fedforge.engine.randomness import CLIENT_KEY, KeyedRandomness, is_keyed, no_key

LossFn = Callable[[Params, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


class LocalResult(NamedTuple):
    delta: Params  # x^t - x_i (server minus client); the codec's message when one is set
    client_state: dict  # new persistent state of this client
    uploads: dict  # extra tensors averaged over the cohort (by part name)
    metrics: dict  # {"loss": mean local loss, "steps": steps taken}


PRECISIONS = ("fp32", "bf16", "tf32")


def has_shared_tensors(model: nn.Module) -> bool:
    """Whether one parameter or buffer appears under two names (tied weights)."""
    named = [*model.named_parameters(remove_duplicate=False),
             *model.named_buffers(remove_duplicate=False)]
    return len({id(t) for _, t in named}) != len(named)


class ClassificationLoss:
    """Masked mean cross-entropy of ``model``'s logits: ``sum_b w_b CE_b / max(sum_b w_b, 1)``.

    A module-level class rather than a closure so that it pickles with its model: the
    ``procs`` engine sends it to its worker processes once (:mod:`fedforge.engine.procs`).
    Called as ``loss(params, x, y, w)``; build it with :func:`classification_loss`.
    """

    def __init__(self, model: nn.Module, precision: str = "fp32") -> None:
        if precision not in PRECISIONS:
            raise ValueError(
                f"engine.precision: expected one of {PRECISIONS}, got {precision!r}")
        self.model = model
        self.precision = precision
        # a model with max-pooling layers pools by strided maxima in eager runs (torch.compile
        # brings its own kernels); any other model skips the mode, which costs every op a
        # Python call (8 % of a small text model's update on a CPU)
        self.tiled_pooling = any(isinstance(m, nn.MaxPool2d) for m in model.modules())
        # re-tying shared weights walks the modules on every call (10 us of a small text
        # model's 20 us ``functional_call`` overhead on a CPU); only a model sharing one needs it
        self.tied = has_shared_tensors(model)

    def __call__(self, params: Params, x: torch.Tensor, y: torch.Tensor,
                 w: torch.Tensor) -> torch.Tensor:
        pooling = (TiledPoolMode() if self.tiled_pooling and not torch.compiler.is_compiling()
                   else nullcontext())
        with pooling:
            if self.precision == "bf16":
                with torch.autocast(x.device.type, dtype=torch.bfloat16):
                    logits = torch.func.functional_call(self.model, params, (x,),
                                                        tie_weights=self.tied)  # [B, C]
            else:  # no autocast region at all: one, even disabled, stops the compile cache
                logits = torch.func.functional_call(self.model, params, (x,),
                                                    tie_weights=self.tied)
        per_sample = F.cross_entropy(upcast(logits), y, reduction="none")  # [B]
        return (per_sample * w).sum() / w.sum().clamp_min(1.0)


def classification_loss(model: nn.Module, precision: str = "fp32") -> LossFn:
    """Masked mean cross-entropy: ``sum_b w_b CE_b / max(sum_b w_b, 1)``.

    ``precision="bf16"`` runs the model's forward (and so its backward) under bf16 autocast
    on the inputs' device — on CPUs with AMX and on GPUs this roughly halves step time;
    parameters, the loss and every optimizer state stay fp32. ``"tf32"`` is set globally by
    :func:`set_matmul_precision`, not here. The result is a :class:`ClassificationLoss`, which
    can be pickled (worker processes of the ``procs`` engine).
    """
    return ClassificationLoss(model, precision)


def set_matmul_precision(precision: str) -> None:
    """``tf32`` lets CUDA matmuls/convs use TensorFloat-32 (``"high"``); others keep fp32."""
    torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
    torch.backends.cudnn.allow_tf32 = precision == "tf32"
    torch.set_float32_matmul_precision("high" if precision == "tf32" else "highest")


def autograd_grad_and_value(loss_fn: LossFn) -> Callable:
    """``torch.func.grad_and_value`` for one client outside any transform, through ordinary
    autograd: the same kernels and gradients, without functorch's per-call wrapping, which
    costs about a quarter of a small conv net's step on a CPU (benchmarks/RESULTS.md)."""

    def grad_and_value(params: Params, x, y, w):
        leaves = {k: v.detach().requires_grad_(True) for k, v in params.items()}
        with torch.enable_grad():
            loss = loss_fn(leaves, x, y, w)
            grads = torch.autograd.grad(loss, list(leaves.values()), allow_unused=True)
        return ({k: torch.zeros_like(v) if g is None else g
                 for (k, v), g in zip(leaves.items(), grads, strict=True)}, loss.detach())

    return grad_and_value


def make_local_update(
    algorithm: Algorithm, loss_fn: LossFn, *, masked: bool, functional: bool = True,
    engine: str = "loop",
) -> Callable:
    """Build the pure local-round function of ``algorithm``.

    Args:
      masked: some steps of some clients are padding (all weights zero); such steps leave
        parameters and optimizer state unchanged. ``False`` skips the selects (faster).
      functional: gradients through ``torch.func`` (needed under ``vmap``); ``False`` uses
        plain autograd, for an engine that runs one client at a time.
      engine: the engine's name, for the one-line refusal of a random layer it cannot key.

    A model with dropout layers draws its masks from the client's key in the round inputs
    (``info[CLIENT_KEY]``, see :mod:`fedforge.engine.randomness`), the step and the layer,
    so every engine draws the same masks; without a key every client gets key 0.
    """
    grad_and_loss = (torch.func.grad_and_value(loss_fn) if functional
                     else autograd_grad_and_value(loss_fn))
    opt = algorithm.local_optimizer
    keep_grad_sum = algorithm.needs_grad_sum
    privacy = algorithm.privacy  # fedforge.privacy: DP-SGD, clipped deltas
    # personalised FL (fedforge.algorithms.personal): where the round starts, what is sent
    personal = algorithm.personal
    # a spec whose steps take gradients at other points on the step's batch (APFL, pFedMe)
    batch_access = personal is not None and personal.step_batch
    keyed = is_keyed(loss_fn)  # dropout layers: masks from (client key, step, layer)

    def randomness(key: torch.Tensor | None, step: int):
        return KeyedRandomness(key, step, engine) if keyed else nullcontext()

    def local_update(global_params, broadcast, client_state, info, xs, ys, ws) -> LocalResult:
        # xs: [steps, batch, ...], ys: [steps, batch], ws: [steps, batch]
        ctx = RoundContext(global_params, broadcast, client_state, info)
        step_grad = None if privacy is None else privacy.step_grad(grad_and_loss, loss_fn, info)
        key = info.get(CLIENT_KEY) if keyed else None
        if keyed and key is None:
            key = no_key(ws.device)

        def train(params, opt, ctx, passes=1):  # the masked step loop, ``passes`` times over
            state = opt.init(params, ctx)
            dtype = next(iter(params.values())).dtype  # float64 runs count in float64
            loss_sum = torch.zeros((), dtype=dtype, device=ws.device)
            steps = torch.zeros((), dtype=dtype, device=ws.device)
            grad_sum = tree_zeros_like(params) if keep_grad_sum else None
            for k in [k for _ in range(passes) for k in range(xs.shape[0])]:
                with randomness(key, k):
                    grads, loss = (grad_and_loss(params, xs[k], ys[k], ws[k])
                                   if step_grad is None
                                   else step_grad(params, xs[k], ys[k], ws[k], k))
                step_ctx = ctx
                if batch_access:
                    def batch_grad(at, weights=None, k=k):
                        with randomness(key, k):
                            return grad_and_loss(at, xs[k], ys[k],
                                                 ws[k] if weights is None else weights)[0]
                    step_ctx = with_step_batch(ctx, StepBatch(batch_grad, ys[k], ws[k], ys, ws))
                new_params, new_state = local_step(opt, grads, state, params, step_ctx)
                if masked:
                    active = ws[k].sum() > 0
                    params = tree_where(active, new_params, params)
                    state = tree_where(active, new_state, state)
                    a = active.to(loss.dtype)
                else:
                    params, state, a = new_params, new_state, 1.0
                loss_sum = loss_sum + a * loss.detach()
                steps = steps + a
                if grad_sum is not None:
                    grad_sum = tree_map2(lambda s, g, a=a: s + a * g, grad_sum, grads)
            return params, state, loss_sum, steps, grad_sum

        start = global_params
        if personal is not None:  # the shared leaves + the client's own; earlier phases
            start, ctx = personal.begin(train, ctx)
        params, state, loss_sum, steps, grad_sum = train(start, opt, ctx)
        delta = tree_sub(global_params, params)
        if personal is not None:  # the client's own leaves are never sent
            delta = personal.shared(delta)
        if privacy is not None:  # clipped (central) or clipped and noised (local) upload
            delta, dp_uploads = privacy.client_delta(delta, broadcast, info)
            if personal is not None:  # kept leaves carry no data: no local noise either
                delta = personal.shared(delta)
        fin = FinalizeInputs(ctx, delta, params, state, grad_sum, steps)
        new_client_state, uploads = algorithm.finalize(fin)
        if privacy is not None:
            uploads = {**uploads, **dp_uploads}
        if algorithm.codec is not None:  # uplink codec: the engine averages the message
            delta, codec_state = algorithm.codec.encode(
                delta, client_state.get("codec", {}), ctx)
            if codec_state:
                new_client_state = {**new_client_state, "codec": codec_state}
        metrics = {"loss": loss_sum / steps.clamp_min(1.0), "steps": steps}
        diagnostics = {**algorithm.client_metrics(fin), **clip_statistics(state, steps)}
        if diagnostics:  # parts' per-client diagnostics, logged as cohort means
            metrics["parts"] = diagnostics
        return LocalResult(delta, new_client_state, uploads, metrics)

    return local_update
