"""FAdamGC, FA-NT, LocalAdam, FedAvg-M and SCAFFOLD-M on 2-parameter quadratic clients.

The references below are independent NumPy transcriptions of the paper's Algorithm 1 / 2
(Chen et al., "Gradient Correction in Federated Learning with Adaptive Optimization") and of
Cheng et al. 2023's FedAvg-M / SCAFFOLD-M; they share no code with fedforge.
Per-sample loss: ``a/2 ||w - b||^2`` so ``grad = a (w - b)`` (see ``tests/quadratic.py``).
"""

import numpy as np
import pytest
import torch

from fedforge.algorithms import build_algorithm
from fedforge.algorithms.fadamgc import num_tracking, sample_tracking
from fedforge.core.store import ClientStore
from fedforge.engine.draw import RoundDraw
from fedforge.engine.round import RoundSetup, federated_round
from tests.quadratic import ENGINES, quadratic_loss

F64 = torch.float64
B1, B2, EPS = 0.9, 0.99, 1e-8
# client 0: a=1, b=(1, 0); client 1: a=3, b=(0, 2)
ROWS = [[1.0, 1.0, 0.0], [3.0, 0.0, 2.0]]


# --------------------------------------------------------------------------- helpers
def run(algo, rows, w0, *, masks, steps, num_clients=None, per_client=1, engine="loop",
        init=None):
    """Rounds of full participation of ``len(rows) // per_client`` clients.

    Client i owns rows ``[i*per_client, (i+1)*per_client)`` and cycles through them, one row
    per local step. ``masks[r]`` is round r's tracking mask (None: no info). ``init(params,
    server_state, store)`` may overwrite the initial state in place.
    """
    x_all = torch.tensor(rows, dtype=F64)
    y_all = torch.zeros(len(rows), dtype=torch.long)
    c = len(rows) // per_client
    params = {"w": torch.tensor(w0, dtype=F64)}
    server_state = algo.server_init(params)
    store = ClientStore(num_clients or c, algo.client_init(params))
    if init is not None:
        init(params, server_state, store)
    ids = torch.arange(c)
    sample_idx = torch.tensor(
        [[[i * per_client + k % per_client] for k in range(steps)] for i in range(c)]
    )
    weights = torch.ones(sample_idx.shape, dtype=F64)
    eng = ENGINES[engine]()
    for mask in masks:
        info = None if mask is None else {"tracking": torch.tensor(mask)}
        params, server_state, _ = federated_round(
            RoundSetup(algo, eng, quadratic_loss, store, x_all, y_all), params, server_state,
            RoundDraw(ids, sample_idx, weights, info=info))
    return params, server_state, store


def _t(a):
    return torch.tensor(np.array(a), dtype=F64)


def grad(row, x):
    a, b = row[0], np.asarray(row[1:])
    return a * (x - b)


def ref_local_adam_rounds(rows, x0, *, rounds, steps, lr, n, masks, y0, yi0, vi0,
                          correction="pre", use_max=True, server_lr=1.0):
    """NumPy Algorithm 1 (correction="pre"), Algorithm 2 ("post") or LocalAdam (None)."""
    x, y = np.array(x0, float), np.array(y0, float)
    yi = [np.array(v, float) for v in yi0]
    vi = [np.array(v, float) for v in vi0]
    for r in range(rounds):
        deltas, dys = [], []
        for i, row in enumerate(rows):
            xi, m, v = x.copy(), np.zeros(2), vi[i].copy()
            vhat, gsum = v.copy(), np.zeros(2)
            for _ in range(steps):
                g = grad(row, xi)
                gsum += g
                gh = g + y - yi[i] if correction == "pre" else g
                m = B1 * m + (1 - B1) * gh
                v = B2 * v + (1 - B2) * gh * gh
                vhat = np.maximum(vhat, v) if use_max else v
                d = m / (np.sqrt(vhat) + EPS)
                if correction == "post":
                    d = d + y - yi[i]
                xi = xi - lr * d
            vi[i] = v
            new_yi = yi[i]
            if masks[r][i]:
                if correction == "post":
                    new_yi = yi[i] - y + (x - xi) / (steps * lr)
                else:
                    new_yi = gsum / steps
            dys.append(new_yi - yi[i])
            yi[i] = new_yi
            deltas.append(x - xi)
        x = x - server_lr * np.mean(deltas, axis=0)
        y = y + np.sum(dys, axis=0) / n
    return x, y, yi, vi


def _init_state(y, yi, vi, part="tracking"):
    def init(params, server_state, store):
        if part is not None:
            server_state["parts"][part]["y"]["w"] = torch.tensor(y, dtype=F64)
            store.state[part]["y"]["w"][: len(yi)] = _t(yi)
        store.state["adam_v"]["v"]["w"][: len(vi)] = _t(vi)

    return init


# non-trivial starting state: y, y_i != 0, and a large carried v_i for client 0 so that
# v decays below it during the round and the v-hat max is what divides the step
Y0 = [0.3, -0.2]
YI0 = [[0.5, 0.1], [-0.4, 0.6]]
VI0 = [[4.0, 0.01], [0.0, 0.5]]


# --------------------------------------------------------------------------- Algorithm 1
@pytest.mark.parametrize("engine", ENGINES)
def test_fadamgc_one_round_matches_numpy_reference(engine):
    """n = 3 clients in the store (1/n = 1/3 != 1/S), S = 2 sampled, S̃ = {client 0}, K = 3."""
    lr, K, n = 0.1, 3, 3
    algo = build_algorithm("fadamgc", local_lr=lr)
    params, server_state, store = run(
        algo, ROWS, [0.0, 0.0], masks=[[True, False]], steps=K, num_clients=n, engine=engine,
        init=_init_state(Y0, YI0, VI0),
    )
    x, y, yi, vi = ref_local_adam_rounds(ROWS, [0, 0], rounds=1, steps=K, lr=lr, n=n,
                                         masks=[[True, False]], y0=Y0, yi0=YI0, vi0=VI0)
    torch.testing.assert_close(params["w"], torch.tensor(x, dtype=F64))
    torch.testing.assert_close(server_state["parts"]["tracking"]["y"]["w"],
                               torch.tensor(y, dtype=F64))
    torch.testing.assert_close(store.state["tracking"]["y"]["w"][:2], _t(yi))
    torch.testing.assert_close(store.state["adam_v"]["v"]["w"][:2], _t(vi))
    # client 1 did not track: y_1 unchanged; client 2 was not sampled: untouched
    torch.testing.assert_close(store.state["tracking"]["y"]["w"][1], _t(YI0[1]))
    assert not store.state["tracking"]["y"]["w"][2].any()
    assert not store.state["adam_v"]["v"]["w"][2].any()
    # the test discriminates: dropping the v-hat max, or correcting after the moments, moves x
    for kw in ({"use_max": False}, {"correction": "post"}, {"correction": None}):
        x_wrong, *_ = ref_local_adam_rounds(ROWS, [0, 0], rounds=1, steps=K, lr=lr, n=n,
                                            masks=[[True, False]], y0=Y0, yi0=YI0, vi0=VI0, **kw)
        assert np.abs(x_wrong - x).max() > 1e-5, kw  # >> assert_close's float64 tolerance


def test_fadamgc_first_step_by_hand():
    """K = 1, no carried state: ĝ = g, m = 0.1 g, v = 0.01 g², step = lr * sign(g) (ε ≈ 0).
    client 0: g = (-1, 0) -> x = (0.1, 0); client 1: g = (0, -6) -> x = (0, 0.1).
    x1 = (0.05, 0.05); both track: y_0 = (-1, 0), y_1 = (0, -6); y = (1/2) Σ y_i = (-0.5, -3);
    v_0 = (0.01, 0), v_1 = (0, 0.36). Without bias correction the step is lr, not lr/(1-β1)."""
    algo = build_algorithm("fadamgc", local_lr=0.1, tracking_fraction=1.0)
    params, server_state, store = run(algo, ROWS, [0.0, 0.0], masks=[[True, True]], steps=1)
    torch.testing.assert_close(params["w"], torch.tensor([0.05, 0.05], dtype=F64))
    torch.testing.assert_close(server_state["parts"]["tracking"]["y"]["w"],
                               torch.tensor([-0.5, -3.0], dtype=F64))
    torch.testing.assert_close(store.state["tracking"]["y"]["w"],
                               torch.tensor([[-1.0, 0.0], [0.0, -6.0]], dtype=F64))
    torch.testing.assert_close(store.state["adam_v"]["v"]["w"],
                               torch.tensor([[0.01, 0.0], [0.0, 0.36]], dtype=F64))


def test_fadamgc_three_rounds_match_reference_m_reset_v_carried():
    """Several rounds with changing tracking sets: m restarts at 0 each round, v_i carries."""
    lr, K, n = 0.05, 4, 2
    masks = [[True, False], [False, True], [True, True]]
    algo = build_algorithm("fadamgc", local_lr=lr)
    params, server_state, store = run(algo, ROWS, [0.5, -0.5], masks=masks, steps=K)
    x, y, yi, vi = ref_local_adam_rounds(ROWS, [0.5, -0.5], rounds=3, steps=K, lr=lr, n=n,
                                         masks=masks, y0=[0, 0], yi0=[[0, 0]] * 2,
                                         vi0=[[0, 0]] * 2)
    torch.testing.assert_close(params["w"], torch.tensor(x, dtype=F64))
    torch.testing.assert_close(server_state["parts"]["tracking"]["y"]["w"],
                               torch.tensor(y, dtype=F64))
    torch.testing.assert_close(store.state["tracking"]["y"]["w"], _t(yi))
    torch.testing.assert_close(store.state["adam_v"]["v"]["w"], _t(vi))


# --------------------------------------------------------------------------- Algorithm 2
@pytest.mark.parametrize("engine", ENGINES)
def test_fa_nt_one_round_matches_numpy_reference(engine):
    lr, K, n = 0.1, 3, 3
    algo = build_algorithm("fa_nt", local_lr=lr)
    params, server_state, store = run(
        algo, ROWS, [0.0, 0.0], masks=[[False, True]], steps=K, num_clients=n, engine=engine,
        init=_init_state(Y0, YI0, VI0),
    )
    x, y, yi, vi = ref_local_adam_rounds(ROWS, [0, 0], rounds=1, steps=K, lr=lr, n=n,
                                         masks=[[False, True]], y0=Y0, yi0=YI0, vi0=VI0,
                                         correction="post")
    torch.testing.assert_close(params["w"], torch.tensor(x, dtype=F64))
    torch.testing.assert_close(server_state["parts"]["tracking"]["y"]["w"],
                               torch.tensor(y, dtype=F64))
    torch.testing.assert_close(store.state["tracking"]["y"]["w"][:2], _t(yi))
    torch.testing.assert_close(store.state["adam_v"]["v"]["w"][:2], _t(vi))


def test_fa_nt_tracks_mean_adam_direction():
    """Appendix C: FA-NT's y_i+ = (1/K) Σ_k Δ_k, the mean Adam direction (zero start)."""
    lr, K = 0.1, 3
    algo = build_algorithm("fa_nt", local_lr=lr, tracking_fraction=1.0)
    _, _, store = run(algo, ROWS[:1], [0.0, 0.0], masks=[[True]], steps=K)
    x, m, v, vhat, ds = np.zeros(2), np.zeros(2), np.zeros(2), np.zeros(2), []
    for _ in range(K):
        g = grad(ROWS[0], x)
        m, v = B1 * m + (1 - B1) * g, B2 * v + (1 - B2) * g * g
        vhat = np.maximum(vhat, v)
        ds.append(m / (np.sqrt(vhat) + EPS))
        x = x - lr * ds[-1]
    torch.testing.assert_close(store.state["tracking"]["y"]["w"][0],
                               torch.tensor(np.mean(ds, axis=0), dtype=F64))


# --------------------------------------------------------------------------- reductions
@pytest.mark.parametrize("name", ["fadamgc", "fa_nt"])
def test_identical_clients_reduce_to_localadam_amsgrad(name):
    """Identical clients, full participation, S̃ = S: y_i = y, the correction vanishes, and
    the run equals LocalAdam (AMSGrad, no bias correction, v_i carried) round after round.
    Each client has two different samples, so its gradients vary within the round."""
    rows = [[1.0, 1.0, 0.0], [2.0, -1.0, 3.0]] * 2  # client 0 and client 1 hold the same data
    lr, K, rounds = 0.05, 5, 4
    masks = [[True, True]] * rounds
    kw = dict(steps=K, per_client=2)
    ref_p, _, ref_store = run(build_algorithm("localadam", local_lr=lr), rows, [0.3, 0.1],
                              masks=[None] * rounds, **kw)
    algo = build_algorithm(name, local_lr=lr, tracking_fraction=1.0)
    for r in range(1, rounds + 1):
        ref_r, _, ref_s = run(build_algorithm("localadam", local_lr=lr), rows, [0.3, 0.1],
                              masks=[None] * r, **kw)
        p, server_state, store = run(algo, rows, [0.3, 0.1], masks=masks[:r], **kw)
        torch.testing.assert_close(p["w"], ref_r["w"], rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(store.state["adam_v"]["v"]["w"],
                                   ref_s.state["adam_v"]["v"]["w"], rtol=1e-12, atol=1e-12)
    # tracking did happen (y != 0), the correction just cancels
    assert server_state["parts"]["tracking"]["y"]["w"].abs().max() > 1e-2
    torch.testing.assert_close(store.state["tracking"]["y"]["w"][0],
                               server_state["parts"]["tracking"]["y"]["w"])
    # and the model moved: LocalAdam is not trivially at rest here
    assert (ref_p["w"] - torch.tensor([0.3, 0.1], dtype=F64)).abs().max() > 1e-2


def test_fixed_point_fadamgc_stays_localadam_drifts():
    """Eq. 4: at x* = argmin (f_0 + f_1)/2 with converged tracking y_i = ∇f_i(x*), y = 0,
    exact gradients: ĝ = ∇f_i + y - y_i = 0, so FAdamGC never moves; LocalAdam drifts.
    x* = Σ a_i b_i / Σ a_i = (0.25, 1.5); ∇f_0(x*) = (-0.75, 1.5), ∇f_1(x*) = (0.75, -1.5)."""
    xstar = [0.25, 1.5]
    yi = [[-0.75, 1.5], [0.75, -1.5]]
    lr, K, rounds = 0.05, 10, 3
    masks = [[True, True]] * rounds
    algo = build_algorithm("fadamgc", local_lr=lr, tracking_fraction=1.0)
    p, server_state, store = run(algo, ROWS, xstar, masks=masks, steps=K,
                                 init=_init_state([0.0, 0.0], yi, [[0, 0]] * 2))
    torch.testing.assert_close(p["w"], torch.tensor(xstar, dtype=F64), rtol=0, atol=1e-12)
    torch.testing.assert_close(store.state["tracking"]["y"]["w"], _t(yi))
    assert server_state["parts"]["tracking"]["y"]["w"].abs().max() < 1e-12

    p_la, _, _ = run(build_algorithm("localadam", local_lr=lr), ROWS, xstar,
                     masks=[None] * rounds, steps=K)
    drift = (p_la["w"] - torch.tensor(xstar, dtype=F64)).norm().item()
    assert drift > 1e-2, drift
    # and the NumPy reference agrees on LocalAdam's drift
    x, *_ = ref_local_adam_rounds(ROWS, xstar, rounds=rounds, steps=K, lr=lr, n=2, masks=masks,
                                  y0=[0, 0], yi0=[[0, 0]] * 2, vi0=[[0, 0]] * 2, correction=None)
    torch.testing.assert_close(p_la["w"], torch.tensor(x, dtype=F64))


def test_localadam_bias_corrected_variant_differs():
    lr = 0.1
    a, _, _ = run(build_algorithm("localadam", local_lr=lr), ROWS, [0.0, 0.0], masks=[None],
                  steps=1)
    b, _, _ = run(build_algorithm("localadam", local_lr=lr, bias_correction=True, carry_v=False),
                  ROWS, [0.0, 0.0], masks=[None], steps=1)
    # first step: without bias correction the step is lr*sign(g); with it, also lr*sign(g)
    torch.testing.assert_close(a["w"], b["w"])
    a, _, _ = run(build_algorithm("localadam", local_lr=lr), ROWS, [0.0, 0.0], masks=[None],
                  steps=3)
    b, _, _ = run(build_algorithm("localadam", local_lr=lr, bias_correction=True, carry_v=False),
                  ROWS, [0.0, 0.0], masks=[None], steps=3)
    assert (a["w"] - b["w"]).abs().max() > 1e-4


# --------------------------------------------------------------------------- tracking set
def test_tracking_subset_sampling():
    assert [num_tracking(10, f) for f in (0.0, 0.05, 0.5, 0.55, 1.0)] == [0, 1, 5, 6, 10]
    g = torch.Generator().manual_seed(3)
    masks = torch.stack([sample_tracking(10, 0.5, g) for _ in range(400)])
    assert (masks.sum(1) == 5).all()
    freq = masks.double().mean(0)  # uniform: every position tracks about half the time
    assert (freq - 0.5).abs().max() < 0.1
    a = sample_tracking(10, 0.5, torch.Generator().manual_seed(7))
    b = sample_tracking(10, 0.5, torch.Generator().manual_seed(7))
    assert torch.equal(a, b)
    info = build_algorithm("fadamgc").round_info(10, torch.Generator().manual_seed(0))
    assert info["tracking"].dtype == torch.bool and int(info["tracking"].sum()) == 5
    with pytest.raises(ValueError, match="tracking_fraction"):
        build_algorithm("fadamgc", tracking_fraction=1.5)


def test_missing_tracking_info_is_an_error():
    with pytest.raises(KeyError, match="round_info"):
        run(build_algorithm("fadamgc", local_lr=0.1), ROWS, [0.0, 0.0], masks=[None], steps=1)


def test_message_sizes_match_the_papers_per_round_ratios():
    """Per sampled client, in model-sized vectors (§4.4 of the spec note):
    LocalAdam/FedAdam 1 down + 1 up; FedAvg-M 2 + 1; FAdamGC/FA-NT (S̃ = S/2) 2 + 1.5;
    SCAFFOLD-M 3 + 2."""
    params = {"w": torch.zeros(1000, dtype=torch.float32)}
    d = 4000
    expect = {"localadam": (1, 1), "fedadam": (1, 1), "fedams": (1, 1), "fedavg_m": (2, 1),
              "fadamgc": (2, 1.5), "fa_nt": (2, 1.5), "scaffold_m": (3, 2)}
    for name, (down, up) in expect.items():
        algo = build_algorithm(name)
        assert algo.message_nbytes(params, algo.server_init(params)) == (down * d, up * d), name


# --------------------------------------------------------------------------- Cheng et al.
def ref_momentum_rounds(rows, x0, *, rounds, steps, lr, beta, n, scaffold):
    x, gm = np.array(x0, float), np.zeros(2)
    c, ci = np.zeros(2), [np.zeros(2) for _ in rows]
    for _ in range(rounds):
        deltas, dcs = [], []
        for i, row in enumerate(rows):
            xi, gsum = x.copy(), np.zeros(2)
            for _ in range(steps):
                g = grad(row, xi)
                gsum += g
                gc = g - ci[i] + c if scaffold else g
                xi = xi - lr * (beta * gc + (1 - beta) * gm)
            deltas.append(x - xi)
            if scaffold:
                dcs.append(gsum / steps - ci[i])
                ci[i] = gsum / steps
        gm = np.mean(deltas, axis=0) / (lr * steps)
        x = x - np.mean(deltas, axis=0)
        if scaffold:
            c = c + np.sum(dcs, axis=0) / n
    return x, gm, c


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("name", ["fedavg_m", "scaffold_m"])
def test_cheng_momentum_methods_match_reference(name, engine):
    lr, K, beta, rounds = 0.05, 3, 0.3, 3
    algo = build_algorithm(name, local_lr=lr, beta=beta)
    masks = [[True, True]] * rounds if name == "scaffold_m" else [None] * rounds
    p, server_state, _ = run(algo, ROWS, [0.0, 0.0], masks=masks, steps=K, num_clients=3,
                             engine=engine)
    x, gm, c = ref_momentum_rounds(ROWS, [0, 0], rounds=rounds, steps=K, lr=lr, beta=beta, n=3,
                                   scaffold=name == "scaffold_m")
    torch.testing.assert_close(p["w"], torch.tensor(x, dtype=F64))
    torch.testing.assert_close(server_state["parts"]["momentum"]["g"]["w"],
                               torch.tensor(gm, dtype=F64))
    if name == "scaffold_m":
        torch.testing.assert_close(server_state["parts"]["scaffold_m"]["y"]["w"],
                                   torch.tensor(c, dtype=F64))


def test_fedavg_m_with_beta_one_is_fedavg():
    a, _, _ = run(build_algorithm("fedavg_m", local_lr=0.1, beta=1.0), ROWS, [0.0, 0.0],
                  masks=[None] * 3, steps=2)
    b, _, _ = run(build_algorithm("fedavg", local_lr=0.1, local_momentum=0.0), ROWS, [0.0, 0.0],
                  masks=[None] * 3, steps=2)
    torch.testing.assert_close(a["w"], b["w"])


# --------------------------------------------------------------------------- tracking_init
# two rows per client: client 0 = {a=1, b=(1,0)}, {a=1, b=(3,0)}; client 1 = {a=3, b=(0,2)},
# {a=1, b=(2,2)}. At w = 0 the per-sample gradients a (w - b) are (-1,0), (-3,0) and
# (0,-6), (-2,-2): ∇f_0(x¹) = (-2, 0), ∇f_1(x¹) = (-1, -4), their mean (-1.5, -2).
ROWS2 = [[1.0, 1.0, 0.0], [1.0, 3.0, 0.0], [3.0, 0.0, 2.0], [1.0, 2.0, 2.0]]


def _round_loop(algo, rows, ids, masks, *, num_clients, per_client=2, steps=2, engine="loop"):
    """Rounds on ``ids`` (client i owns rows [2i, 2i+2)), returning every cohort output."""
    x_all = torch.tensor(rows, dtype=F64)
    y_all = torch.zeros(len(rows), dtype=torch.long)
    params = {"w": torch.zeros(2, dtype=F64)}
    server_state = algo.server_init(params)
    store = ClientStore(num_clients, algo.client_init(params))
    cohorts = []
    for cohort_ids, mask in zip(ids, masks, strict=True):
        cids = torch.tensor(cohort_ids)
        sample_idx = torch.tensor(
            [[[i * per_client + k % per_client] for k in range(steps)] for i in cohort_ids])
        weights = torch.ones(sample_idx.shape, dtype=F64)
        params, server_state, cohort = federated_round(
            RoundSetup(algo, ENGINES[engine](), quadratic_loss, store, x_all, y_all), params,
            server_state, RoundDraw(cids, sample_idx, weights,
                                    info={"tracking": torch.tensor(mask)}))
        cohorts.append(cohort)
    return params, server_state, store, cohorts


@pytest.mark.parametrize("name", ["fadamgc", "fa_nt"])
def test_full_gradient_init_by_hand(name):
    """No tracker in round 1: y_i = ∇f_i(x¹) and y = (1/n) Σ y_i, computed before training."""
    algo = build_algorithm(name, local_lr=0.1, tracking_init="full_gradient")
    _, server_state, store, (cohort,) = _round_loop(algo, ROWS2, [[0, 1]], [[False, False]],
                                                    num_clients=2)
    torch.testing.assert_close(store.state["tracking"]["y"]["w"],
                               torch.tensor([[-2.0, 0.0], [-1.0, -4.0]], dtype=F64))
    torch.testing.assert_close(server_state["parts"]["tracking"]["y"]["w"],
                               torch.tensor([-1.5, -2.0], dtype=F64))
    assert store.state["tracking"]["ready"].tolist() == [1.0, 1.0]
    assert store.state["tracking"]["count"].tolist() == [0.0, 0.0]
    # the two samples per client are charged to the clock (prep samples), once
    assert cohort.metrics.prep_samples.tolist() == [2.0, 2.0]
    diag = algo.server_metrics(server_state, store.state)
    assert diag["tracking_joined"] == 2.0
    assert diag["tracking_init_bytes_up"] == 2 * 2 * 8  # two float64 2-vectors


@pytest.mark.parametrize("engine", ENGINES)
def test_full_gradient_init_is_lazy_and_keeps_y_the_mean_of_y_i(engine):
    """Client 1 joins in round 2 at x¹ (not at x²); the server's y is the mean over the
    clients that joined until all did, and y = (1/n) Σ_i y_i afterwards, trackers included."""
    algo = build_algorithm("fadamgc", local_lr=0.1, tracking_init="full_gradient")
    _, server_state, store, cohorts = _round_loop(
        algo, ROWS2, [[0], [1], [0, 1]], [[False], [False], [True, False]], num_clients=2,
        engine=engine)
    yi = store.state["tracking"]["y"]["w"]
    torch.testing.assert_close(yi[1], torch.tensor([-1.0, -4.0], dtype=F64))  # at x¹
    assert cohorts[1].metrics.prep_samples.tolist() == [2.0]
    assert cohorts[2].metrics.prep_samples.tolist() == [0.0, 0.0]  # nobody pays twice
    torch.testing.assert_close(server_state["parts"]["tracking"]["y"]["w"], yi.mean(0))
    assert store.state["tracking"]["count"].tolist() == [1.0, 0.0]


def test_full_gradient_estimate_before_everyone_joined():
    algo = build_algorithm("fadamgc", local_lr=0.1, tracking_init="full_gradient")
    _, server_state, store, _ = _round_loop(algo, ROWS2, [[1]], [[False]], num_clients=2)
    torch.testing.assert_close(server_state["parts"]["tracking"]["y"]["w"],
                               torch.tensor([-1.0, -4.0], dtype=F64))  # mean over joined
    assert store.state["tracking"]["ready"].tolist() == [0.0, 1.0]


def test_unknown_tracking_init_is_an_error():
    with pytest.raises(ValueError, match="tracking_init"):
        build_algorithm("fadamgc", tracking_init="ones")


# --------------------------------------------------------------------------- diagnostics
def test_tracking_diagnostics_by_hand():
    """The setting of test_fadamgc_first_step_by_hand, then a second round.

    Round 1: y = y_i = 0, so the correction is 0. After it y = (-0.5, -3), y_0 = (-1, 0),
    y_1 = (0, -6): ‖y - y_i‖ = √9.25 for both clients. Round 2 starts at x = (0.05, 0.05),
    where the raw gradients are (-0.95, 0.05) and (0.15, -5.85) (K = 1)."""
    algo = build_algorithm("fadamgc", local_lr=0.1, tracking_fraction=1.0)
    x_all = torch.tensor(ROWS, dtype=F64)
    y_all = torch.zeros(2, dtype=torch.long)
    params = {"w": torch.zeros(2, dtype=F64)}
    server_state = algo.server_init(params)
    store = ClientStore(2, algo.client_init(params))
    ids, sample_idx = torch.arange(2), torch.tensor([[[0]], [[1]]])
    weights = torch.ones(sample_idx.shape, dtype=F64)
    out = []
    for _ in range(2):
        draw = RoundDraw(ids, sample_idx, weights, info={"tracking": torch.tensor([True, True])})
        params, server_state, cohort = federated_round(
            RoundSetup(algo, ENGINES["loop"](), quadratic_loss, store, x_all, y_all), params,
            server_state, draw)
        out.append(cohort.metrics.parts)
    assert out[0]["tracking_corr_norm"].tolist() == [0.0, 0.0]
    root = 9.25 ** 0.5
    torch.testing.assert_close(out[1]["tracking_corr_norm"], _t([root, root]))
    g = [np.hypot(-0.95, 0.05), np.hypot(0.15, -5.85)]
    torch.testing.assert_close(out[1]["tracking_corr_rel"], _t([root / g[0], root / g[1]]))
    diag = algo.server_metrics(server_state, store.state)
    assert diag["tracking_tracked_share"] == 1.0 and diag["tracking_tracked_mean"] == 2.0
    yi = store.state["tracking"]["y"]["w"]
    y = server_state["parts"]["tracking"]["y"]["w"]
    assert diag["tracking_dev_all"] == pytest.approx(float((yi - y).norm(dim=1).mean()))


def test_tracked_share_counts_clients_tracked_at_least_once():
    algo = build_algorithm("fadamgc", local_lr=0.1, tracking_fraction=0.5)
    _, server_state, store, _ = _round_loop(algo, ROWS2, [[0, 1], [0, 1]],
                                            [[True, False], [True, False]], num_clients=4)
    diag = algo.server_metrics(server_state, store.state)
    assert diag["tracking_tracked_share"] == 0.25  # client 0 of 4
    assert diag["tracking_tracked_mean"] == 0.5


# --------------------------------------------------------------------------- S̃ ablation
@pytest.mark.parametrize("engine", ENGINES)
def test_no_trackers_is_localadam_exactly(engine):
    """S̃ = 0: y and every y_i stay 0, so FAdamGC is LocalAdam bit for bit."""
    assert not sample_tracking(10, 0.0, torch.Generator().manual_seed(0)).any()
    masks = [[False, False]] * 3
    p_gc, _, s_gc = run(build_algorithm("fadamgc", local_lr=0.1, tracking_fraction=0.0),
                        ROWS, [0.0, 0.0], masks=masks, steps=3, engine=engine)
    p_la, _, s_la = run(build_algorithm("localadam", local_lr=0.1), ROWS, [0.0, 0.0],
                        masks=[None] * 3, steps=3, engine=engine)
    assert torch.equal(p_gc["w"], p_la["w"])
    assert torch.equal(s_gc.state["adam_v"]["v"]["w"], s_la.state["adam_v"]["v"]["w"])


@pytest.mark.slow
def test_no_trackers_equals_localadam_end_to_end(tmp_path):
    """Same seed, same config: FAdamGC with S̃ = 0 logs LocalAdam's losses and accuracies."""
    from fedforge.experiment.config import load_config
    from fedforge.experiment.runner import run_experiment

    base = ["rounds=3", "eval.every=1", "checkpoint.every=100", "algorithm.local_lr=0.01"]
    runs = {}
    for name, extra in (("fadamgc", ["algorithm.tracking_fraction=0.0"]), ("localadam", [])):
        cfg = load_config("examples/quickstart.toml", [*base, f"algorithm.name={name}", *extra])
        runs[name] = run_experiment(cfg, tmp_path / name, progress=False)
    keys = ("round", "train_loss", "test_accuracy", "test_loss")
    assert ([{k: r[k] for k in keys} for r in runs["fadamgc"]]
            == [{k: r[k] for k in keys} for r in runs["localadam"]])
