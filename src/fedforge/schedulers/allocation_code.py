"""FedAST's request allocation as the authors' code does it (``async.allocation = "code"``).

The paper's rules (Alg. 3/4) live in :mod:`fedforge.schedulers.allocation`. The authors' code
(``askinb/FedAST``, ``server.py``) differs from them in the points below; each function names
the lines it follows. ``docs/fedast.md`` lists them side by side.

* variance: only non-bias tensors; scaled by ``eta_c eta_s / (eta_c tau)^2``; halved (the
  code's ``float(v)**1/2`` is ``v / 2``); the window holds 7 deltas (append, drop the oldest
  when the length reaches 8, then estimate); the estimates of a whole period are averaged;
* Realloc: ``R_m`` proportional to that (halved) variance, in chunks of 32 with 32 at least;
  only when every task has passed 8 server rounds and every running task has an estimate;
* new requests per arrival: at most ``min(R_m - in_flight_m, sum R - sum in_flight, 2)``;
  ``b_m = max(1, ceil(in_flight_m / 32))`` after every arrival of task m;
* start: every initial request is sent, without the cap on distinct busy clients;
* a finished task's ``R_m`` goes to the others ∝ R with the remainder handed out at random;
  their ``b = round(R / 32)`` until their next arrival;
* speed classes: ``random.seed(64)``, ``random.shuffle`` of the client indices, the first
  ``int(0.25 N)`` slow, up to ``int(0.75 N)`` normal, the rest fast.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

import numpy as np
import torch

from fedforge.core.tree import Params

ALLOCATIONS = ("paper", "code")
WINDOW_DROP_AT = 8  # server.py:100 (window sizes 8) and :825-826 (delete at length 8)
CHUNK = 32  # server.py:92 R_bs_ratio = 32, the Realloc chunk and the R/b ratio
MIN_ROUNDS = 8  # server.py:825 min(round_list) > max(window sizes)


def code_variance(window: Sequence[Params], local_lr: float, server_lr: float,
                  tau: int) -> float:
    """server.py:147-198: ``eta_c eta_s / (eta_c tau)^2 * spread / (|mean|^2 n) / 2`` over
    the tensors whose name holds no ``"bias"`` (``float(v)**1/2`` is ``v / 2``)."""
    if len(window) < 1:
        raise ValueError("code_variance: need at least 1 update in the window")
    names = [k for k in window[0] if "bias" not in k]
    if not names:
        raise ValueError("code_variance: every tensor is a bias; nothing to estimate")
    spread, norm2 = 0.0, 0.0
    for k in names:
        stack = torch.stack([d[k].double() for d in window])
        mean = stack.mean(0)
        norm2 += float(mean.pow(2).sum())
        spread += float(((stack - mean) ** 2).sum())
    v = local_lr * server_lr * spread / (max(norm2, 1e-30) * len(window)) / (local_lr * tau) ** 2
    return v / 2


def redistribute(requests: Sequence[int], variances: Sequence[float],
                 chunk: int = CHUNK) -> list[int]:
    """server.py:128-145: every running task gets ``chunk``, then chunks go one by one to the
    task with the largest ``int(R_total v_m / sum v) - given_m`` (first index on ties).

    A task with ``R_m = 0`` (finished) gets 0. When ``R_total`` is not a multiple of
    ``chunk`` the last chunk overshoots, as in the code."""
    r_total = int(sum(requests))
    a = [0.0 if r <= 0 else float(v) for r, v in zip(requests, variances, strict=True)]
    if sum(a) <= 0:
        raise ValueError("redistribute: every running task has zero variance")
    new = [0 if r <= 0 else chunk for r in requests]
    score = [-99999 if r <= 0 else int(r_total * v / sum(a)) - chunk
             for r, v in zip(requests, a)]
    left = r_total - sum(new)
    while left > 0:
        i = score.index(max(score))
        new[i] += chunk
        score[i] -= chunk
        left -= chunk
    return new


def new_requests(r_m: int, in_flight_m: int, r_total: int, in_flight_total: int,
                 max_k: int = 2) -> int:
    """server.py:778-780: ``min(R_m - a_m, sum R - sum a, 2)`` when ``a_m < R_m`` (never < 0)."""
    if in_flight_m >= r_m:
        return 0
    return max(0, min(r_m - in_flight_m, r_total - in_flight_total, max_k))


def arrival_buffer(in_flight: int, ratio: float = CHUNK) -> int:
    """server.py:804-807: ``b_m = max(1, ceil(in_flight_m / 32))`` after each arrival of m."""
    return max(1, math.ceil(in_flight / ratio))


def finish_buffer(requests: int, ratio: float = CHUNK) -> int:
    """server.py:951: ``b = round(R / 32)`` (Python's round, halves to even) for the tasks that
    receive a finished task's requests. A 0 aggregates every arrival, the same as 1."""
    return max(1, round(requests / ratio))


def finish_split(freed: int, requests: Sequence[int], rng: np.random.Generator) -> list[int]:
    """server.py:934-940: ``int(freed R_k / sum R)`` each, then the remainder one at a time to a
    uniformly drawn task (draws that land on a finished task, ``R_k = 0``, are redrawn)."""
    total = sum(requests)
    if total <= 0:
        return [0] * len(requests)
    add = [int(freed * r / total) for r in requests]
    while freed > sum(add):
        i = int(rng.integers(len(requests)))
        if requests[i] != 0:
            add[i] += 1
    return add


def code_speed_factors(num_clients: int, classes: Sequence[tuple[float, float]],
                       seed: int = 64) -> np.ndarray:
    """server.py:355-366: ``random.seed(64)``; shuffle the indices; class boundaries at
    ``int(cumulative fraction * N)`` (the last class takes the rest)."""
    idx = list(range(num_clients))
    random.Random(seed).shuffle(idx)  # the same permutation as random.seed(64); shuffle
    out = np.empty(num_clients, dtype=np.float64)
    lo, cum = 0, 0.0
    for j, (frac, factor) in enumerate(classes):
        cum += frac
        hi = num_clients if j == len(classes) - 1 else int(cum * num_clients)
        out[idx[lo:hi]] = factor
        lo = hi
    return out


class CodeAllocator:
    """The code's Realloc state: per-task windows, the period's estimates, the update counter.

    ``period_c = (sum R^(0)) * 3 // 4`` (server.py:101); the period is ``period_c`` times the
    number of running tasks (server.py:102, :932)."""

    def __init__(self, num_tasks: int, initial_total: int, factor: float = 0.75) -> None:
        self.windows: list[list[Params]] = [[] for _ in range(num_tasks)]
        self.estimates: list[list[float]] = [[] for _ in range(num_tasks)]
        self.counter = 0
        self.period_c = math.floor(initial_total * factor)  # 3 // 4 for the default 0.75

    def observe(self, m: int, delta: Params, local_lr: float, server_lr: float,
                tau: int) -> None:
        """server.py:824-828: append; at length 8 drop the oldest and estimate on the 7 left."""
        self.windows[m].append(delta)
        if len(self.windows[m]) == WINDOW_DROP_AT:
            del self.windows[m][0]
            self.estimates[m].append(code_variance(self.windows[m], local_lr, server_lr, tau))
        self.counter += 1

    def due(self, rounds: Sequence[int], requests: Sequence[int]) -> bool:
        """server.py:829-830: the period has passed, every task (finished ones too) is past
        round 8, and every running task has an estimate since the last Realloc."""
        running = sum(1 for r in requests if r > 0)
        return (self.counter >= self.period_c * running and min(rounds) > MIN_ROUNDS
                and all(self.estimates[m] for m, r in enumerate(requests) if r > 0))

    def realloc(self, requests: Sequence[int], chunk: int = CHUNK) -> list[int]:
        """server.py:831-838: average each task's estimates over the period, redistribute,
        start a new period."""
        self.counter = 0
        mean = [sum(e) / len(e) if r > 0 else 0.0 for e, r in zip(self.estimates, requests)]
        self.estimates = [[] for _ in requests]
        return redistribute(requests, mean, chunk)

    def state_dict(self) -> dict:
        return {"counter": self.counter, "estimates": self.estimates}

    def load_state_dict(self, state: dict) -> None:
        self.counter = int(state["counter"])
        self.estimates = [list(map(float, e)) for e in state["estimates"]]
