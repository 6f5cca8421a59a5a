"""Per-position targets: next-token fine-tuning, where every position of a sequence is scored.

A dataset whose labels have a time axis (``y [N, T]`` beside token inputs ``[N, T]``, the
``labels`` convention of Hugging Face) asks for a prediction at every position: ``y[n, t]``
is the token after position ``t``, and ``IGNORE`` marks a position that is not scored
(padding, a sequence's last token). The loss is the mean negative log-likelihood over the
scored tokens, so padding counts for nothing and a sequence weighs by its tokens; the
perplexity is ``exp`` of that mean. Labels without a time axis (``y [N]``) keep the
classification loss and accuracy, unchanged.
"""

from __future__ import annotations

import inspect

import torch
import torch.nn.functional as F
from torch import nn

from fedforge.core.tree import upcast
from fedforge.data.next_token import IGNORE
from fedforge.errors import ConfigError

ALL_POSITIONS = {"all_positions": True}  # the keyword a model scores every position with


def per_position(y: torch.Tensor, batch_dims: int = 1) -> bool:
    """Whether labels with ``batch_dims`` leading sample axes carry one target per position."""
    return y.dim() > batch_dims


def token_nll(logits: torch.Tensor, y: torch.Tensor
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """-> (negative log-likelihood, correct, scored), each shaped as ``y``, from ``logits``
    ``[..., V]``; an ``IGNORE`` position gives 0 in all three."""
    scored = y != IGNORE
    target = torch.where(scored, y, torch.zeros_like(y))
    flat = F.cross_entropy(upcast(logits).flatten(0, -2), target.flatten(), reduction="none")
    nll = flat.view(y.shape) * scored
    correct = (logits.argmax(-1) == y) & scored
    return nll, correct, scored


def sequence_loss(logits: torch.Tensor, y: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Mean token NLL of a batch ``[B, T, V]`` over its scored tokens, each sequence's
    tokens weighted by its sample weight ``w [B]`` (0 for a padded sample)."""
    nll, _, scored = token_nll(logits, y)
    weight = scored * w[:, None]
    return (nll * weight).sum() / weight.sum().clamp_min(1.0)


def client_token_sums(logits: torch.Tensor, y: torch.Tensor, mask: torch.Tensor
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Each client's correct tokens, summed NLL and scored tokens over its real sequences
    (``logits [C, W, T, V]``, ``y [C, W, T]``, ``mask [C, W]``), float64 on the CPU."""
    nll, hit, scored = token_nll(logits, y)
    real = mask[..., None]
    return tuple((v * real).double().sum((1, 2)).cpu() for v in (hit, nll, scored))


def check_model_scores_positions(model: nn.Module, y: torch.Tensor | None, dataset: str,
                                 model_name: str) -> None:
    """Next-token targets need a model that scores every position (``all_positions``, and a
    causal LM's task): one line naming the field otherwise, before anything trains."""
    if y is None or not per_position(y):
        return
    if "all_positions" not in inspect.signature(model.forward).parameters:
        raise ConfigError(f"model.name: {model_name!r} gives one prediction per sample; "
                          f"dataset {dataset!r} scores every position (use model "
                          "'pretrained' with task = 'causal_lm')")
    if getattr(model, "task", "causal_lm") != "causal_lm":
        raise ConfigError(f"model.options.task: dataset {dataset!r} scores every position; "
                          f"expected 'causal_lm', got {model.task!r}")
