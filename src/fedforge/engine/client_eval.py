"""Each client's model scored on its own data, and the summaries over clients.

The personalised evaluation (:mod:`fedforge.experiment.personal_eval`) scores every client's
parameters on its own held-out samples, many clients in one ``vmap`` of ``functional_call``
over stacked parameters, and reports the mean, the sample-weighted mean, a tail percentile
and the worst client of each score. Next-token targets (:mod:`.targets`) are scored over
their scored tokens, with each client's perplexity beside its loss.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import nn

from fedforge.core.tree import Params, tree_map
from fedforge.engine.targets import ALL_POSITIONS, client_token_sums, per_position


def _padded(indices: Sequence[torch.Tensor], device) -> tuple[torch.Tensor, torch.Tensor]:
    width = max([len(i) for i in indices] + [1])
    idx = torch.zeros(len(indices), width, dtype=torch.int64, device=device)
    mask = torch.zeros(len(indices), width, dtype=torch.bool, device=device)
    for row, i in enumerate(indices):
        idx[row, : len(i)] = i.to(device)
        mask[row, : len(i)] = True
    return idx, mask


@torch.no_grad()
def client_accuracy(model: nn.Module, params: Params, x: torch.Tensor, y: torch.Tensor,
                    indices: Sequence[torch.Tensor], stacked: bool = True,
                    batch_size: int = 1024) -> tuple[torch.Tensor, torch.Tensor]:
    """-> (accuracy [C], test samples [C]) of client c's parameters on ``x[indices[c]]``
    (:func:`client_scores` without the loss)."""
    acc, _, sizes = client_scores(model, params, x, y, indices, stacked, batch_size)
    return acc, sizes


@torch.no_grad()
def client_scores(model: nn.Module, params: Params, x: torch.Tensor, y: torch.Tensor,
                  indices: Sequence[torch.Tensor], stacked: bool = True,
                  batch_size: int = 1024) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """-> (accuracy [C], mean cross-entropy [C], test samples [C]) of client c's parameters
    on ``x[indices[c]]`` (a client without test samples: accuracy and loss 0); for
    next-token targets, its token accuracy and mean NLL over its scored tokens.

    ``params`` is stacked ``[C, ...]`` (each client its own model) or, with
    ``stacked=False``, one model for every client. Clients go through in chunks of about
    ``batch_size`` samples, each chunk one vmapped forward pass in eval mode."""
    num = len(indices)
    correct = torch.zeros(num, dtype=torch.float64)
    loss = torch.zeros(num, dtype=torch.float64)
    sizes = torch.tensor([len(i) for i in indices], dtype=torch.float64)
    scored = sizes.clone()  # what accuracy and loss average over: samples, or scored tokens
    width = max(int(sizes.max()) if num else 1, 1)
    chunk = max(1, batch_size // width)
    tokens = per_position(y)  # next-token targets: every position scored

    def forward(p, xb):
        return torch.func.functional_call(model, p, (xb,), ALL_POSITIONS if tokens else None)

    training = model.training
    model.eval()
    try:
        for lo in range(0, num, chunk):
            hi = min(num, lo + chunk)
            idx, mask = _padded(indices[lo:hi], x.device)
            p = tree_map(lambda t, lo=lo, hi=hi: t[lo:hi], params) if stacked else params
            logits = torch.func.vmap(forward, in_dims=(0 if stacked else None, 0))(p, x[idx])
            if tokens:
                correct[lo:hi], loss[lo:hi], scored[lo:hi] = client_token_sums(logits, y[idx], mask)
                continue
            hit = (logits.argmax(-1) == y[idx]) & mask
            correct[lo:hi] = hit.sum(1).double().cpu()
            loss[lo:hi] = _loss_sums(logits, y[idx], mask)
    finally:
        model.train(training)
    return correct / scored.clamp_min(1), loss / scored.clamp_min(1), sizes


def _loss_sums(logits: torch.Tensor, y: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Each client's summed cross-entropy over its real (unpadded) samples; NaN for a task
    whose logits are not one row per sample."""
    if logits.dim() != 3:
        return torch.full((logits.shape[0],), float("nan"), dtype=torch.float64)
    ce = torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), y.flatten(),
                                           reduction="none").view(y.shape)
    return (ce * mask).sum(1).double().cpu()


def summarise(prefix: str, accuracy: torch.Tensor, sizes: torch.Tensor,
              higher_is_better: bool = True) -> dict[str, float]:
    """``{prefix}_mean``, ``_weighted`` (by test samples), ``_p10``, ``_worst`` and ``_var``
    (the variance over clients, unweighted as q-FFL's fairness tables report it) over the
    clients with test data; for a metric where lower is better (a perplexity), ``_p90`` and
    the highest as the worst."""
    has = sizes > 0
    if not bool(has.any()):
        return {}
    acc, n = accuracy[has].double(), sizes[has].double()
    tail = 10 if higher_is_better else 90
    return {f"{prefix}_mean": float(acc.mean()),
            f"{prefix}_weighted": float((acc * n).sum() / n.sum()),
            f"{prefix}_p{tail}": float(np.percentile(acc.numpy(), tail)),
            f"{prefix}_worst": float(acc.min() if higher_is_better else acc.max()),
            f"{prefix}_var": float(acc.var(unbiased=False))}


def perplexities(got: dict[str, torch.Tensor], prefix: str) -> dict[str, float]:
    """Next-token targets: each client's perplexity (exp of its mean token NLL) for both
    models, added to ``got`` as columns, and their summaries (``{prefix}personal_perplexity_*``,
    ``{prefix}global_perplexity_*``)."""
    out = {}
    for who in ("personal", "global"):
        got[f"{who}_perplexity"] = got[f"{who}_loss"].exp()
        out.update(summarise(f"{prefix}{who}_perplexity", got[f"{who}_perplexity"],
                             got["sizes"], higher_is_better=False))
    return out
