"""APFL against a float64 NumPy loop of Deng et al.'s Alg. 1 (three rounds, partial
participation, a padded step): the shared w, every client's v_i and α_i, and the evaluated
mix α_i v_i + (1 - α_i) w. α0 = 0.3 and alpha_lr ≠ local_lr, so mixing the wrong way round,
stepping v with the unmixed gradient, or α with the wrong step all give other numbers."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedforge.algorithms import build_algorithm
from tests.algorithms.personal_rounds import ENGINES, ROWS, quad_grad, quadratic, run_rows, samples

LR, ALPHA_LR, A0, W0 = 0.1, 0.05, 0.3, np.array([0.4, -0.3])
LOSS = quadratic(lambda p: p["w"])


def reference(adaptive: bool, alpha_lr: float = ALPHA_LR):
    w, n = W0.copy(), 3
    v, alpha = np.tile(W0, (n, 1)), np.full(n, A0)
    out = []
    for cohort in samples(batch=2):
        deltas = []
        for i, steps in cohort:
            wl = w.copy()
            for rows in steps:
                rows = ROWS[rows]
                a = alpha[i]
                mixed = a * v[i] + (1 - a) * wl
                g = quad_grad(mixed, rows)
                if adaptive:
                    alpha[i] = np.clip(a - alpha_lr * (v[i] - wl) @ g, 0.0, 1.0)
                v[i] = v[i] - LR * a * g
                wl = wl - LR * quad_grad(wl, rows)
            deltas.append(w - wl)
        w = w - np.mean(deltas, axis=0)
        out.append((w.copy(), v.copy(), alpha.copy()))
    return out


def _run(adaptive: bool, engine=None, alpha_lr: float = ALPHA_LR):
    algorithm = build_algorithm("apfl", local_lr=LR, alpha=A0, alpha_lr=alpha_lr,
                                adaptive_alpha=adaptive)
    return algorithm, run_rows(algorithm, LOSS, {"w": W0}, engine, batch=2)


@pytest.mark.parametrize("adaptive", [True, False])
def test_apfl_matches_the_papers_local_steps(adaptive):
    algorithm, got = _run(adaptive)
    for (params, state), (w, v, alpha) in zip(got, reference(adaptive), strict=True):
        np.testing.assert_allclose(params["w"], w, rtol=1e-12)
        np.testing.assert_allclose(state["personal/v/w"], v, rtol=1e-12)
        np.testing.assert_allclose(state["personal/alpha"], alpha, rtol=1e-12)
    assert adaptive or np.all(state["personal/alpha"] == A0)
    assert not adaptive or np.all(state["personal/alpha"][:3] != A0)
    # the evaluated model of each client is the mix of its v_i with the current global w
    mine = {"alpha": torch.tensor(alpha[1]), "v": {"w": torch.tensor(v[1])}}
    mixed = algorithm.personal.client_params({"w": torch.tensor(w)}, {"personal": mine})
    np.testing.assert_allclose(mixed["w"].numpy(), alpha[1] * v[1] + (1 - alpha[1]) * w)


def test_apfl_loop_equals_vmap():
    ref = _run(True, ENGINES["loop"])[1]
    got = _run(True, ENGINES["vmap"])[1]
    for (p, s), (q, t) in zip(ref, got, strict=True):
        np.testing.assert_allclose(p["w"], q["w"], rtol=1e-10)
        for k in s:
            np.testing.assert_allclose(s[k], t[k], rtol=1e-10)


def test_apfl_refuses_a_mixing_weight_outside_0_1():
    with pytest.raises(ValueError, match="algorithm.alpha"):
        build_algorithm("apfl", alpha=1.5)


def test_apfl_mixing_weight_is_clipped_to_0_1():
    """A large α step drives α_i past both ends; it stays in [0, 1] as the reference's."""
    got, want = _run(True, alpha_lr=40.0)[1], reference(True, alpha_lr=40.0)
    alphas = np.array([a for _, _, a in want])
    assert (alphas == 0.0).any() and (alphas == 1.0).any()
    for (params, state), (w, v, alpha) in zip(got, want, strict=True):
        np.testing.assert_allclose(params["w"], w, rtol=1e-12)
        np.testing.assert_allclose(state["personal/v/w"], v, rtol=1e-12)
        np.testing.assert_allclose(state["personal/alpha"], alpha, rtol=1e-12)
