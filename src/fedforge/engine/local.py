"""The client's local round as one pure function of tensors.

``make_local_update`` builds ``local_update(global_params, broadcast, client_state, info, xs,
ys, ws)`` for one client: one plain step loop (:func:`run_steps`) wrapped by a chain of
stages (:mod:`fedforge.engine.stages`: dropout keys, padding, personal parameters, privacy,
the algorithm's parts, the codec). It has no Python state, no RNG and no data-dependent
control flow, so ``LoopEngine`` calls it per client and ``VmapEngine`` vmaps it over a chunk
of clients; every engine builds it with :func:`local_update_of`, and all must agree to float
tolerance.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from fedforge.client.transforms import (
    RoundContext,
    Transform,
    clip_statistics,
    local_step,
    step_in_place,
    steps_in_place,
)
from fedforge.core.tree import Params, tree_map2, tree_sub, tree_zeros_like, upcast
from fedforge.engine.draw import CohortMetrics
from fedforge.engine.pooling import route_max_pooling
from fedforge.engine.rounding import BF16_PRECISIONS, STOCHASTIC
from fedforge.engine.stages import (
    Batch,
    Chain,
    ClientData,
    GradFn,
    Local,
    LossFn,
    Step,
    Trained,
    Upload,
    local_stages,
    plain_step,
)
from fedforge.engine.targets import ALL_POSITIONS, per_position, sequence_loss
from fedforge.protocol.algorithm import Algorithm


class LocalResult(NamedTuple):
    delta: Params  # x^t - x_i (server minus client); the codec's message when one is set
    client_state: dict  # new persistent state of this client
    uploads: dict  # extra tensors averaged over the cohort (by part name)
    metrics: CohortMetrics  # this client's row: mean local loss, steps taken, diagnostics


PRECISIONS = ("fp32", "bf16", "tf32", STOCHASTIC)


def has_shared_tensors(model: nn.Module) -> bool:
    """Whether one parameter or buffer appears under two names (tied weights)."""
    named = [*model.named_parameters(remove_duplicate=False),
             *model.named_buffers(remove_duplicate=False)]
    return len({id(t) for _, t in named}) != len(named)


class ClassificationLoss:
    """Masked mean cross-entropy of ``model``'s logits: ``sum_b w_b CE_b / max(sum_b w_b, 1)``;
    for next-token targets ``y [B, T]``, the mean over the scored tokens of the weighted
    sequences (:mod:`fedforge.engine.targets`).

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
        # a model's max-pooling layers pool by strided maxima in eager runs (torch.compile
        # brings its own kernels): the layers' class changes, so no mode around the forward
        # pass costs every op a Python call (8 % of a small text model's update on a CPU)
        self.tiled_pooling = route_max_pooling(model)
        # re-tying shared weights walks the modules on every call (10 us of a small text
        # model's 20 us ``functional_call`` overhead on a CPU); only a model sharing one needs it
        self.tied = has_shared_tensors(model)

    def __call__(self, params: Params, x: torch.Tensor, y: torch.Tensor,
                 w: torch.Tensor) -> torch.Tensor:
        kwargs = ALL_POSITIONS if per_position(y) else None  # next-token targets [B, T]
        if self.precision in BF16_PRECISIONS:
            with torch.autocast(x.device.type, dtype=torch.bfloat16):
                logits = torch.func.functional_call(self.model, params, (x,), kwargs,
                                                    tie_weights=self.tied)  # [B, C]
        else:  # no autocast region at all: one, even disabled, stops the compile cache
            logits = torch.func.functional_call(self.model, params, (x,), kwargs,
                                                tie_weights=self.tied)
        if kwargs is not None:
            return sequence_loss(logits, y, w)  # mean NLL over the scored tokens
        per_sample = F.cross_entropy(upcast(logits), y, reduction="none")  # [B]
        return (per_sample * w).sum() / w.sum().clamp_min(1.0)


def classification_loss(model: nn.Module, precision: str = "fp32") -> LossFn:
    """Masked mean cross-entropy: ``sum_b w_b CE_b / max(sum_b w_b, 1)``.

    ``precision="bf16"`` runs the model's forward (and so its backward) under bf16 autocast
    on the inputs' device — on CPUs with AMX and on GPUs this roughly halves step time;
    parameters, the loss and every optimizer state stay fp32. ``"bf16_sr"`` adds bf16 weights
    with stochastic rounding in the local round (:mod:`fedforge.engine.rounding`). ``"tf32"``
    is set globally by :func:`set_matmul_precision`, not here. The result is a
    :class:`ClassificationLoss`, which can be pickled (worker processes of the ``procs``
    engine).
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
    costs about a quarter of a small conv net's step on a CPU (benchmarks/history/)."""

    def grad_and_value(params: Params, x, y, w):
        # the in-place loop's parameters are already leaves: marked once per round
        leaves = {k: v if v.is_leaf and v.requires_grad else v.detach().requires_grad_(True)
                  for k, v in params.items()}
        with torch.enable_grad():
            loss = loss_fn(leaves, x, y, w)
            grads = torch.autograd.grad(loss, list(leaves.values()), allow_unused=True)
        return ({k: torch.zeros_like(v) if g is None else g
                 for (k, v), g in zip(leaves.items(), grads, strict=True)}, loss.detach())

    return grad_and_value


def run_steps(step: Step, optimizer: Transform, start: Params, ctx: RoundContext,
              data: ClientData, passes: int = 1, in_place: bool = False) -> Trained:
    """The plain step loop, ``passes`` times over the client's batches: each step a gradient
    and one step of ``optimizer``, as the stages made ``step``.

    ``in_place``: the round trains its own copy of ``start``, marked as autograd leaves once
    and updated in place (:func:`~fedforge.client.transforms.step_in_place`), as a plain
    module's optimizer does, instead of a new model and new leaves every step; the same
    kernels, so the same bits. Only where nothing keeps a step's parameters."""
    params, state = start, optimizer.init(start, ctx)
    if in_place:
        params = {k: v.detach().clone().requires_grad_(True) for k, v in start.items()}
    dtype = next(iter(params.values())).dtype  # float64 runs count in float64
    loss_sum = torch.zeros((), dtype=dtype, device=data.ws.device)
    steps = torch.zeros((), dtype=dtype, device=data.ws.device)
    grad_sum = tree_zeros_like(params) if step.grad_sum else None
    for _ in range(passes):
        for k in range(data.xs.shape[0]):
            batch = Batch(k, data.xs[k], data.ys[k], data.ws[k])
            with step.around(batch):
                grads, loss = step.grad(params, batch)
            after = _step(optimizer, grads, state, params, step.context(ctx, batch), in_place)
            (params, state), a = step.accept(batch, Local(params, state), after, loss)
            loss_sum = loss_sum + a * loss.detach()
            steps = steps + a
            if grad_sum is not None:
                grad_sum = tree_map2(lambda s, g, a=a: s + a * g, grad_sum, grads)
    if in_place:
        params = {k: v.detach() for k, v in params.items()}
    return Trained(params, state, loss_sum, steps, grad_sum)


def _step(optimizer: Transform, grads: Params, state: dict, params: Params,
          ctx: RoundContext, in_place: bool) -> Local:
    """One step of ``optimizer``: into ``params`` (``in_place``, without autograd: they are
    leaves), or as new tensors."""
    if not in_place:
        return Local(*local_step(optimizer, grads, state, params, ctx))
    with torch.no_grad():
        return Local(params, step_in_place(optimizer, grads, state, params, ctx))


def make_local_update(optimizer: Transform, loss_grad: GradFn, stages: Chain,
                      in_place: bool = False) -> Callable:
    """Build the pure local-round function: the step loop of ``optimizer`` (the algorithm's
    local optimizer) on the gradients of ``loss_grad``, wrapped by ``stages``
    (:mod:`fedforge.engine.stages`). The client's delta ``x^t - x_i`` is defined here.
    ``in_place``: update in place where neither the stages nor the optimizer trained keep a
    step's parameters (:func:`run_steps`)."""
    in_place = in_place and not stages.keeps_params

    def local_update(global_params, broadcast, client_state, info, xs, ys, ws) -> LocalResult:
        # xs: [steps, batch, ...], ys: [steps, batch], ws: [steps, batch]
        ctx = RoundContext(global_params, broadcast, client_state, info)
        data = ClientData(xs, ys, ws)
        step = stages.step(plain_step(loss_grad), ctx, data)

        def train(start: Params, opt: Transform, ctx: RoundContext, passes: int = 1) -> Trained:
            return run_steps(step, opt, start, ctx, data, passes,
                             in_place and steps_in_place(opt))

        start, ctx = stages.begin(global_params, ctx, train)
        trained = train(start, optimizer, ctx)
        sent = stages.finish(Upload(tree_sub(global_params, trained.params), {}, {}, {}),
                             trained, ctx)
        metrics = CohortMetrics(  # parts' per-client diagnostics are logged as cohort means
            trained.loss_sum / trained.steps.clamp_min(1.0), trained.steps,
            {**sent.diagnostics, **clip_statistics(trained.opt_state, trained.steps)})
        return LocalResult(sent.delta, sent.client_state, sent.uploads, metrics)

    return local_update


def local_update_of(algorithm: Algorithm, loss_fn: LossFn, *, masked: bool,
                    functional: bool = True, engine: str = "loop",
                    in_place: bool = False) -> Callable:
    """``algorithm``'s local round: its local optimizer through the chain of
    :func:`~fedforge.engine.stages.local_stages` (every engine builds it here).

    Args:
      masked: some steps of some clients are padding (all weights zero); such steps leave
        parameters and optimizer state unchanged. ``False`` skips the selects (faster).
      functional: gradients through ``torch.func`` (needed under ``vmap``); ``False`` uses
        plain autograd, for an engine that runs one client at a time.
      engine: the engine's name, for the one-line refusal of a random layer it cannot key.
      in_place: update the parameters in place where nothing keeps a step's (only with
        ``functional=False``: one client outside any transform); the same numbers.
    """
    loss_grad = (torch.func.grad_and_value(loss_fn) if functional
                 else autograd_grad_and_value(loss_fn))
    return make_local_update(algorithm.local_optimizer, loss_grad,
                             local_stages(algorithm, loss_fn, masked=masked, engine=engine),
                             in_place=in_place and not functional)
