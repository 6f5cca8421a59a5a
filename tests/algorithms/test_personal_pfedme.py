"""pFedMe against a float64 NumPy loop of T Dinh et al.'s Alg. 1 (three rounds, partial
participation, a padded step): K inner steps on the prox problem for θ_i per batch, the
local w_i's step towards θ_i, the server's β-mix, and θ_i kept for evaluation. λ = 2, β = 0.7,
K = 3 and μ ≠ 0, so a wrong prox weight, plain averaging or θ restarting each step all give
other numbers."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedforge.algorithms import build_algorithm
from tests.algorithms.personal_rounds import ENGINES, ROWS, quad_grad, quadratic, run_rows, samples

LR, P_LR, LAM, K, MU, BETA = 0.1, 0.05, 2.0, 3, 0.01, 0.7
W0 = np.array([0.4, -0.3])
LOSS = quadratic(lambda p: p["w"])


def reference():
    w, theta = W0.copy(), np.tile(W0, (3, 1))
    out = []
    for cohort in samples(batch=2):
        finals = []
        for i, steps in cohort:
            wl, th = w.copy(), w.copy()  # θ restarts from the global model each round
            for rows in steps:
                for _ in range(K):
                    th = th - P_LR * (quad_grad(th, ROWS[rows]) + LAM * (th - wl) + MU * th)
                wl = wl - LR * LAM * (wl - th)
            theta[i] = th
            finals.append(wl)
        w = (1 - BETA) * w + BETA * np.mean(finals, axis=0)
        out.append((w.copy(), theta.copy()))
    return out


def _run(engine=None):
    algorithm = build_algorithm("pfedme", local_lr=LR, personal_lr=P_LR, lam=LAM,
                                inner_steps=K, mu=MU, beta=BETA)
    return algorithm, run_rows(algorithm, LOSS, {"w": W0}, engine, batch=2)


def test_pfedme_matches_the_papers_local_and_server_steps():
    algorithm, got = _run()
    for (params, state), (w, theta) in zip(got, reference(), strict=True):
        np.testing.assert_allclose(params["w"], w, rtol=1e-12)
        np.testing.assert_allclose(state["personal/theta/w"], theta, rtol=1e-12)
    mine = {"personal": {"theta": {"w": torch.tensor(theta[2])}}}
    evaluated = algorithm.personal.client_params({"w": torch.tensor(w)}, mine)
    np.testing.assert_allclose(evaluated["w"].numpy(), theta[2])


def test_pfedme_loop_equals_vmap():
    for (p, s), (q, t) in zip(_run(ENGINES["loop"])[1], _run(ENGINES["vmap"])[1], strict=True):
        np.testing.assert_allclose(p["w"], q["w"], rtol=1e-10)
        np.testing.assert_allclose(s["personal/theta/w"], t["personal/theta/w"], rtol=1e-10)


@pytest.mark.parametrize(("key", "value"), [("lam", 0.0), ("inner_steps", 0)])
def test_pfedme_refuses_bad_hparams(key, value):
    with pytest.raises(ValueError, match=f"algorithm.{key}"):
        build_algorithm("pfedme", **{key: value})
