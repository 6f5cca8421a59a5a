"""The step's batch, for methods whose local step needs more than one gradient.

APFL (the mixed model's gradient beside the shared model's), pFedMe (K inner steps on one
batch), Per-FedAvg (gradients on parts of the batch at other points), FedRoD (the balanced
softmax and the personal head's loss) evaluate the loss gradient at points other than the
loop's parameters, on the same batch. A spec that sets ``step_batch`` gets, in every local
step, a :class:`StepBatch` in ``ctx.info`` under :data:`STEP_BATCH`; its local optimizer reads
it with :func:`step_batch`. The engine builds it and never names a method.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import NamedTuple

import torch

from fedforge.client.transforms import RoundContext
from fedforge.core.tree import Params

STEP_BATCH = "step_batch"


class StepBatch(NamedTuple):
    """One local step's data: ``grad(params, weights=None)`` is the gradient of the masked
    mean loss at ``params`` on this step's batch (``weights`` [B] reweights its samples; a
    part of the batch is a 0/1 mask); the labels and weights of this step and of the round;
    its inputs."""

    grad: Callable[..., Params]
    labels: torch.Tensor  # [B]
    weights: torch.Tensor  # [B], 0 = padding
    round_labels: torch.Tensor  # [steps, B]
    round_weights: torch.Tensor  # [steps, B]
    # the step's inputs [B, ...] and the context every model evaluation on them runs in (the
    # step's dropout masks), for a step that evaluates the model itself (FedProto's features)
    x: torch.Tensor | None = None
    around: Callable[[], AbstractContextManager] = nullcontext


def with_step_batch(ctx: RoundContext, batch: StepBatch) -> RoundContext:
    """``ctx`` for one local step, carrying its batch."""
    return ctx._replace(info={**ctx.info, STEP_BATCH: batch})


def step_batch(ctx: RoundContext, name: str) -> StepBatch:
    """The step's batch; a one-line error when the engine gave none (the spec lacks
    ``step_batch``, or the optimizer runs outside a local round)."""
    batch = ctx.info.get(STEP_BATCH)
    if batch is None:
        raise ValueError(f"algorithm {name!r}: its local step needs the step's batch "
                         "(a personal spec with step_batch = True)")
    return batch
