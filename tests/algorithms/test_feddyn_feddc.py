"""FedDyn and FedDC: one round by hand, and several rounds against a NumPy reference.

Quadratic clients (tests/quadratic.py): per-sample loss ``a/2 ||w - b||²``, gradient
``a (w - b)``. Hand numbers, clients b_1 = (2, 0), b_2 = (0, 4), a = 1, w0 = 0, lr 0.1,
α = 0.5, one local step::

    both: w_1 = (0.2, 0), w_2 = (0, 0.4); delta_1 = (-0.2, 0), delta_2 = (0, -0.4)
    FedDyn: g_1 = α delta_1 = (-0.1, 0), g_2 = (0, -0.2); h = α (2/2) mean delta = (-0.05, -0.1)
            θ = mean w_i - h/α = (0.1, 0.2) + (0.1, 0.2) = (0.2, 0.4)
    FedDC:  h_1 = (0.2, 0), h_2 = (0, 0.4); G_i = delta_i/(1·0.1); G = mean G_i = (-1, -2)
            h̄ = mean_all h_i = (0.1, 0.2); w = mean w_i + h̄ = (0.2, 0.4)
"""

import numpy as np
import pytest
import torch

from fedforge.algorithms import build_algorithm
from tests.quadratic import ENGINES, run_rounds

ROWS = [[1.0, 2.0, 0.0], [1.0, 0.0, 4.0]]


@pytest.mark.parametrize("engine", ENGINES)
def test_feddyn_one_round_by_hand(engine):
    algo = build_algorithm("feddyn", local_lr=0.1, alpha=0.5)
    params, server, store, _ = run_rounds(algo, ROWS, [0.0, 0.0], engine=ENGINES[engine]())
    torch.testing.assert_close(params["w"], torch.tensor([0.2, 0.4], dtype=torch.float64))
    torch.testing.assert_close(
        server["parts"]["feddyn"]["h"]["w"], torch.tensor([-0.05, -0.1], dtype=torch.float64)
    )
    torch.testing.assert_close(
        store.state["feddyn"]["grad"]["w"],
        torch.tensor([[-0.1, 0.0], [0.0, -0.2]], dtype=torch.float64),
    )


@pytest.mark.parametrize("engine", ENGINES)
def test_feddc_one_round_by_hand(engine):
    algo = build_algorithm("feddc", local_lr=0.1, alpha=0.5)
    params, server, store, _ = run_rounds(algo, ROWS, [0.0, 0.0], engine=ENGINES[engine]())
    f64 = torch.float64
    torch.testing.assert_close(params["w"], torch.tensor([0.2, 0.4], dtype=f64))
    torch.testing.assert_close(
        server["parts"]["feddc"]["G"]["w"], torch.tensor([-1.0, -2.0], dtype=f64)
    )
    torch.testing.assert_close(
        server["parts"]["feddc"]["hbar"]["w"], torch.tensor([0.1, 0.2], dtype=f64)
    )
    torch.testing.assert_close(
        store.state["feddc"]["h"]["w"], torch.tensor([[0.2, 0.0], [0.0, 0.4]], dtype=f64)
    )


def _reference(rule, rows, ids_per_round, n, w0, lr, alpha, steps):
    """Independent NumPy FedDyn / FedDC on quadratic clients, uniform averaging."""
    a = np.array([r[0] for r in rows])
    b = np.array([r[1:] for r in rows])
    w = np.array(w0, dtype=float)
    g_i, h_i, G_i = np.zeros((n, 2)), np.zeros((n, 2)), np.zeros((n, 2))
    h, G = np.zeros(2), np.zeros(2)
    for ids in ids_per_round:
        thetas = []
        for i in ids:
            th = w.copy()
            for _ in range(steps):
                grad = a[i] * (th - b[i])
                if rule == "feddyn":
                    grad = grad - g_i[i] + alpha * (th - w)
                else:
                    grad = grad + alpha * (th + h_i[i] - w) + G - G_i[i]
                th = th - lr * grad
            thetas.append(th)
        thetas = np.array(thetas)
        if rule == "feddyn":
            for i, th in zip(ids, thetas):
                g_i[i] -= alpha * (th - w)
            h = h - alpha / n * (thetas - w).sum(0)
            w = thetas.mean(0) - h / alpha
        else:
            dG = []
            for i, th in zip(ids, thetas):
                h_i[i] += th - w
                new = G_i[i] - G + (w - th) / (steps * lr)
                dG.append(new - G_i[i])
                G_i[i] = new
            G = G + np.sum(dG, 0) / n
            w = thetas.mean(0) + h_i.mean(0)
    return w


@pytest.mark.parametrize("rule", ["feddyn", "feddc"])
def test_multi_round_partial_participation_matches_numpy(rule):
    """3 clients, 2 sampled per round (ids vary), 3 local steps, 4 rounds."""
    from fedforge.core.store import ClientStore
    from fedforge.engine import LoopEngine
    from fedforge.engine.draw import RoundDraw
    from fedforge.engine.round import RoundSetup, federated_round
    from tests.quadratic import make_clients, quadratic_loss

    rows = [[1.0, 2.0, 0.0], [2.0, 0.0, 4.0], [0.5, -1.0, 1.0]]
    schedule = [[0, 1], [1, 2], [0, 2], [0, 1]]
    algo = build_algorithm(rule, local_lr=0.1, alpha=0.3)
    x_all, y_all = make_clients(rows)
    params = {"w": torch.tensor([0.5, -0.5], dtype=torch.float64)}
    server = algo.server_init(params)
    store = ClientStore(3, algo.client_init(params))
    for ids in schedule:
        ids_t = torch.tensor(ids)
        sample_idx = ids_t.view(-1, 1, 1).expand(-1, 3, 1).clone()
        draw = RoundDraw(ids_t, sample_idx, torch.ones(sample_idx.shape, dtype=torch.float64))
        params, server, _ = federated_round(
            RoundSetup(algo, LoopEngine(), quadratic_loss, store, x_all, y_all), params, server,
            draw)
    ref = _reference(rule, rows, schedule, 3, [0.5, -0.5], 0.1, 0.3, 3)
    # 1e-7: the step count K is a float32 tensor inside the engine
    np.testing.assert_allclose(params["w"].numpy(), ref, rtol=1e-7, atol=1e-9)


def test_bad_alpha_names_the_field():
    with pytest.raises(ValueError, match="algorithm.alpha"):
        build_algorithm("feddyn", alpha=0.0)
