"""What the methods whose local optimizer keeps the client's personal state share.

APFL's ``v_i`` and ``α_i``, pFedMe's ``θ_i`` and FedRoD's personal head are updated inside
the local step (they need the step's batch, :mod:`.batch`), so they live in the local
optimizer's state during the round: it starts from the client store (``init`` reads
``ctx.client_state``) and :class:`OptimizerStatePart` writes its final value back.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

import torch

from fedforge.algorithms.personal.base import NAME, Personal, PersonalAlgorithm, Train
from fedforge.client.transforms import RoundContext, Transform
from fedforge.core.schedules import ScheduleLike
from fedforge.core.tree import Params
from fedforge.protocol.algorithm import FinalizeInputs, Part
from fedforge.server.optimizers import server_sgd

StepFn = Callable[[Params, dict, Params, RoundContext], tuple[Params, dict]]


@dataclass(frozen=True)
class BatchPersonal(Personal):
    """A spec whose local steps read the step's batch; the shared round starts from the
    global model (the personal state is the optimizer's, not leaves of the model)."""

    step_batch: ClassVar[bool] = True

    def begin(self, train: Train, ctx: RoundContext) -> tuple[Params, RoundContext]:
        return ctx.global_params, ctx


class PersonalStatePart(Part):
    """The client's personal state in the client store (under the personal name, nothing
    uploaded), started by ``init(params)``; a subclass's ``finalize`` says what it keeps."""

    name = NAME
    sends_uploads = False

    def __init__(self, init: Callable[[Params], dict]) -> None:
        self.init = init

    def client_init(self, params: Params) -> dict:
        return self.init(params)


class OptimizerStatePart(PersonalStatePart):
    """Keeps, in the client store, the entries ``init(params)`` names, read back from the
    local optimizer's final state (the same keys, top level)."""

    def finalize(self, fin: FinalizeInputs) -> tuple[dict, dict]:
        return {k: fin.opt_state[k] for k in fin.ctx.client_state.get(NAME, {})}, {}


def stepping(name: str, init: Callable[[Params, RoundContext], dict], step: StepFn
             ) -> Transform:
    """A local optimizer given by its whole step ``(grads, state, params, ctx) -> (new
    params, new state)``; its additive update is derived from it."""

    def update(grads, state, params, ctx):
        new, state = step(grads, state, params, ctx)
        return {k: new[k] - params[k] for k in params}, state

    return Transform(name, init, update, step)


def own_state_algorithm(name: str, local_optimizer: Transform, spec: Personal,
                        init: Callable[[Params], dict], description: str,
                        server_lr: ScheduleLike = 1.0) -> PersonalAlgorithm:
    """A personalised method whose personal state lives in its local optimizer's state,
    over FedAvg's server (sample-weighted mean of the deltas, step ``server_lr``)."""
    return PersonalAlgorithm(name, local_optimizer, server_sgd(server_lr),
                             parts=(OptimizerStatePart(init),), description=description,
                             aggregation="num_samples", personal=spec)


def clone(params: Params, names=None) -> Params:
    """Detached copies of ``params`` (of ``names`` only, when given)."""
    return {k: v.detach().clone() for k, v in params.items() if names is None or k in names}


def scalar(value: float, like: Params) -> torch.Tensor:
    """A 0-d tensor of the model's dtype and device."""
    ref = next(iter(like.values()))
    return torch.tensor(float(value), dtype=ref.dtype, device=ref.device)
