"""FedNAR's co-clipped decay: the appendix's Lemma 1 (consistent form) and Theorem 1, the
per-step bound ``||step|| <= l_t A``, and Eqs. (21)-(22) against the library's transform.

Lemma 1 as printed has the product inside ``h`` over ``r = j ... τ-1``; unrolling the per-step
update ``x_{j+1} = (1 - μ_j) x_j - λ_j g_j`` gives ``r = j+1 ... τ-1`` (the step's own decay
does not act on its own gradient). The tests check the consistent form and that the printed
one is off (the erratum in docs/fednar.md).
"""

import math

import numpy as np
import pytest
import torch

from fedforge.algorithms import build_algorithm
from fedforge.client.nar import clipped_sgd, nar, nar_coefficients
from fedforge.client.transforms import RoundContext
from tests.quadratic import run_rounds

F64 = torch.float64
RTOL = 1e-6  # the clip's norm is taken in float32 (core.tree.tree_sq_norm), even for float64


def _ctx(x, round_=1.0):
    return RoundContext(x, {"round": torch.tensor(round_, dtype=F64)}, {}, {})


def _step(tx, g, x, round_=1.0):
    """One local step ``x + update`` of a transform (fresh state: stateless transforms)."""
    ctx = _ctx(x, round_)
    upd, _ = tx.update(g, tx.init(x, ctx), x, ctx)
    return {k: x[k] + upd[k] for k in x}, upd


# ------------------------------------------------------------------------- Lemma 1
def lemma1_reference(x0, lam, mu, g, lam_g, printed=False):
    """NumPy transcription of Lemma 1: ``x^t = (1 - μ_g) x^{t-1} - λ_g h``.

    ``lam``, ``mu``: [M, τ]; ``g``: [M, τ, d]. Product over r = j+1..τ-1 (or j..τ-1 printed).
    """
    m, tau = lam.shape
    mu_g = lam_g - lam_g / m * sum(np.prod(1 - mu[i]) for i in range(m))
    h = np.zeros_like(x0)
    for i in range(m):
        for j in range(tau):
            start = j if printed else j + 1
            h += lam[i, j] * np.prod(1 - mu[i, start:]) * g[i, j]
    return (1 - mu_g) * x0 - lam_g * h / m


def test_lemma1_consistent_form_matches_per_step_updates():
    rng = np.random.default_rng(0)
    m, tau, d, lam_g = 3, 5, 4, 0.7
    x0 = rng.normal(size=d)
    lam, mu = rng.uniform(0.01, 0.3, (m, tau)), rng.uniform(0.01, 0.3, (m, tau))
    g = rng.normal(size=(m, tau, d))
    deltas = []
    for i in range(m):  # the per-step update, literally
        x = x0.copy()
        for j in range(tau):
            x = (1 - mu[i, j]) * x - lam[i, j] * g[i, j]
        deltas.append(x0 - x)
    x_new = x0 - lam_g * np.mean(deltas, axis=0)
    np.testing.assert_allclose(lemma1_reference(x0, lam, mu, g, lam_g), x_new, rtol=1e-12)
    # the printed range r = j..τ-1 does not match (erratum)
    assert not np.allclose(lemma1_reference(x0, lam, mu, g, lam_g, printed=True), x_new)


def test_lemma1_holds_for_the_library_nar_steps():
    """λ_j, μ_j from Eqs. (21)-(22) at the library's own iterates reproduce its NAR round."""
    rng = np.random.default_rng(1)
    m, tau, lr, wd, clip, lam_g = 2, 4, 0.3, 0.5, 1.5, 1.0
    tx = nar(lr, wd, clip)
    x0 = {"w": torch.tensor(rng.normal(size=3) * 3, dtype=F64)}
    targets = torch.tensor(rng.normal(size=(m, tau, 3)) * 4, dtype=F64)
    lam, mu, gs, finals = np.zeros((m, tau)), np.zeros((m, tau)), np.zeros((m, tau, 3)), []
    for i in range(m):
        x = x0
        for j in range(tau):
            g = {"w": x["w"] - targets[i, j]}  # gradient of 1/2 ||x - b_ij||^2
            lj, mj = nar_coefficients(g, x, lr, wd, clip)
            lam[i, j], mu[i, j], gs[i, j] = float(lj), float(mj), g["w"].numpy()
            x, _ = _step(tx, g, x)
        finals.append(x["w"].numpy())
    x_new = x0["w"].numpy() - lam_g * np.mean([x0["w"].numpy() - f for f in finals], axis=0)
    np.testing.assert_allclose(lemma1_reference(x0["w"].numpy(), lam, mu, gs, lam_g), x_new,
                               rtol=RTOL)
    assert (lam < lr).any()  # the clip was active on some steps, so the case is not trivial


# ------------------------------------------------------------------ Eqs. (21)-(22), one step
def test_nar_step_equals_eqs_21_22():
    """x <- x - λ_t(g, x) g - μ_t(g, x) x with u_t = l_t λ."""
    g, x = {"w": torch.tensor([3.0, -1.0], dtype=F64)}, {"w": torch.tensor([20.0, 5.0], dtype=F64)}
    lr, wd, clip = 0.1, 0.2, 2.0
    new, _ = _step(nar(lr, wd, clip), g, x)
    v = np.array([3.0 + 0.2 * 20.0, -1.0 + 0.2 * 5.0])  # g + (u_t / l_t) x = (7, 0)
    scale = min(1.0, clip / np.linalg.norm(v))  # 2 / 7
    lam_t, mu_t = lr * scale, lr * wd * scale
    np.testing.assert_allclose(new["w"].numpy(), (1 - mu_t) * np.array([20.0, 5.0])
                               - lam_t * np.array([3.0, -1.0]), rtol=RTOL)
    np.testing.assert_allclose(new["w"].numpy(), [20.0 - 0.2, 5.0], rtol=RTOL)  # by hand


# ------------------------------------------------------------------ per-step bound, hand case
def test_nar_step_norm_bounded_vanilla_exceeds():
    """g = (3, 4), x = (100, 0), λ = 0.1, l = 0.5, A = 10.

    NAR: v = g + λx = (13, 4), ||v|| = sqrt(185) > 10, step = -0.5 * 10 v / sqrt(185), norm 5.
    Vanilla: clip(g) = g (||g|| = 5 < 10), step = -0.5 (g + λx) = (-6.5, -2), norm 6.80 > 5.
    """
    g, x = {"w": torch.tensor([3.0, 4.0], dtype=F64)}, {"w": torch.tensor([100.0, 0.0], dtype=F64)}
    lr, wd, clip = 0.5, 0.1, 10.0
    _, up_nar = _step(clipped_sgd(lr, wd, clip, nar=True), g, x)
    _, up_van = _step(clipped_sgd(lr, wd, clip, nar=False), g, x)
    s = 5.0 / math.sqrt(185.0)
    np.testing.assert_allclose(up_nar["w"].numpy(), [-13 * s, -4 * s], rtol=RTOL)
    np.testing.assert_allclose(up_van["w"].numpy(), [-6.5, -2.0], rtol=RTOL)
    assert float(up_nar["w"].norm()) <= lr * clip * (1 + RTOL)
    van_norm = float(up_van["w"].norm())
    assert van_norm == pytest.approx(math.sqrt(6.5**2 + 4))
    assert van_norm > lr * clip


@pytest.mark.parametrize("seed", range(5))
def test_every_nar_step_is_at_most_lr_times_a(seed):
    gen = torch.Generator().manual_seed(seed)
    lr, wd, clip = 0.05, 0.3, 2.0
    tx = clipped_sgd({"kind": "exponential", "init": lr, "gamma": 0.9}, wd, clip, nar=True)
    for t in range(1, 20):
        g = {"a": torch.randn(5, generator=gen, dtype=F64) * 10 ** (t % 4),
             "b": torch.randn(3, generator=gen, dtype=F64)}
        x = {"a": torch.randn(5, generator=gen, dtype=F64) * 50, "b": torch.zeros(3, dtype=F64)}
        _, up = _step(tx, g, x, float(t))
        norm = math.sqrt(sum(float((u**2).sum()) for u in up.values()))
        assert norm <= lr * 0.9**t * clip * (1 + RTOL)


def test_nar_without_clip_defaults_to_a_10_and_vanilla_without_clip_is_sgd():
    g, x = {"w": torch.tensor([30.0, 40.0], dtype=F64)}, {"w": torch.tensor([1.0, 1.0], dtype=F64)}
    _, up = _step(clipped_sgd(0.1, 0.0, None, nar=True), g, x)  # ||g|| = 50 -> 10
    np.testing.assert_allclose(up["w"].numpy(), [-0.6, -0.8], rtol=RTOL)
    _, up = _step(clipped_sgd(0.1, 0.5, None, nar=False), g, x)  # plain SGD + L2
    np.testing.assert_allclose(up["w"].numpy(), [-3.05, -4.05], rtol=RTOL)


# ------------------------------------------------------------------------- Theorem 1
def test_theorem1_bound_on_adversarial_objective():
    """Concave clients ``-5/2 ||w - b||^2``: gradients grow without bound as w runs away.

    With co-clipping every step has norm <= l A, so ``||x_t|| <= ||x_0|| + η_g τ l A t``
    (Theorem 1 with its A = l·A_clip). Unclipped SGD + decay has
    ``x <- (1 - l(a + λ)) x + l a b`` = 1.499 x + ..., exponential, and breaks the bound.
    """
    rows = [[-5.0, 1.0, 0.0], [-5.0, 0.0, -1.0], [-5.0, 2.0, 2.0]]
    w0, lr, wd, clip, tau, rounds = [0.5, -0.3], 0.1, 0.01, 3.0, 4, 8
    nar_alg = build_algorithm("fedavg", local_lr=lr, weight_decay=wd, max_grad_norm=clip, nar=True)
    sgd_alg = build_algorithm("fedavg", local_lr=lr, weight_decay=wd)
    _, _, _, hist_nar = run_rounds(nar_alg, rows, w0, rounds=rounds, steps=tau)
    _, _, _, hist_sgd = run_rounds(sgd_alg, rows, w0, rounds=rounds, steps=tau)
    x0 = math.hypot(*w0)
    exceeded = False
    for t in range(1, rounds + 1):
        bound = x0 + 1.0 * tau * lr * clip * t
        assert float(hist_nar[t - 1][0]["w"].norm()) <= bound * (1 + RTOL)
        exceeded |= float(hist_sgd[t - 1][0]["w"].norm()) > bound
    assert exceeded
    assert float(hist_sgd[-1][0]["w"].norm()) > 100 * float(hist_nar[-1][0]["w"].norm())
    # and the NAR model really moves (the bound is not met by standing still)
    assert float(hist_nar[-1][0]["w"].norm()) > 2 * x0
