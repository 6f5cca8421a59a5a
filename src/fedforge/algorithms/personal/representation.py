"""A model's representation at the input of its head, for methods whose local loss reads it
(FedProto's prototypes, MOON's contrastive term): the head is the model's last linear layer
(or ``[model] head``), and its input ``f(x)`` is caught during the one forward pass that also
gives the logits."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from fedforge.algorithms.personal.split import head_names
from fedforge.core.tree import Params


def head_weight(params: Params, patterns: Sequence[str] | None, method: str = "fedproto"
                ) -> str:
    """The head's one 2-d parameter ``[classes, d]``: its input is the representation."""
    mats = [n for n in head_names(list(params), patterns) if params[n].dim() == 2]
    if len(mats) != 1:
        raise ValueError(f"{method}: the model's head must be one linear layer (one 2-d "
                         f"weight [classes, d]) whose input is the representation, found {mats}")
    return mats[0]


def features_and_logits(model: torch.nn.Module, head: str, params: Params,
                        x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(f(x) [B, d], logits [B, K])`` of ``model`` at ``params``: ``f(x)`` is the input of
    the module owning the head weight ``head``, caught by a pre-hook during one forward."""
    caught = []
    module = model.get_submodule(head.rpartition(".")[0])
    handle = module.register_forward_pre_hook(lambda m, args: caught.append(args[0]))
    try:
        logits = torch.func.functional_call(model, params, (x,))
    finally:
        handle.remove()
    return caught[0].flatten(1), logits
