"""The shared problem of the multi-round hand references (tests/algorithms/test_multiround_*.py).

Five quadratic clients (tests/quadratic.py: sample ``[a, b1, b2]``, loss ``a/2 ||w - b||²``,
gradient ``a (w - b)``), four rounds of partial participation with changing cohorts, up to
three local steps, and clients that take fewer steps or none at all (a client without data:
every step is padding). Carried state therefore meets every case: a client sampled again
after sitting out, server state that is non-zero when a client without data arrives, and
per-client step counts K_i.

``run`` drives fedforge through the public round entry point and records, after every
round, the model and every client's stored state (``store.gather``). The references in the
test files are independent float64 NumPy loops written from each paper's equations; they
read nothing from fedforge but the round's shared randomness (a tracking mask, a sketch
matrix), which they take as data.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from fedforge.core.store import ClientStore
from fedforge.core.tree import flatten_dict
from fedforge.engine import LoopEngine
from fedforge.engine.draw import RoundDraw
from fedforge.engine.round import RoundSetup, federated_round
from tests.quadratic import quadratic_loss

A = np.array([1.0, 3.0, 2.0, 0.5, 1.5])
B = np.array([[1.0, 0.0], [0.0, 2.0], [-1.0, 1.0], [2.0, -1.0], [0.5, 0.5]])
N = len(A)
W0 = np.array([0.3, -0.2])
K = 3  # local steps (slots); some clients take fewer
# (cohort, steps each client takes) per round; client 4 has no data in round 3
SCHEDULE = [
    ([0, 1, 2], [3, 3, 3]),
    ([1, 3], [3, 2]),
    ([0, 3, 4], [3, 3, 0]),
    ([2, 4, 1], [1, 3, 2]),
]
FULL = [(list(range(N)), [3, 3, 3, 2, 3]), (list(range(N)), [3, 1, 3, 3, 0]),
        (list(range(N)), [2, 3, 3, 3, 3]), (list(range(N)), [3, 3, 0, 3, 1])]
RTOL = 1e-6  # the engine counts steps in float32 (1/(K η) carries its rounding)


def grad(i: int, x: np.ndarray) -> np.ndarray:
    return A[i] * (x - B[i])


@dataclass
class Round:
    params: np.ndarray  # w after the round
    clients: dict[str, np.ndarray]  # every client's stored state after the round, [N, ...]
    info: dict  # the round's per-client info (e.g. the tracking mask), as numpy
    eval_params: np.ndarray | None = None


def run(algorithm, schedule=SCHEDULE, seed: int = 0, engine=None,
        sample_counts=None) -> list[Round]:
    """fedforge's trajectory: one :class:`Round` per scheduled round (``sample_counts``:
    every client's n_i, for an algorithm whose uploads are weighted by them; one each when
    not given)."""
    if sample_counts is None and algorithm.weights_uploads:
        sample_counts = np.ones(N, dtype=np.int64)
    engine = engine or LoopEngine()
    x_all = torch.tensor(np.c_[A, B], dtype=torch.float64)
    y_all = torch.zeros(N, dtype=torch.long)
    params = {"w": torch.tensor(W0, dtype=torch.float64)}
    algorithm.bind_population(N)  # AFL's weight per client
    server_state = algorithm.server_init(params)
    store = ClientStore(N, algorithm.client_init(params))
    gen = torch.Generator().manual_seed(seed)
    out = []
    for t, (ids, steps) in enumerate(schedule, start=1):
        ids_t = torch.tensor(ids)
        sample_idx = ids_t.view(-1, 1, 1).expand(-1, K, 1).clone()  # [C, K, 1]
        weights = torch.zeros(sample_idx.shape, dtype=torch.float64)
        for c, k in enumerate(steps):
            weights[c, :k] = 1.0
        info = algorithm.round_info(len(ids), gen)
        counts = None if sample_counts is None else torch.tensor(sample_counts)[ids_t]
        draw = RoundDraw(ids_t, sample_idx, weights, info=info, counts=counts, round=t)
        params, server_state, _ = federated_round(
            RoundSetup(algorithm, engine, quadratic_loss, store, x_all, y_all), params,
            server_state, draw)
        clients = {k: v.numpy().copy() for k, v in
                   flatten_dict(store.gather(torch.arange(N))).items()}
        ev = getattr(algorithm, "eval_params", None)
        out.append(Round(params["w"].numpy().copy(), clients,
                         {k: v.numpy() for k, v in info.items()},
                         ev(params, server_state)["w"].numpy().copy() if ev else None))
    return out


def assert_close(got, want, what: str, rtol: float = RTOL, atol: float = 1e-10) -> None:
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, err_msg=what)


def compare(rounds: list[Round], ref: list[dict], keys: dict[str, str] | None = None,
            rtol: float = RTOL) -> None:
    """Round by round: the model, then each client state ``store key -> reference key``."""
    assert len(rounds) == len(ref)
    for t, (got, want) in enumerate(zip(rounds, ref), start=1):
        assert_close(got.params, want["w"], f"round {t}: model", rtol)
        for store_key, ref_key in (keys or {}).items():
            assert_close(got.clients[store_key], want[ref_key], f"round {t}: {store_key}", rtol)
