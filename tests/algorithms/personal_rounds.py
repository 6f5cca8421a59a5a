"""The driver of the hand-computed tests of the personalised methods whose local step takes
several gradients on one batch (tests/algorithms/test_personal_<method>.py).

Three clients with a few samples each; every round lists its cohort and, per client, the
samples of each step ([steps, batch] indices, -1 = padding). ``run`` drives fedforge through
the public round entry point and records the model and every client's stored state after
each round; the references in the test files are float64 NumPy loops that read nothing from
fedforge.
"""

from __future__ import annotations

import numpy as np
import torch

from fedforge.core.store import ClientStore
from fedforge.core.tree import flatten_dict
from fedforge.engine import LoopEngine, VmapEngine
from fedforge.engine.draw import RoundDraw
from fedforge.engine.round import RoundSetup, federated_round

# quadratic samples [a, b1, b2]: loss a/2 ||u - b||² with u the model's output
ROWS = np.array([[1.0, 1.0, 0.0], [2.0, 0.5, -1.0], [0.5, -1.0, 2.0],   # client 0
                 [3.0, 0.0, 2.0], [1.5, 2.0, 1.0], [2.5, -0.5, 0.5],    # client 1
                 [0.8, 1.0, -1.0], [1.2, -2.0, 0.0], [0.6, 0.3, 0.9]])  # client 2
# per round: cohort and each client's [steps, batch] sample indices (-1: padding)
SCHEDULE = [
    ([0, 1, 2], [[[0, 1, 2], [2, 0, 1]], [[3, 4, 5], [5, 3, 4]], [[6, 7, 8], [8, 6, 7]]]),
    ([0, 2], [[[1, 2, 0], [0, 1, 2]], [[7, 8, 6], [-1, -1, -1]]]),
    ([1, 2, 0], [[[4, 5, 3], [3, 5, 4]], [[6, 8, 7], [7, 6, 8]], [[2, 1, 0], [1, 0, 2]]]),
]
ENGINES = {"loop": LoopEngine, "vmap": lambda: VmapEngine(chunk_size=2)}


def quadratic(output):
    """The masked mean loss ``a/2 ||output(params) - b||²`` (the engine's loss signature)."""

    def loss(params, x, y, w):
        del y
        a, b = x[:, 0], x[:, 1:]
        per_sample = 0.5 * a * ((output(params) - b) ** 2).sum(-1)
        return (per_sample * w).sum() / w.sum().clamp_min(1.0)

    return loss


def batches(schedule=SCHEDULE, batch: int | None = None):
    """Per round ``(ids, sample_idx [C, steps, B], weights)`` (the first ``batch`` columns)."""
    out = []
    for ids, idx in schedule:
        idx = torch.tensor(idx)[..., :batch]
        out.append((torch.tensor(ids), idx.clamp_min(0), (idx >= 0).to(torch.float64)))
    return out


def run(algorithm, loss, params, x_all, y_all, schedule, engine=None):
    """fedforge's trajectory: ``(params, every client's state)`` after each round, as numpy."""
    engine = (engine or LoopEngine)() if callable(engine) or engine is None else engine
    params = {k: torch.tensor(v, dtype=torch.float64) for k, v in params.items()}
    server_state = algorithm.server_init(params)
    n = int(max(int(ids.max()) for ids, _, _ in schedule)) + 1
    store = ClientStore(n, algorithm.client_init(params))
    out = []
    for t, (ids, idx, weights) in enumerate(schedule, start=1):
        params, server_state, _ = federated_round(
            RoundSetup(algorithm, engine, loss, store, x_all, y_all), params, server_state,
            RoundDraw(ids, idx, weights, round=t))
        stored = flatten_dict(store.gather(torch.arange(n)))
        state = {k: v.numpy().copy() for k, v in stored.items()}
        out.append(({k: v.numpy().copy() for k, v in params.items()}, state))
    return out


def run_rows(algorithm, loss, params, engine=None, schedule=SCHEDULE,
             batch: int | None = None):
    """:func:`run` on the samples ``ROWS`` (no labels) over ``batches(schedule, batch)``."""
    x, y = torch.tensor(ROWS), torch.zeros(len(ROWS), dtype=torch.long)
    return run(algorithm, loss, params, x, y, batches(schedule, batch), engine)


def samples(schedule=SCHEDULE, batch: int | None = None):
    """The reference's view of the schedule: per round [(client, [[sample, ...] per step])]
    with padded steps dropped."""
    return [[(i, [kept for step in steps if (kept := [s for s in step[:batch] if s >= 0])])
             for i, steps in zip(ids, idx, strict=True)] for ids, idx in schedule]


def quad_grad(u, rows):
    """∇_u of the mean of a/2 ||u - b||² over ``rows`` (zero for no rows)."""
    if len(rows) == 0:
        return np.zeros_like(u)
    return np.mean([r[0] * (u - r[1:]) for r in rows], axis=0)
