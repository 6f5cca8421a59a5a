"""Four rounds against independent float64 references for the compressed-uplink algorithms:
error-feedback residuals (top-k EF, 1-bit-Adam style), SAFL's sketched server AMSGrad with
a cosine lr, FetchSGD's sketched momentum and error, and MARINA's compressed differences.

The references (docs/safl.md, src/fedforge/algorithms/compressed.py) take only the round's
shared randomness from fedforge, as data: the sketch matrix R_t (built column by column from
``sketch(e_j)``), MARINA's coin and its random-k selection matrix. The problem and schedule
are in tests/algorithms/multiround.py.
"""

import math

import numpy as np
import pytest
import torch

from fedforge.algorithms import build_algorithm
from fedforge.comm.compress import randk
from fedforge.comm.rng import stream_key
from tests.algorithms.multiround import FULL, SCHEDULE, W0, N, compare, grad, run

LR, SLR, B1, B2, EPS = 0.1, 0.05, 0.8, 0.9, 1e-3


def local_delta(i, w, steps):
    x = w.copy()
    for _ in range(steps):
        x = x - LR * grad(i, x)
    return w - x


class ServerAdam:
    """Reddi et al. 2021 server Adam (no bias correction); ``amsgrad`` keeps max v."""

    def __init__(self, amsgrad=False):
        self.m, self.v, self.vh, self.ams = np.zeros(2), np.zeros(2), np.zeros(2), amsgrad

    def step(self, w, d, lr=SLR):
        self.m = B1 * self.m + (1 - B1) * d
        self.v = B2 * self.v + (1 - B2) * d * d
        self.vh = np.maximum(self.vh, self.v) if self.ams else self.v
        return w - lr * self.m / (np.sqrt(self.vh) + EPS)


# ----------------------------------------------------------------- error feedback (EF)
def topk1(p):
    out = np.zeros_like(p)
    j = np.argmax(np.abs(p))
    out[j] = p[j]
    return out


def scaled_sign(p):
    return np.abs(p).mean() * np.sign(p)


def ef_ref(compress, error_feedback=True):
    """Seide et al. 2014 / Karimireddy et al. 2019: p = Δ_i + e_i, send C(p), e_i = p - C(p);
    the server applies Adam to the mean of what was sent."""
    w, e, opt, out = W0.copy(), np.zeros((N, 2)), ServerAdam(), []
    for ids, steps in SCHEDULE:
        sent = []
        for i, k in zip(ids, steps):
            p = local_delta(i, w, k) + (e[i] if error_feedback else 0.0)
            s = compress(p)
            if error_feedback:
                e[i] = p - s
            sent.append(s)
        w = opt.step(w, np.mean(sent, 0))
        out.append({"w": w.copy(), "e": e.copy()})
    return out


@pytest.mark.parametrize("error_feedback", [True, False])
def test_topk_error_feedback_four_rounds(error_feedback):
    algo = build_algorithm("topk_ef", local_lr=LR, server_lr=SLR, b1=B1, b2=B2, eps=EPS, k=1,
                           error_feedback=error_feedback)
    rounds = run(algo)
    ref = ef_ref(topk1, error_feedback)
    compare(rounds, ref, {"codec/residual": "e"} if error_feedback else {})


def test_onebit_adam_four_rounds():
    algo = build_algorithm("onebit_adam", local_lr=LR, server_lr=SLR, b1=B1, b2=B2, eps=EPS)
    compare(run(algo), ef_ref(scaled_sign), {"codec/residual": "e"})


# ------------------------------------------------------------------------------- SAFL
def _dense(op, t):
    """R_t as a [b, d] matrix: column j is sk(e_j) (the sketch is fedforge's shared data)."""
    return op.sketch(torch.eye(op.d, dtype=torch.float64), t).reshape(op.d, -1).T.numpy()


@pytest.mark.parametrize("kind,optimizer", [("srht", "amsgrad"), ("gaussian", "adam"),
                                            ("count", "amsgrad")])
def test_safl_four_rounds_fresh_sketch_and_cosine_lr(kind, optimizer):
    """Chen, Li & Banerjee, Alg. 1 + 2: u = R_t^T mean_i R_t Δ_i, AMSGrad (or Adam) without
    bias correction, κ_t cosine from server_lr to min_lr over ``rounds``."""
    rounds_, min_lr = 4, 1e-3
    algo = build_algorithm("safl", local_lr=LR, server_lr=SLR, b1=B1, b2=B2, eps=EPS,
                           sketch=kind, sketch_size=3, sketch_rows=3 if kind == "count" else 1,
                           sketch_seed=7, optimizer=optimizer, rounds=rounds_, min_lr=min_lr)
    op = algo.codec.op(2)
    w, opt, ref = W0.copy(), ServerAdam(amsgrad=optimizer == "amsgrad"), []
    mats = [_dense(op, t) for t in range(1, 5)]
    assert not np.allclose(mats[0], mats[1])  # a fresh R_t every round
    for t, ((ids, steps), r) in enumerate(zip(SCHEDULE, mats), start=1):
        u = r.T @ np.mean([r @ local_delta(i, w, k) for i, k in zip(ids, steps)], 0)
        kappa = min_lr + (SLR - min_lr) * 0.5 * (1 + math.cos(math.pi * min(t, rounds_)
                                                            / rounds_))
        w = opt.step(w, u, kappa)
        ref.append({"w": w.copy()})
    compare(run(algo), ref)


# --------------------------------------------------------------------------- FetchSGD
def test_fetchsgd_four_rounds():
    """Rothchild et al. 2020: S_u = ρ S_u + S, S_e += lr S_u, Δ = top-k(median estimate of
    S_e), S_e -= sk(Δ), S_u zeroed at the buckets of Δ's support, x <- x - Δ."""
    rows, cols, rho, lr = 3, 2, 0.6, 0.7
    algo = build_algorithm("fetchsgd", local_lr=LR, server_lr=lr, momentum=rho,
                           sketch_size=rows * cols, sketch_rows=rows, k=1, sketch_seed=2)
    op = algo.codec.sk.op(2)
    r = _dense(op, 0)  # [rows * cols, d]: fixed hashes, the same every round
    h, s = np.zeros((rows, 2), int), np.zeros((rows, 2))
    for row in range(rows):
        for j in range(2):
            block = r[row * cols:(row + 1) * cols, j]
            h[row, j] = int(np.flatnonzero(block)[0])
            s[row, j] = np.sign(block[h[row, j]])
    sk = r  # sketch = R v (the 1/sqrt(rows) is inside R)
    w, su, se, ref = W0.copy(), np.zeros(rows * cols), np.zeros(rows * cols), []
    for ids, steps in SCHEDULE:
        y = sk @ np.mean([local_delta(i, w, k) for i, k in zip(ids, steps)], 0)
        su = rho * su + y
        se = se + lr * su
        est = np.median([[math.sqrt(rows) * s[q, j] * se[q * cols + h[q, j]] for j in range(2)]
                         for q in range(rows)], 0)
        delta = topk1(est)
        se = se - sk @ delta
        support = (sk @ (delta != 0).astype(float)) != 0
        su = np.where(support, 0.0, su)
        w = w - delta
        ref.append({"w": w.copy()})
    compare(run(algo), ref)


# ----------------------------------------------------------------------------- MARINA
def test_marina_four_rounds_full_participation():
    """Gorbunov et al. 2021: on a sync round (round 1, or the shared coin) g = mean Δ_i, else
    g += mean Q(Δ_i - Δ_i^prev) with unbiased random-k Q; x <- x - η g."""
    seed, p, lr = 3, 0.4, 0.6
    algo = build_algorithm("marina", local_lr=LR, server_lr=lr, k=1, sync_prob=p, seed=seed)
    coins = [bool(algo.codec.full_sync(t)) for t in range(1, 5)]
    assert coins[0] and not all(coins[1:]), coins  # both kinds of round occur

    def q(t):  # Q_t as a matrix: column j = Q_t(e_j) (random-k is linear for a fixed key)
        return randk(torch.eye(2, dtype=torch.float64), 1,
                     stream_key(seed, torch.tensor(t))).T.numpy()

    w, g, prev, ref = W0.copy(), np.zeros(2), np.zeros((N, 2)), []
    for t, (ids, steps) in enumerate(FULL, start=1):
        deltas = {i: local_delta(i, w, k) for i, k in zip(ids, steps)}
        if coins[t - 1]:
            g = np.mean([deltas[i] for i in ids], 0)
        else:
            g = g + np.mean([q(t) @ (deltas[i] - prev[i]) for i in ids], 0)
        for i in ids:
            prev[i] = deltas[i]
        w = w - lr * g
        ref.append({"w": w.copy(), "prev": prev.copy()})
    compare(run(algo, FULL), ref, {"codec/prev": "prev"})
