"""Evaluation of the global model: test accuracy/loss, and the mean over clients' own tests."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from fedforge.core.tree import Params, upcast


@torch.no_grad()
def predict(model: nn.Module, params: Params, x: torch.Tensor, batch_size: int = 1024):
    """-> (per-sample loss [N], per-sample correct [N]) for labels given later. The model
    runs in eval mode (dropout off), whatever mode it is kept in for training."""
    outs, training = [], model.training
    model.eval()
    try:
        for start in range(0, x.shape[0], batch_size):
            outs.append(torch.func.functional_call(model, params,
                                                   (x[start : start + batch_size],)))
    finally:
        model.train(training)
    return torch.cat(outs) if outs else torch.zeros(0)


@torch.no_grad()
def evaluate(
    model: nn.Module,
    params: Params,
    x: torch.Tensor,
    y: torch.Tensor,
    batch_size: int = 1024,
    client_indices: list[torch.Tensor] | None = None,
) -> dict[str, float]:
    """Accuracy and mean cross-entropy on ``(x, y)``; with ``client_indices`` also the
    unweighted mean over clients of each client's accuracy on its own samples."""
    logits = predict(model, params, x, batch_size)
    losses = F.cross_entropy(upcast(logits), y, reduction="none")
    correct = (logits.argmax(-1) == y).float()
    out = {"test_accuracy": correct.mean().item(), "test_loss": losses.mean().item()}
    if client_indices:
        accs = [correct[idx].mean() for idx in client_indices if idx.numel() > 0]
        if accs:
            out["client_mean_accuracy"] = torch.stack(accs).mean().item()
    return out


def population_metrics(model: nn.Module, params: Params, data, batch_size: int = 1024
                       ) -> dict[str, float]:
    """For a population dataset (``data.population``): how many clients the test metrics
    were measured on (``test_clients``), and the accuracy and loss on the test data of the
    evaluated held-out clients, which never train (``held_out_*``); ``{}`` otherwise."""
    if not getattr(data, "population", False):
        return {}
    out: dict[str, float] = {"test_clients": data.test_clients}
    x, y, _ = data.held_out_data()
    if y.numel():
        m = evaluate(model, params, x, y, batch_size)
        out.update(held_out_accuracy=m["test_accuracy"], held_out_loss=m["test_loss"],
                   held_out_clients=len(data.held_out_eval))
    return out
