"""Four rounds of partial participation against independent float64 references: FAdamGC, FA-NT
and LocalAdam (carried y, y_i, v_i), FedAvg-M and SCAFFOLD-M (broadcast global momentum).

References from Chen et al.'s Algorithms 1-2 and Cheng et al. 2023 as written in
src/fedforge/algorithms/fadamgc.py, momentum.py and docs/fadamgc.md; the tracking subset S̃
of each round is the round's shared randomness, taken from fedforge's round info as data.
The problem and schedule are in tests/algorithms/multiround.py.
"""

import math

import numpy as np
import pytest

from fedforge.algorithms import build_algorithm
from tests.algorithms.multiround import FULL, SCHEDULE, W0, N, compare, grad, run

LR, SLR, B1, B2, EPS = 0.05, 0.9, 0.8, 0.9, 1e-3


def adam_ref(kind, masks, amsgrad=True, bias_correction=False, carry_v=True,
             schedule=SCHEDULE):
    """FAdamGC (``fadamgc``, Alg. 1), FA-NT (``fa_nt``, Alg. 2) or LocalAdam (y ≡ 0)."""
    w, y = W0.copy(), np.zeros(2)
    yi, vi = np.zeros((N, 2)), np.zeros((N, 2))
    out = []
    for (ids, steps), mask in zip(schedule, masks):
        xs, dys = [], []
        for c, (i, k) in enumerate(zip(ids, steps)):
            x, m = w.copy(), np.zeros(2)
            v = vi[i].copy() if carry_v else np.zeros(2)
            vhat, gsum = v.copy(), np.zeros(2)
            for step in range(1, k + 1):
                g = grad(i, x)
                gsum += g
                gh = g + y - yi[i] if kind == "fadamgc" else g
                m = B1 * m + (1 - B1) * gh
                v = B2 * v + (1 - B2) * gh * gh
                vhat = np.maximum(vhat, v) if amsgrad else v
                if bias_correction:
                    d = (m / (1 - B1**step)) / (np.sqrt(vhat / (1 - B2**step)) + EPS)
                else:
                    d = m / (np.sqrt(vhat) + EPS)
                if kind == "fa_nt":
                    d = d + y - yi[i]
                x = x - LR * d
            if carry_v:
                vi[i] = v
            new = yi[i].copy()
            if kind != "localadam" and mask[c] and k > 0:
                new = gsum / k if kind == "fadamgc" else yi[i] - y + (w - x) / (k * LR)
            dys.append(new - yi[i])
            yi[i] = new
            xs.append(x)
        w = w - SLR * np.mean([w - x for x in xs], 0)
        y = y + len(ids) / N * np.mean(dys, 0)
        out.append({"w": w.copy(), "yi": yi.copy(), "vi": vi.copy()})
    return out


def _masks(rounds, key="tracking"):
    return [r.info[key] for r in rounds]


@pytest.mark.parametrize("name", ["fadamgc", "fa_nt"])
@pytest.mark.parametrize("fraction", [0.5, 1.0])
def test_tracking_adam_four_rounds(name, fraction):
    algo = build_algorithm(name, local_lr=LR, server_lr=SLR, b1=B1, b2=B2, eps=EPS,
                           tracking_fraction=fraction)
    rounds = run(algo, seed=3)
    masks = _masks(rounds)
    for mk in masks:  # |S̃| = round(fraction · S), at least one
        assert mk.sum() == max(1, math.floor(fraction * len(mk) + 0.5))
    if fraction < 1:  # a real subset: some sampled clients do not track
        assert any(not mk.all() for mk in masks)
    compare(rounds, adam_ref(name, masks), {"tracking/y/w": "yi", "adam_v/v/w": "vi"})


@pytest.mark.parametrize("flags", [{}, {"amsgrad": False, "bias_correction": True},
                                   {"carry_v": False}])
def test_localadam_four_rounds(flags):
    algo = build_algorithm("localadam", local_lr=LR, server_lr=SLR, b1=B1, b2=B2, eps=EPS,
                           **flags)
    rounds = run(algo)
    ref = adam_ref("localadam", [None] * len(SCHEDULE), **flags)
    compare(rounds, ref, {"adam_v/v/w": "vi"} if flags.get("carry_v", True) else {})
    if not flags.get("carry_v", True):
        assert "adam_v/v/w" not in rounds[-1].clients


def test_fadamgc_reduces_to_localadam_without_tracking():
    a = run(build_algorithm("fadamgc", local_lr=LR, server_lr=SLR, b1=B1, b2=B2, eps=EPS,
                            tracking_fraction=0.0))
    b = run(build_algorithm("localadam", local_lr=LR, server_lr=SLR, b1=B1, b2=B2, eps=EPS))
    for ra, rb in zip(a, b):
        np.testing.assert_allclose(ra.params, rb.params, rtol=1e-12)


# --------------------------------------------------------------- FedAvg-M, SCAFFOLD-M
BETA, MLR = 0.3, 0.1


def momentum_ref(scaffold, schedule=SCHEDULE):
    """Cheng et al. 2023: x_i -= η (β ĝ + (1-β) g^t), ĝ = g (+ c - c_i for SCAFFOLD-M);
    g^{t+1} = mean_i (x^t - x_i)/(η K_i); c_i = mean raw gradient; c += (|S|/N) mean Δc_i."""
    w, gm, c, ci, out = W0.copy(), np.zeros(2), np.zeros(2), np.zeros((N, 2)), []
    for ids, steps in schedule:
        xs, ups, dcs = [], [], []
        for i, k in zip(ids, steps):
            x, gsum = w.copy(), np.zeros(2)
            for _ in range(k):
                g = grad(i, x)
                gsum += g
                gh = g + c - ci[i] if scaffold else g
                x = x - MLR * (BETA * gh + (1 - BETA) * gm)
            ups.append((w - x) / (max(k, 1) * MLR))
            new = gsum / k if k > 0 else ci[i].copy()
            dcs.append(new - ci[i])
            if scaffold:
                ci[i] = new
            xs.append(x)
        w = w - SLR * np.mean([w - x for x in xs], 0)
        gm = np.mean(ups, 0)
        if scaffold:
            c = c + len(ids) / N * np.mean(dcs, 0)
        out.append({"w": w.copy(), "ci": ci.copy()})
    return out


def test_fedavg_m_four_rounds():
    algo = build_algorithm("fedavg_m", local_lr=MLR, server_lr=SLR, beta=BETA)
    compare(run(algo), momentum_ref(False))


def test_scaffold_m_four_rounds():
    algo = build_algorithm("scaffold_m", local_lr=MLR, server_lr=SLR, beta=BETA)
    compare(run(algo), momentum_ref(True), {"scaffold_m/y/w": "ci"})


def test_clients_without_data_keep_their_state():
    """Full participation where clients 4 (round 2) and 2 (round 4) have no data after they
    have trained: their y_i, v_i, c_i must stay as they were."""
    for name in ("fadamgc", "fa_nt"):
        algo = build_algorithm(name, local_lr=LR, server_lr=SLR, b1=B1, b2=B2, eps=EPS,
                               tracking_fraction=1.0)
        rounds = run(algo, FULL)
        compare(rounds, adam_ref(name, _masks(rounds), schedule=FULL),
                {"tracking/y/w": "yi", "adam_v/v/w": "vi"}, rtol=1e-5)  # float32 1/(K η)
    algo = build_algorithm("scaffold_m", local_lr=MLR, server_lr=SLR, beta=BETA)
    compare(run(algo, FULL), momentum_ref(True, FULL), {"scaffold_m/y/w": "ci"})
