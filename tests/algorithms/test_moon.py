"""MOON against an independent float64 NumPy reference over three rounds.

Model: body ``h = W0 x + b0`` (2 -> 2), head ``logits = W1 h + b1`` (2 -> 3 classes); the
representation z is h, the head's input. A local step on batch B (weights w, n = Σ w)
descends ``Σ_b w_b [CE_b + μ t ℓ_b] / n`` with ``ℓ = −log softmax([cos(z, zg), cos(z, zp)]
/ τ)[0] = log(1 + exp((cos(z, zp) − cos(z, zg)) / τ))``, zg the round's global model's h and
zp the client's previous local model's, t = 1 once the client has trained (round 1 has no
negative). SGD with momentum ρ and L2 decay λ (torch's
SGD); the server averages the models with weights n_i / Σ n_i over the cohort.

Round 1 trains clients 0 and 2, round 2 clients 1 and 2 (client 1 for the first time, with no
negative; client 2's second step is padding), round 3 all: client 0's previous model in
round 3 is its round-1 model, not round 2's global one. Two batches are partly padding (one
and two samples of three), so the means are over the real samples only.
"""

import numpy as np
import pytest
import torch
from torch import nn

from fedforge.algorithms import build_algorithm
from fedforge.core.store import ClientStore
from fedforge.core.tree import flatten_dict
from fedforge.engine import LoopEngine, VmapEngine
from fedforge.engine.draw import RoundDraw
from fedforge.engine.local import classification_loss
from fedforge.engine.round import RoundSetup, federated_round
from tests.algorithms.personal_rounds import batches

X = np.array([[1.0, 0.5], [0.2, -1.0], [-0.7, 0.3], [0.4, 0.9], [-1.2, 0.1], [0.6, -0.4],
              [0.3, 0.3], [-0.5, -0.8], [1.1, -0.2]])
Y = np.array([0, 0, 1, 1, 2, 2, 0, 1, 1])
INIT = {"0.weight": np.array([[0.5, -0.3], [0.2, 0.8]]), "0.bias": np.array([0.1, -0.2]),
        "1.weight": np.array([[0.4, -0.6], [-0.2, 0.3], [0.7, 0.1]]),
        "1.bias": np.array([0.0, 0.1, -0.1])}
LR, MU, TAU, RHO, WD = 0.5, 2.0, 0.5, 0.5, 0.01
SIZES = np.array([2.0, 3.0, 4.0])  # n_i: the server's weights
# per round: cohort and each client's [steps, batch] sample indices (-1: padding)
SCHEDULE = [
    ([0, 2], [[[0, 1, 2], [2, 0, 1]], [[6, 7, 8], [8, 6, 7]]]),
    ([1, 2], [[[3, 4, 5], [5, -1, -1]], [[7, 8, 6], [-1, -1, -1]]]),
    ([1, 2, 0], [[[4, 5, 3], [3, 5, 4]], [[6, 8, 7], [7, 6, -1]], [[2, 1, 0], [1, 0, 2]]]),
]


def _cos_grad(a, b):
    """cos(a_b, b_b) per row and its gradient in a."""
    na, nb = np.linalg.norm(a, axis=1), np.linalg.norm(b, axis=1)
    cos = (a * b).sum(1) / (na * nb)
    return cos, b / (na * nb)[:, None] - cos[:, None] * a / (na ** 2)[:, None]


def _grads(p, x, y, w, glob, prev, trained, tau, swap):
    h = x @ p["0.weight"].T + p["0.bias"]
    z = h @ p["1.weight"].T + p["1.bias"]
    s = np.exp(z - z.max(1, keepdims=True))
    s /= s.sum(1, keepdims=True)
    n = max(w.sum(), 1.0)
    dz = (s - np.eye(3)[y]) * (w / n)[:, None]
    hg = x @ glob["0.weight"].T + glob["0.bias"]
    hp = x @ prev["0.weight"].T + prev["0.bias"]
    if swap:  # the wrong sign: the previous model as the positive
        hg, hp = hp, hg
    pos, dpos = _cos_grad(h, hg)
    neg, dneg = _cos_grad(h, hp)
    sig = 1.0 / (1.0 + np.exp(-(neg - pos) / tau))  # ℓ = log(1 + exp((neg − pos)/τ))
    dl = (sig / tau)[:, None] * (dneg - dpos)
    dh = dz @ p["1.weight"] + MU * trained * dl * (w / n)[:, None]
    return {"0.weight": dh.T @ x, "0.bias": dh.sum(0), "1.weight": dz.T @ h,
            "1.bias": dz.sum(0)}


def reference(tau=TAU, swap=False, negative=True, prev_rule="last_trained"):
    """The global model after each round (float64 NumPy)."""
    glob = {k: v.copy() for k, v in INIT.items()}
    prev = [{k: v.copy() for k, v in INIT.items()} for _ in range(3)]
    trained = [0.0, 0.0, 0.0] if prev_rule != "from_init" else [1.0, 1.0, 1.0]
    out = []
    for ids, idx in SCHEDULE:
        models = []
        for c, steps in zip(ids, idx, strict=True):
            p = {k: v.copy() for k, v in glob.items()}
            m = {k: np.zeros_like(v) for k, v in p.items()}
            for step in steps:
                rows = np.array(step)
                w = (rows >= 0).astype(float)
                if w.sum() == 0:
                    continue  # a padded step changes nothing
                x, y = X[rows.clip(0)], Y[rows.clip(0)]
                g = _grads(p, x, y, w, glob, prev[c], trained[c] * negative, tau, swap)
                for k in p:
                    m[k] = RHO * m[k] + g[k] + WD * p[k]
                    p[k] = p[k] - LR * m[k]
            models.append(p)
        weights = SIZES[ids] / SIZES[ids].sum()
        new = {k: sum(wt * mdl[k] for wt, mdl in zip(weights, models, strict=True))
               for k in glob}
        for c, mdl in zip(ids, models, strict=True):
            prev[c], trained[c] = mdl, 1.0
        if prev_rule == "last_global":  # wrong: every client's previous is the old global
            prev = [{k: v.copy() for k, v in new.items()} for _ in range(3)]
        glob = new
        out.append({k: v.copy() for k, v in glob.items()})
    return out


def _fedforge(engine=LoopEngine, **hparams):
    model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 3)).double()
    alg = build_algorithm("moon", **{"local_lr": LR, "mu": MU, "temperature": TAU,
                                     "local_momentum": RHO, "weight_decay": WD, **hparams})
    alg.bind_model(model)
    x, y = torch.tensor(X), torch.tensor(Y)
    params = {k: torch.tensor(v) for k, v in INIT.items()}
    state, store = alg.server_init(params), ClientStore(3, alg.client_init(params))
    out = []
    for t, (ids, idx, weights) in enumerate(batches(SCHEDULE), start=1):
        sizes = torch.tensor(SIZES)[ids]
        params, state, _ = federated_round(
            RoundSetup(alg, engine(), classification_loss(model), store, x, y), params, state,
            RoundDraw(ids, idx, weights, sizes / sizes.sum(), round=t))
        out.append(({k: v.numpy().copy() for k, v in params.items()},
                    {k: v.numpy().copy() for k, v in
                     flatten_dict(store.gather(torch.arange(3))).items()}))
    return out


def _close(a, b):
    return all(np.allclose(a[k], b[k], rtol=1e-10, atol=1e-12) for k in b)


ENGINES = {"loop": LoopEngine, "vmap": lambda: VmapEngine(chunk_size=2)}


@pytest.mark.parametrize("engine", ENGINES)
def test_three_rounds_match_the_numpy_reference(engine):
    got = _fedforge(ENGINES[engine])
    want = reference()
    for t, ((params, _), ref) in enumerate(zip(got, want, strict=True), 1):
        assert _close(params, ref), f"round {t}"


def test_the_stored_previous_model_is_the_last_local_model():
    """Client 0 sits out round 2: its stored model stays its round-1 local model, which is
    not round 1's global model; client 1 is flagged as trained only once it has trained."""
    (glob1, after1), (_, after2) = _fedforge()[:2]
    prev = {k: after1[f"moon/prev/{k}"][0] for k in INIT}
    assert all(np.array_equal(after2[f"moon/prev/{k}"][0], prev[k]) for k in INIT)
    assert not _close(prev, glob1)
    assert np.array_equal(after1["moon/trained"], [1.0, 0.0, 1.0])
    assert np.array_equal(after2["moon/trained"], [1.0, 1.0, 1.0])
    assert all(v.dtype == np.float64 for v in after2.values())  # the model's dtype


def test_an_unbound_model_is_refused_in_one_line():
    alg = build_algorithm("moon")
    with pytest.raises(ValueError, match=r"^moon: call algorithm.bind_model\(model\) first "
                                         r"\(the runner does\)$"):
        _run_one(alg)


@pytest.mark.parametrize("wrong", [{"negative": False}, {"tau": 1.0}, {"swap": True},
                                   {"prev_rule": "last_global"}, {"prev_rule": "from_init"}],
                         ids=["no_previous_negative", "wrong_tau", "wrong_sign",
                              "previous_is_last_global", "negative_in_round_1"])
def test_wrong_variants_miss_fedforges_trajectory(wrong):
    got = _fedforge()[-1][0]
    assert _close(got, reference()[-1])
    assert not _close(got, reference(**wrong)[-1])


def test_mu_zero_is_fedavg_with_the_same_optimizer():
    fedavg_like = _fedforge(mu=0.0)[-1][0]
    assert _close(fedavg_like, reference(negative=False)[-1])


def test_refusals_name_the_field():
    with pytest.raises(ValueError, match="algorithm.mu"):
        build_algorithm("moon", mu=-1.0)
    with pytest.raises(ValueError, match="algorithm.temperature"):
        build_algorithm("moon", temperature=0.0)
    with pytest.raises(ValueError, match="algorithm.local_momentum"):
        build_algorithm("moon", local_momentum=1.0)
    alg = build_algorithm("moon", head=["0.*", "1.*"])
    alg.bind_model(nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 3)).double())
    with pytest.raises(ValueError, match="moon: the model's head must be one linear layer"):
        _run_one(alg)


def _run_one(alg):
    model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 3)).double()
    params = {k: torch.tensor(v) for k, v in INIT.items()}
    ids, idx, weights = batches(SCHEDULE)[0]
    setup = RoundSetup(alg, LoopEngine(), classification_loss(model),
                       ClientStore(3, alg.client_init(params)), torch.tensor(X), torch.tensor(Y))
    federated_round(setup, params, alg.server_init(params), RoundDraw(ids, idx, weights))
