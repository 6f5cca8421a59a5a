"""Tiny RNG-free quadratic clients for hand-checked algorithm tests.

Client i's samples are rows ``[a, b_1, b_2]``; the per-sample loss is ``a/2 ||w - b||^2`` on a
2-parameter model ``{"w": [2]}``, so ``grad = a (w - b)`` and every number can be done by hand.
"""

from __future__ import annotations

import torch

from fedforge.core.store import ClientStore
from fedforge.engine import LoopEngine, VmapEngine
from fedforge.engine.draw import RoundDraw
from fedforge.engine.round import RoundSetup, federated_round


def quadratic_loss(params, x, y, w):
    del y
    a, b = x[:, 0], x[:, 1:]  # [B], [B, 2]
    per_sample = 0.5 * a * ((params["w"] - b) ** 2).sum(-1)
    return (per_sample * w).sum() / w.sum().clamp_min(1.0)


def make_clients(rows: list[list[float]]):
    """One sample per client; returns x_all [C, 3], y_all [C], per-client sample index."""
    x_all = torch.tensor(rows, dtype=torch.float64)
    y_all = torch.zeros(len(rows), dtype=torch.long)
    return x_all, y_all


def run_rounds(algorithm, rows, w0, rounds=1, steps=1, engine=None, num_clients=None,
               client_ids=None, robust=None):
    """Full participation of the given clients, each doing ``steps`` steps on its one sample."""
    engine = engine or LoopEngine()
    x_all, y_all = make_clients(rows)
    n = len(rows)
    params = {"w": torch.tensor(w0, dtype=torch.float64)}
    server_state = algorithm.server_init(params)
    store = ClientStore(num_clients or n, algorithm.client_init(params))
    ids = client_ids if client_ids is not None else torch.arange(n)
    sample_idx = ids.view(-1, 1, 1).expand(-1, steps, 1).clone()  # [C, steps, 1]
    weights = torch.ones(sample_idx.shape, dtype=torch.float64)
    history = []
    for _ in range(rounds):
        setup = RoundSetup(algorithm, engine, quadratic_loss, store, x_all, y_all, robust=robust)
        params, server_state, cohort = federated_round(setup, params, server_state,
                                                       RoundDraw(ids, sample_idx, weights))
        history.append((params, server_state, cohort))
    return params, server_state, store, history


ENGINES = {"loop": LoopEngine, "vmap": lambda: VmapEngine(chunk_size=2)}
