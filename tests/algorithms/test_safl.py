"""SAFL and the compressed baselines on 2-parameter quadratic clients (tests/quadratic.py).

The reference is an independent NumPy transcription of the paper's Alg. 1 + 2 (local SGD,
sketch the delta, average, desketch, AMSGrad without bias correction)."""

import json

import numpy as np
import pytest
import torch

from fedforge.algorithms import build_algorithm
from fedforge.client.optimizers import local_optimizer
from fedforge.core.store import ClientStore
from fedforge.engine import LoopEngine
from fedforge.engine.draw import RoundDraw
from fedforge.engine.round import RoundSetup, federated_round
from fedforge.protocol.algorithm import Algorithm
from fedforge.server.optimizers import server_adam
from tests.quadratic import ENGINES, make_clients, quadratic_loss, run_rounds

ROWS = [[1.0, 1.0, 0.0], [3.0, 0.0, 2.0], [2.0, -1.0, 1.0]]  # a, b1, b2 per client
W0, LR, SLR, B1, B2, EPS, K = [0.5, -0.5], 0.1, 0.05, 0.9, 0.99, 1e-8, 3


def local_delta(w, a, b, steps=K, lr=LR):
    x = w.copy()
    for _ in range(steps):
        x = x - lr * a * (x - b)
    return w - x


def reference(rounds, r_mats=None, amsgrad=True):
    """NumPy SAFL: r_mats[t] is R_t (None = identity, i.e. FedAMS/AMSGrad on the mean)."""
    w = np.array(W0)
    m, v, vh = np.zeros(2), np.zeros(2), np.zeros(2)
    for t in range(rounds):
        deltas = [local_delta(w, r[0], np.array(r[1:])) for r in ROWS]
        if r_mats is None:
            u = np.mean(deltas, 0)
        else:
            rm = r_mats[t]
            u = rm.T @ np.mean([rm @ d for d in deltas], 0)
        m = B1 * m + (1 - B1) * u
        v = B2 * v + (1 - B2) * u * u
        vh = np.maximum(vh, v) if amsgrad else v
        w = w - SLR * m / (np.sqrt(vh) + EPS)
    return w


def _safl(**kw):
    return build_algorithm("safl", local_lr=LR, server_lr=SLR, b1=B1, b2=B2, eps=EPS, **kw)


@pytest.mark.parametrize("engine", sorted(ENGINES))
def test_safl_identity_sketch_is_server_amsgrad_on_mean_delta(engine):
    """b = d, R = I: SAFL equals FedAMS in its AMSGrad form (same hparams, no codec) and the
    NumPy reference, over 4 rounds."""
    algo = _safl(sketch="identity")
    w, *_ = run_rounds(algo, ROWS, W0, rounds=4, steps=K, engine=ENGINES[engine]())
    np.testing.assert_allclose(w["w"].numpy(), reference(4), rtol=1e-10, atol=1e-12)
    plain = Algorithm("amsgrad", local_optimizer("sgd", LR),
                      server_adam(SLR, B1, B2, EPS, amsgrad=True))
    w2, *_ = run_rounds(plain, ROWS, W0, rounds=4, steps=K, engine=ENGINES[engine]())
    torch.testing.assert_close(w["w"], w2["w"], rtol=0, atol=1e-14)
    adam = _safl(sketch="identity", optimizer="adam")
    w3, *_ = run_rounds(adam, ROWS, W0, rounds=4, steps=K, engine=ENGINES[engine]())
    np.testing.assert_allclose(w3["w"].numpy(), reference(4, amsgrad=False), rtol=1e-10)


@pytest.mark.parametrize("kind", ["srht", "gaussian", "count"])
def test_safl_sketched_round_matches_reference(kind):
    """Two rounds with a real sketch: the server applies AMSGrad to R^T mean(R delta_i),
    with R the round's matrix (rounds all run as round 1 in run_rounds, so R_1 twice)."""
    algo = _safl(sketch=kind, sketch_size=4, sketch_rows=2 if kind == "count" else 1,
                 sketch_seed=5)
    w, *_ = run_rounds(algo, ROWS, W0, rounds=2, steps=K)
    op = algo.codec.op(2)
    r = op.sketch(torch.eye(2, dtype=torch.float64), 1).reshape(2, -1).T.numpy()
    np.testing.assert_allclose(w["w"].numpy(), reference(2, [r, r]), rtol=1e-9, atol=1e-12)


def test_cosine_schedule_and_sizes():
    algo = _safl(rounds=10, min_lr=1e-5, compression=10.0)
    sched = algo.server_optimizer.init({"w": torch.zeros(3)})
    assert "count" in sched  # a varying schedule keeps the round
    params = {"w": torch.zeros(1000)}
    assert algo.codec.op(1000).b == 100
    assert algo.message_nbytes(params, algo.server_init(params))[1] == 4 * 100 + 8
    b = _safl(sketch_size=7)
    assert b.message_nbytes(params, b.server_init(params))[1] == 4 * 7 + 8
    with pytest.raises(ValueError, match="algorithm.optimizer"):
        _safl(optimizer="sgdm")
    with pytest.raises(ValueError, match="sketch: unknown kind"):
        _safl(sketch="fft")


def test_topk_ef_keeps_residual_in_store():
    """k = 1 of d = 2: the client store's residual is exactly what was not sent."""
    algo = build_algorithm("topk_ef", local_lr=LR, k=1, server_lr=SLR)
    _, _, store, _ = run_rounds(algo, ROWS, W0, rounds=1, steps=K)
    res = store.gather(torch.arange(3))["codec"]["residual"]
    deltas = torch.tensor(np.array([local_delta(np.array(W0), r[0], np.array(r[1:]))
                                    for r in ROWS]))
    sent = deltas - res
    assert ((sent != 0).sum(1) == 1).all()  # one coordinate sent, the larger one
    assert torch.equal(sent.abs().argmax(1), deltas.abs().argmax(1))
    torch.testing.assert_close(sent.abs().max(1).values, deltas.abs().max(1).values)


def test_safl_two_rounds_by_hand():
    """SAFL with a 1×2 count sketch (seed 4) whose two coordinates share one bucket:
    R_1 = [[1, -1], [0, 0]] and R_2 = [[1, 1], [0, 0]] (asserted below), so the server sees
    u = R_tᵀ mean_i R_t Δ_i, not mean Δ_i. One local step (lr 0.1), AMSGrad without bias
    correction, β1 = 0.9, β2 = 0.99, ε = 0.1, κ = 0.05, x0 = (0.5, -0.5).

    Round 1: Δ_i = 0.1 a_i (x - b_i): (-0.05, -0.05), (0.15, -0.75), (0.3, -0.3);
      sketches Δ_i0 - Δ_i1 = 0, 0.9, 0.6, mean 0.5, so u = (0.5, -0.5) (mean Δ would be
      (0.1333, -0.3667)); m = 0.1 u = (0.05, -0.05), v = v̂ = 0.01·0.25 = 0.0025,
      x1 = x0 - 0.05·m/(0.05 + 0.1) = (29/60, -29/60).
    Round 2: mean Δ = (78, -218)/600, sketch Δ_0 + Δ_1 = -140/600 = -7/30, u = (-7/30, -7/30);
      m = 0.9 (0.05, -0.05) + 0.1 u = (13, -41)/600; v = 0.99·0.0025 + 0.01·49/900 > 0.0025,
      so v̂ = v; x2 = x1 - 0.05 m/(sqrt(v̂) + 0.1)."""
    algo = build_algorithm("safl", local_lr=LR, server_lr=0.05, b1=B1, b2=B2, eps=0.1,
                           sketch="count", sketch_size=2, sketch_rows=1, sketch_seed=4)
    op = algo.codec.op(2)
    eye = torch.eye(2, dtype=torch.float64)
    assert op.sketch(eye, 1).reshape(2, -1).T.tolist() == [[1.0, -1.0], [0.0, 0.0]]
    assert op.sketch(eye, 2).reshape(2, -1).T.tolist() == [[1.0, 1.0], [0.0, 0.0]]
    x1 = np.array([29 / 60, -29 / 60])
    v2 = 0.99 * 0.0025 + 0.01 * 49 / 900
    x2 = x1 - 0.05 * np.array([13 / 600, -41 / 600]) / (np.sqrt(v2) + 0.1)
    x_all, y_all = make_clients(ROWS)
    params = {"w": torch.tensor(W0, dtype=torch.float64)}
    state, store = algo.server_init(params), ClientStore(3, algo.client_init(params))
    ids = torch.arange(3)
    idx, ws = ids.view(-1, 1, 1).clone(), torch.ones(3, 1, 1, dtype=torch.float64)
    for t, want in [(1, x1), (2, x2)]:
        setup = RoundSetup(algo, LoopEngine(), quadratic_loss, store, x_all, y_all)
        params, state, _ = federated_round(setup, params, state, RoundDraw(ids, idx, ws, round=t))
        np.testing.assert_allclose(params["w"].numpy(), want, rtol=1e-6, err_msg=f"round {t}")


@pytest.mark.parametrize("name", ["fetchsgd", "marina", "onebit_adam", "topk_ef"])
def test_baselines_run_and_reduce_loss(name):
    """Smoke test: every baseline decreases the quadratic objective over 30 rounds of 3 local
    steps (their update rules are checked round by round in test_multiround_compressed.py)."""
    kw = {"k": 2} if name in ("marina", "topk_ef") else {}
    if name == "fetchsgd":
        kw = {"sketch_size": 400, "k": 2}
    algo = build_algorithm(name, local_lr=LR, **kw)
    w, *_ = run_rounds(algo, ROWS, W0, rounds=30, steps=K)

    def loss(x):
        return sum(r[0] / 2 * np.sum((x - np.array(r[1:])) ** 2) for r in ROWS)

    assert loss(w["w"].numpy()) < loss(np.array(W0))


def test_runner_records_exact_uplink_bytes(tmp_path):
    """metrics.jsonl: cumulative uplink bytes = rounds × clients × (4b + 8)."""
    from fedforge.experiment.config import load_config  # noqa: PLC0415
    from fedforge.experiment.runner import run_experiment  # noqa: PLC0415

    cfg_path = tmp_path / "c.toml"
    cfg_path.write_text(
        'rounds = 3\n[data]\ndataset = "synthetic"\npartition = "natural"\n'
        'options = { num_clients = 4 }\n[model]\nname = "logreg"\n'
        '[algorithm]\nname = "safl"\nsketch_size = 50\n'
        '[client]\nbatch_size = 5\nlocal_steps = 2\n[server]\nclients_per_round = 4\n'
        '[eval]\nevery = 1\nper_client = false\n')
    run_experiment(load_config(cfg_path), tmp_path / "out", progress=False)
    recs = [json.loads(x) for x in (tmp_path / "out/metrics.jsonl").read_text().splitlines()]
    assert [r["bytes_up"] for r in recs] == [4 * 208 * t for t in (1, 2, 3)]
    assert recs[-1]["bytes_up_round"] == 4 * 208
