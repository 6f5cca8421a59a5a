"""Four rounds of partial participation against independent float64 references: FedNova and
q-FFL (q-FedAvg).

The problem and the schedule are tests/algorithms/multiround.py: clients take 0-3 local steps,
so FedNova's τ_i and ||a_i||_1 differ between clients, and q-FFL's losses F_k(x^t) differ
between clients and rounds. Each reference is a NumPy loop written from the paper and its
official code (module docstrings of src/fedforge/algorithms/fednova.py and fairness.py); each
test also shows that a wrong rule (plain averaging, q = 0 weighting) fails the comparison.
"""

import numpy as np
import pytest

from fedforge.algorithms import build_algorithm
from tests.algorithms.multiround import SCHEDULE, W0, A, B, compare, grad, run

LR = 0.1
COUNTS = np.array([1, 4, 2, 3, 5])  # n_i: FedNova weights p_i = n_i / Σ_S n_j


# -------------------------------------------------------------------------------- FedNova
def fednova_client(i, w, steps, rho, mu, wd):
    """JYWa/FedNova distoptim/FedNova.py step(): the iterate and local_normalizing_vec."""
    x, m, counter, norm = w.copy(), np.zeros(2), 0.0, 0.0
    for _ in range(steps):
        d = grad(i, x) + wd * x
        if rho:
            m = rho * m + d
            d = m
        if mu:
            d = d + mu * (x - w)
        x = x - LR * d
        if rho:
            counter = counter * rho + 1
            norm += counter
        if mu:
            norm = norm * (1 - LR * mu) + 1
        if not rho and not mu:
            norm += 1
    return x, norm


def fednova_ref(rho=0.0, mu=0.0, wd=0.0, slr=1.0, gmf=0.0, normalise=True):
    """x <- x - slr v, v = gmf v + τ_eff Σ p_i Δ_i/||a_i||_1 (``normalise=False``: Σ p_i Δ_i,
    FedAvg's sample-weighted mean, the rule FedNova replaces)."""
    w, v, out = W0.copy(), np.zeros(2), []
    for ids, steps in SCHEDULE:
        p = COUNTS[ids] / COUNTS[ids].sum()
        step = np.zeros(2)
        tau_eff = 0.0
        for pi, i, k in zip(p, ids, steps):
            x, norm = fednova_client(i, w, k, rho, mu, wd)
            delta = w - x
            if normalise:
                step += pi * (delta / norm if norm > 0 else 0.0)
                tau_eff += pi * (k if mu else norm)
            else:
                step += pi * delta
        v = gmf * v + (tau_eff * step if normalise else step)
        w = w - slr * v
        out.append({"w": w.copy()})
    return out


NOVA_CASES = {
    "sgd": {},
    "momentum": {"rho": 0.5},
    "prox": {"mu": 0.3},
    "momentum_prox_decay": {"rho": 0.5, "mu": 0.3, "wd": 0.2},
    "server_momentum": {"slr": 0.8, "gmf": 0.5},
}


@pytest.mark.parametrize("case", NOVA_CASES)
def test_fednova_four_rounds(case):
    kw = NOVA_CASES[case]
    algo = build_algorithm(
        "fednova", local_lr=LR, local_momentum=kw.get("rho", 0.0), mu=kw.get("mu", 0.0),
        weight_decay=kw.get("wd", 0.0), server_lr=kw.get("slr", 1.0),
        server_momentum=kw.get("gmf", 0.0))
    rounds = run(algo, sample_counts=COUNTS)
    compare(rounds, fednova_ref(**kw))
    with pytest.raises(AssertionError):  # plain (FedAvg) averaging is a different rule
        compare(rounds, fednova_ref(**kw, normalise=False))


def test_fednova_prox_counts_steps_not_the_normaliser():
    """With μ > 0 the code's τ_eff is Σ p_i τ_i; Σ p_i ||a_i||_1 would be another step."""
    rounds = run(build_algorithm("fednova", local_lr=LR, mu=0.3), sample_counts=COUNTS)
    w, out = W0.copy(), []
    for ids, steps in SCHEDULE:  # the wrong τ_eff: the normalisers' weighted mean
        p = COUNTS[ids] / COUNTS[ids].sum()
        res = [fednova_client(i, w, k, 0.0, 0.3, 0.0) for i, k in zip(ids, steps)]
        step = sum(pi * ((w - x) / n if n else 0.0) for pi, (x, n) in zip(p, res))
        w = w - sum(pi * n for pi, (_, n) in zip(p, res)) * step
        out.append({"w": w.copy()})
    with pytest.raises(AssertionError):
        compare(rounds, out)


# ---------------------------------------------------------------------------------- q-FFL
def loss(i, x):
    return 0.5 * A[i] * np.sum((x - B[i]) ** 2)


def qffl_ref(q):
    """fair_flearn qffedavg.py: Δw_k = (x^t - x_k)/η, Δ_k = F^q Δw_k,
    h_k = q F^(q-1) ||Δw_k||² + F^q / η, x <- x - Σ Δ_k / Σ h_k (F + 1e-10; a client
    without data this round has F = 0)."""
    w, out = W0.copy(), []
    for ids, steps in SCHEDULE:
        deltas, hs = [], []
        for i, k in zip(ids, steps):
            f = (loss(i, w) if k > 0 else 0.0) + 1e-10
            x = w.copy()
            for _ in range(k):
                x = x - LR * grad(i, x)
            dw = (w - x) / LR
            deltas.append(f**q * dw)
            hs.append(q * f ** (q - 1) * np.sum(dw**2) + f**q / LR)
        w = w - np.sum(deltas, 0) / np.sum(hs)
        out.append({"w": w.copy()})
    return out


@pytest.mark.parametrize("q", [2.0, 0.5, 0.0])
def test_qffl_four_rounds(q):
    rounds = run(build_algorithm("qffl", local_lr=LR, q=q))
    compare(rounds, qffl_ref(q))
    wrong = 0.0 if q else 2.0  # q = 0 is FedAvg's uniform weighting, q > 0 is not
    with pytest.raises(AssertionError):
        compare(rounds, qffl_ref(wrong))


def test_qffl_with_q_zero_is_uniform_fedavg():
    """q = 0: Σ Δw_k / (S L) = mean_k (x^t - x_k), FedAvg with weights 1/S."""
    got = run(build_algorithm("qffl", local_lr=LR, q=0.0))
    want = run(build_algorithm("fedavg", local_lr=LR))  # the harness weights uniformly
    for a, b in zip(got, want):
        np.testing.assert_allclose(a.params, b.params, rtol=1e-9)


# ------------------------------------------------------------------------------------ AFL
def simplex(v):
    """Euclidean projection onto the simplex, written from Duchi et al. 2008, Fig. 1."""
    u = np.sort(v)[::-1]
    css = np.cumsum(u)
    rho = max(j for j in range(len(v)) if u[j] - (css[j] - 1) / (j + 1) > 0)
    return np.maximum(v - (css[rho] - 1) / (rho + 1), 0.0)


def afl_ref(lam_lr, slr=1.0, learn_lambda=True, scale=True):
    """Mohri et al. 2019, Alg. 1 with S of N clients: x <- x - slr (N/S) Σ_S λ_k Δ_k,
    λ <- Proj(λ + γ (N/S) Σ_S F_k(x^t) e_k); evaluated at the mean of x^1..x^t.
    ``learn_lambda=False``: λ stays uniform (FedAvg); ``scale=False``: no N/S."""
    n = len(A)
    w, lam, iterates, out = W0.copy(), np.full(n, 1.0 / n), [], []
    for ids, steps in SCHEDULE:
        f = n / len(ids) if scale else 1.0
        step, grad_lam = np.zeros(2), np.zeros(n)
        for i, k in zip(ids, steps):
            x = w.copy()
            for _ in range(k):
                x = x - LR * grad(i, x)
            step += f * lam[i] * (w - x)
            grad_lam[i] += f * (loss(i, w) if k > 0 else 0.0)
        w = w - slr * step
        if learn_lambda:
            lam = simplex(lam + lam_lr * grad_lam)
        iterates.append(w.copy())
        out.append({"w": w.copy(), "eval": np.mean(iterates, 0), "lam": lam.copy()})
    return out


@pytest.mark.parametrize("lam_lr", [0.5, 0.05])
def test_afl_four_rounds(lam_lr):
    algo = build_algorithm("afl", local_lr=LR, lambda_lr=lam_lr, server_lr=0.8)
    rounds = run(algo)
    ref = afl_ref(lam_lr, slr=0.8)
    assert ref[-1]["lam"].min() == 0.0 or lam_lr < 0.5  # the projection clips at 0.5
    compare(rounds, ref)
    for t, (got, want) in enumerate(zip(rounds, ref), start=1):
        np.testing.assert_allclose(got.eval_params, want["eval"], rtol=1e-6,
                                   err_msg=f"round {t}: mean of the iterates")
    for wrong in (afl_ref(lam_lr, 0.8, learn_lambda=False), afl_ref(lam_lr, 0.8, scale=False)):
        with pytest.raises(AssertionError):
            compare(rounds, wrong)


def test_afl_last_iterate_and_project():
    """average_iterates=False evaluates x^t; the projection lands on the simplex."""
    from fedforge.algorithms.fairness import project_simplex

    rounds = run(build_algorithm("afl", local_lr=LR, lambda_lr=0.5, average_iterates=False))
    assert all(np.array_equal(r.eval_params, r.params) for r in rounds)
    import torch

    v = torch.tensor([0.9, -0.3, 0.6, 0.2], dtype=torch.float64)
    np.testing.assert_allclose(project_simplex(v).numpy(), simplex(v.numpy()), rtol=1e-12)
    assert abs(float(project_simplex(v).sum()) - 1) < 1e-12
