"""FedRoD (Chen & Chao, "On Bridging Generic and Personalized Federated Learning for Image
Classification", ICLR 2022).

The shared model (body + generic head) is trained with the balanced softmax, a client's
cross-entropy with its logits shifted by the log of its label counts n_c; beside it the
client's personal head is trained on the sum of the generic logits (fixed) and its own,
with the body's features fixed. Each local step, at the step's starting point:

    w   <- w - η ∇_w CE(z_g(w) + log n; ξ)          (balanced softmax, all of w)
    h_i <- h_i - η ∇_h CE(z_g(w) + z_h(h_i); ξ)     (personal head only)

The client's model outputs ``z_g + z_h``. For a head that is one affine layer (every zoo
model's), ``z_g + z_h`` is the head with weights ``W_g + W_h`` and bias ``b_g + b_h``, so
both gradients are the model's gradient at shifted parameters: the balanced softmax's at the
head bias plus ``log n``, the personal head's at the summed head.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from fedforge.algorithms.defaults import defaults_from
from fedforge.algorithms.personal.base import NAME, PersonalAlgorithm, Phase
from fedforge.algorithms.personal.split import head_names
from fedforge.algorithms.personal.stateful import (
    BatchPersonal,
    clone,
    own_state_algorithm,
    stepping,
)
from fedforge.client.optimizers import local_optimizer
from fedforge.client.transforms import at_round, local_step
from fedforge.core.schedules import ScheduleLike, as_schedule
from fedforge.core.tree import Params
from fedforge.protocol.step_batch import StepBatch, step_batch

ABSENT = -1e4
"""log n_c of a class the client has no sample of: its softmax share is exactly zero (the
official codes' log 0 = -inf, without infinities in the parameters)."""


def head_bias(params: Params, patterns: Sequence[str] | None) -> str:
    """The head's bias: its one 1-d parameter (one per class)."""
    biases = [n for n in head_names(list(params), patterns) if params[n].dim() == 1]
    if len(biases) != 1:
        raise ValueError(f"fedrod: the model's head needs exactly one bias (one logit per "
                         f"class) for the balanced softmax, found {biases}")
    return biases[0]


def log_counts(batch: StepBatch, classes: int, dtype: torch.dtype) -> torch.Tensor:
    """log n_c over the round's batches (0/1 weights: the samples the round trains on)."""
    hits = batch.round_labels.unsqueeze(-1) == torch.arange(classes,
                                                            device=batch.round_labels.device)
    counts = (hits.to(dtype) * batch.round_weights.unsqueeze(-1).to(dtype)).sum((0, 1))
    return torch.where(counts > 0, counts.clamp_min(1.0).log(),
                       torch.full_like(counts, ABSENT))


@dataclass(frozen=True)
class FedRoDSpec(BatchPersonal):
    """The evaluated model: the global one with its head plus the client's personal head."""

    def client_params(self, global_params: Params, state: dict) -> Params:
        mine = state.get(NAME, {}).get("head", {})
        return {k: g + mine[k] if k in mine else g for k, g in global_params.items()}


@defaults_from("fedrod")
def fedrod(local_lr: ScheduleLike, client_optimizer: str, weight_decay: ScheduleLike,
           max_grad_norm: ScheduleLike | None, nar: bool, head: Sequence[str] | None
           ) -> PersonalAlgorithm:
    """FedRoD: the shared model on the balanced softmax; the personal head (plain SGD,
    ``local_lr``) on the summed logits; the personal head starts as the initial head."""
    patterns = None if head is None else tuple(head)
    opt = local_optimizer(client_optimizer, local_lr, weight_decay=weight_decay,
                          max_grad_norm=max_grad_norm, nar=nar)
    lr = as_schedule(local_lr, "local_lr")

    def init(params, ctx):
        return {"base": opt.init(params, ctx), "head": ctx.client_state[NAME]["head"]}

    def step(grads, state, params, ctx):
        del grads  # both gradients are at shifted parameters
        batch, mine, bias = step_batch(ctx, "fedrod"), state["head"], head_bias(params, patterns)
        prior = log_counts(batch, params[bias].shape[0], params[bias].dtype)
        g = batch.grad({**params, bias: params[bias] + prior})
        both = batch.grad({**params, **{k: params[k] + h for k, h in mine.items()}})
        eta = at_round(lr, ctx)
        new_head = {k: h - eta * both[k] for k, h in mine.items()}
        new_w, base = local_step(opt, g, state["base"], params, ctx)
        return new_w, {"base": base, "head": new_head}

    def client_init(params):
        head_bias(params, patterns)  # a head without one bias is refused before training
        return {"head": clone(params, head_names(list(params), patterns))}

    spec = FedRoDSpec(head=patterns, finetune=Phase(opt))
    return own_state_algorithm(
        "fedrod", stepping("fedrod", init, step), spec, client_init,
        "FedRoD (Chen & Chao 2022): balanced-softmax generic model + personal head")
