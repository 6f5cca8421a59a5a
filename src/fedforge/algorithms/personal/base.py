"""Personalised FL: what a method keeps per client and how a client's local round uses it.

A personalised method is an ordinary :class:`~fedforge.protocol.algorithm.Algorithm` (local
optimizer, parts, server optimizer) plus a :class:`Personal` spec. The spec says

* ``kept``: which leaves of the shared model are the client's own (:data:`split.PARTS`:
  FedPer's head, LG-FedAvg's body, Local-only's whole model). They live in the client store
  under the part ``personal``, the client's round starts from them instead of the global
  values, and their delta is zero (they are never sent);
* ``first``: an optional phase run before the shared round on the same batches (FedRep's head
  epochs), whose result is where the shared round starts;
* ``side``: an optional separate personal model trained beside the shared round (Ditto's
  ``v_i``), stored whole in the client store;
* ``finetune``: evaluation-time fine-tuning (FedAvg-FT, FedBABU, and every held-out client).

The engine knows none of this: its local round asks ``algorithm.personal`` (the typed field
:attr:`fedforge.protocol.algorithm.Algorithm.personal`, None for other algorithms) where to
start (:meth:`Personal.begin`) and which delta to send (:meth:`Personal.shared`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import ClassVar, NamedTuple

import torch

from fedforge.algorithms.personal.split import PARTS, freeze, select
from fedforge.client.transforms import RoundContext, Transform, chain
from fedforge.core.tree import Params
from fedforge.protocol.algorithm import Algorithm, FinalizeInputs, Part
from fedforge.server.optimizers import server_sgd

NAME = "personal"  # the client-store part holding personal leaves / the personal model


class Phase(NamedTuple):
    """``passes`` runs over the round's batches with ``optimizer`` (a local-optimizer chain)."""

    optimizer: Transform
    passes: int = 1


# train(start, optimizer, ctx, passes) -> (params, optimizer state, loss sum, steps, grad
# sum): the engine's masked step loop over the client's round batches, ``passes`` times (the
# same loop as the shared round's)
Train = Callable[[Params, Transform, RoundContext, int], tuple]


@dataclass(frozen=True)
class Personal:
    """How a personalised method uses the client's own parameters (see the module doc)."""

    kept: str = "none"
    head: tuple[str, ...] | None = None  # the split's patterns (None: the model's last layer)
    first: Phase | None = None
    side: Phase | None = None
    finetune: Phase | None = None  # its optimizer; the steps come from finetune_steps
    finetune_part: str = "all"  # which leaves evaluation-time fine-tuning changes
    finetune_steps: int = 0  # method's own evaluation-time steps (FedAvg-FT, FedBABU)
    # its local step takes gradients at other points of the step's batch (protocol/step_batch.py)
    step_batch: ClassVar[bool] = False

    def __post_init__(self) -> None:
        for key in ("kept", "finetune_part"):
            if getattr(self, key) not in PARTS:
                raise ValueError(f"personal.{key}: expected one of {PARTS}, "
                                 f"got {getattr(self, key)!r}")
        if self.kept != "none" and self.side is not None:
            raise ValueError("personal: a method keeps either leaves of the shared model or a "
                             "separate personal model, not both")
        if self.finetune_steps < 0:
            raise ValueError(f"algorithm.finetune_steps: expected >= 0, got "
                             f"{self.finetune_steps}")

    def kept_names(self, params: Params) -> frozenset[str]:
        return select(params, self.kept, self.head)

    # --- the client store --------------------------------------------------------------
    def client_init(self, params: Params) -> dict:
        """One client's personal state: its kept leaves, or a whole side model (the initial
        global values, so every client starts from the same point)."""
        keys = params if self.side is not None else self.kept_names(params)
        return {k: params[k].detach().clone() for k in params if k in keys}

    # --- the engine's hook -------------------------------------------------------------
    def begin(self, train: Train, ctx: RoundContext) -> tuple[Params, RoundContext]:
        """Where the client's shared round starts, and the context it runs in (the side
        model, once trained, replaces the stored one in ``ctx.client_state``)."""
        mine = ctx.client_state.get(NAME, {})
        start = {k: mine.get(k, v) for k, v in ctx.global_params.items()}
        if self.side is not None:  # Ditto: v_i <- v_i trained with its own optimizer
            side = train(mine, self.side.optimizer, ctx, self.side.passes)[0]
            ctx = ctx._replace(client_state={**ctx.client_state, NAME: side})
            start = ctx.global_params
        if self.first is not None:  # FedRep: the head phase before the body phase
            start = train(start, self.first.optimizer, ctx, self.first.passes)[0]
        return start, ctx

    def shared(self, delta: Params) -> Params:
        """The delta a client sends: zero on its kept leaves (they never leave the client)."""
        kept = self.kept_names(delta)
        return {k: torch.zeros_like(d) if k in kept else d for k, d in delta.items()}

    # --- evaluation ----------------------------------------------------------------------
    def client_params(self, global_params: Params, state: dict) -> Params:
        """One client's personal model (before any evaluation-time fine-tuning)."""
        mine = state.get(NAME, {})
        return {k: mine.get(k, v) for k, v in global_params.items()}

    def finetuner(self) -> Algorithm | None:
        """A plain algorithm whose local round is the evaluation-time fine-tuning (only
        ``finetune_part`` changes); ``None`` when the method has no fine-tuning optimizer."""
        if self.finetune is None:
            return None
        opt = self.finetune.optimizer
        if self.finetune_part != "all":
            rest = {"head": "body", "body": "head", "none": "all"}[self.finetune_part]
            opt = chain(opt, freeze(rest, self.head, "finetune_freeze"))
        return Algorithm("finetune", opt, server_sgd(1.0))

    # --- differential privacy --------------------------------------------------------------
    def covered_by_dp_sgd(self) -> bool:
        """Whether DP-SGD (privacy mode ``sample``) covers the delta a client sends: the
        shared round starts after no personal pass and its steps take no gradient besides
        the step loop's, so the delta is a function of one noised gradient per step, which
        is what the accountant charges. A personal model trained beside it (Ditto's v_i)
        never leaves the client."""
        return self.first is None and not self.step_batch

    def evaluated_at(self, parts: dict) -> Personal:
        """The spec an evaluation at these server part states uses (this one)."""
        return self

    def client_columns(self, states: dict, count: int) -> dict[str, torch.Tensor]:
        """Extra columns ``[count]`` of the per-client metrics file from the clients' stacked
        states (empty for held-out clients): none here."""
        return {}

    def accuracies(self, model: torch.nn.Module, models: Params, x: torch.Tensor,
                   y: torch.Tensor, indices: list[torch.Tensor]) -> dict[str, torch.Tensor]:
        """Accuracies by the method's own inference rules beside the head's: none here."""
        return {}

    def with_head(self, head: Sequence[str] | None) -> Personal:
        """This spec under another split (``[model] head``; ``None`` keeps it)."""
        return self if head is None else replace(self, head=tuple(head))


class PersonalPart(Part):
    """Keeps the client's personal leaves (or side model) in the client store."""

    name = NAME
    sends_uploads = False

    def __init__(self, spec: Personal) -> None:
        self.spec = spec

    def client_init(self, params: Params) -> dict:
        return self.spec.client_init(params)

    def finalize(self, fin: FinalizeInputs) -> tuple[dict, dict]:
        mine = fin.ctx.client_state.get(NAME, {})
        if self.spec.side is not None:  # already trained in ``begin``
            return mine, {}
        return {k: fin.params[k] for k in mine}, {}


PersonalAlgorithm = Algorithm
"""A personalised method is an :class:`Algorithm` whose ``personal`` field holds its
:class:`Personal` spec (the name stays for the factories' annotations)."""


def personalised(name: str, local_optimizer: Transform, spec: Personal, description: str,
                 hparams: dict | None = None) -> PersonalAlgorithm:
    """A personalised method over FedAvg's server (plain averaging of the shared deltas,
    weighted by client samples as FedAvg), with its personal part when it keeps state."""
    parts = (PersonalPart(spec),) if (spec.kept != "none" or spec.side is not None) else ()
    return PersonalAlgorithm(name, local_optimizer, server_sgd(1.0), parts=parts,
                             description=description, hparams=dict(hparams or {}),
                             aggregation="num_samples", personal=spec)
