"""Evaluation of the global model: test accuracy/loss, and the mean over clients' own tests."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from fedforge.core.tree import Params, upcast
from fedforge.engine.targets import ALL_POSITIONS, per_position, token_nll


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
    unweighted mean over clients of each client's accuracy on its own samples. Next-token
    targets (``y [N, T]``): token accuracy, mean token NLL and perplexity over the scored
    tokens (:func:`evaluate_tokens`)."""
    if per_position(y):
        return evaluate_tokens(model, params, x, y, batch_size, client_indices)
    logits = predict(model, params, x, batch_size)
    losses = F.cross_entropy(upcast(logits), y, reduction="none")
    correct = (logits.argmax(-1) == y).float()
    out = {"test_accuracy": correct.mean().item(), "test_loss": losses.mean().item()}
    if client_indices:
        accs = [correct[idx].mean() for idx in client_indices if idx.numel() > 0]
        if accs:
            out["client_mean_accuracy"] = torch.stack(accs).mean().item()
    return out


@torch.no_grad()
def token_sums(model: nn.Module, params: Params, x: torch.Tensor, y: torch.Tensor,
               batch_size: int = 1024) -> torch.Tensor:
    """Each sequence's summed NLL, correct and scored tokens, float64 ``[N, 3]``, a batch of
    sequences at a time (a whole split's logits over the vocabulary would not fit)."""
    out, training = [], model.training
    model.eval()
    try:
        for start in range(0, x.shape[0], batch_size):
            logits = torch.func.functional_call(model, params, (x[start:start + batch_size],),
                                                ALL_POSITIONS)
            parts = token_nll(logits, y[start:start + batch_size])
            out.append(torch.stack([p.double().sum(-1) for p in parts], -1))
    finally:
        model.train(training)
    return torch.cat(out) if out else torch.zeros(0, 3, dtype=torch.float64)


def evaluate_tokens(model: nn.Module, params: Params, x: torch.Tensor, y: torch.Tensor,
                    batch_size: int = 1024, client_indices: list[torch.Tensor] | None = None
                    ) -> dict[str, float]:
    """Next-token scores over the scored tokens of ``(x, y)``: ``test_accuracy`` (of the
    most likely token), ``test_loss`` (mean NLL), ``test_perplexity`` (its exp); with
    ``client_indices``, ``client_mean_accuracy`` over the clients with scored tokens."""
    sums = token_sums(model, params, x, y, batch_size)
    nll, correct, tokens = sums.sum(0).tolist() if len(sums) else (0.0, 0.0, 0.0)
    loss = nll / max(tokens, 1.0)
    out = {"test_accuracy": correct / max(tokens, 1.0), "test_loss": loss,
           "test_perplexity": math.exp(loss), "test_tokens": tokens}
    if client_indices:
        own = [sums[idx.cpu()].sum(0) for idx in client_indices if idx.numel() > 0]
        accs = [float(s[1] / s[2]) for s in own if s[2] > 0]
        if accs:
            out["client_mean_accuracy"] = sum(accs) / len(accs)
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
