"""FedProto against an independent float64 NumPy reference over three rounds.

Model: body ``h = W0 x + b0`` (2 -> 2), head ``z = W1 h + b1`` (2 -> 3 classes); each client
keeps its whole model (all start from the same values). A local step on batch B (weights w,
n = Σ w) descends ``Σ_b w_b CE(z_b, y_b) / n + λ Σ_b w_b m_b ‖h_b − C_{y_b}‖² / (2n)`` (the
mean over the representation's d = 2 coordinates; m_b = 1 where the server has C_{y_b}), and
adds ``w_b h_b`` (before the step) to class y_b's sum. After the round, the server's C_j is
Σ sums_j / Σ counts_j over the cohort (``"samples"``) or the mean of the holding clients' own
means (``"clients"``); a class no cohort client holds keeps its prototype. The clients hold
classes [0, 0, 1], [1, 2, 2], [0, 1, 1], so the two weightings differ from round 2 on.
Round 1 has no prototype (plain CE); round 2 samples clients 0 and 2 (client 2's second step
is padding), which hold no class 2: its round-1 prototype is the one client 1 is pulled to in
round 3.
"""

import numpy as np
import pytest
import torch
from torch import nn

from fedforge.algorithms import build_algorithm
from fedforge.engine.local import classification_loss
from tests.algorithms.personal_rounds import ENGINES, SCHEDULE, batches, run

X = np.array([[1.0, 0.5], [0.2, -1.0], [-0.7, 0.3], [0.4, 0.9], [-1.2, 0.1], [0.6, -0.4],
              [0.3, 0.3], [-0.5, -0.8], [1.1, -0.2]])
Y = np.array([0, 0, 1, 1, 2, 2, 0, 1, 1])
INIT = {"0.weight": np.array([[0.5, -0.3], [0.2, 0.8]]), "0.bias": np.array([0.1, -0.2]),
        "1.weight": np.array([[0.4, -0.6], [-0.2, 0.3], [0.7, 0.1]]),
        "1.bias": np.array([0.0, 0.1, -0.1])}
LR, LAM = 0.5, 2.0


def _grads(p, x, y, w, protos, present, lam, d_scale):
    """Analytic gradient of the FedProto loss on one batch; the pre-step features h."""
    h = x @ p["0.weight"].T + p["0.bias"]  # [B, 2]
    z = h @ p["1.weight"].T + p["1.bias"]  # [B, 3]
    s = np.exp(z - z.max(1, keepdims=True))
    s /= s.sum(1, keepdims=True)
    n = max(w.sum(), 1.0)
    dz = (s - np.eye(3)[y]) * (w / n)[:, None]
    m = present[y] * w / n
    dh = dz @ p["1.weight"] + lam * 2.0 * (h - protos[y]) * m[:, None] / d_scale
    return {"0.weight": dh.T @ x, "0.bias": dh.sum(0), "1.weight": dz.T @ h,
            "1.bias": dz.sum(0)}, h


def reference(weights="samples", d_scale=2.0, post_step_features=False):
    """``[(every client's model, prototypes, present)]`` after each round (float64 NumPy)."""
    models = [{k: v.copy() for k, v in INIT.items()} for _ in range(3)]
    protos, present = np.zeros((3, 2)), np.zeros(3)
    out = []
    for ids, idx in SCHEDULE:
        ups = []
        for c, steps in zip(ids, idx, strict=True):
            p, sums, counts = models[c], np.zeros((3, 2)), np.zeros(3)
            for step in steps:
                rows = np.array(step)
                w = (rows >= 0).astype(float)
                if w.sum() == 0:
                    continue  # a padded step changes nothing
                x, y = X[rows.clip(0)], Y[rows.clip(0)]
                g, h = _grads(p, x, y, w, protos, present, LAM, d_scale)
                for k in p:
                    p[k] = p[k] - LR * g[k]
                if post_step_features:
                    h = x @ p["0.weight"].T + p["0.bias"]
                hits = np.eye(3)[y] * w[:, None]
                sums, counts = sums + hits.T @ h, counts + hits.sum(0)
            if weights == "clients":
                held = (counts > 0).astype(float)
                sums, counts = sums / np.maximum(counts, 1.0)[:, None] * held[:, None], held
            ups.append((sums, counts))
        tot_s, tot_c = sum(u[0] for u in ups), sum(u[1] for u in ups)
        seen = tot_c > 0
        protos = np.where(seen[:, None], tot_s / np.where(seen, tot_c, 1.0)[:, None], protos)
        present = np.maximum(present, seen)
        out.append(([{k: v.copy() for k, v in m.items()} for m in models], protos.copy(),
                    present.copy()))
    return out


def _fedforge(weights, engine):
    model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 3)).double()
    alg = build_algorithm("fedproto", local_lr=LR, lam=LAM, weights=weights,
                          client_optimizer="sgd")
    alg.bind_model(model)
    x, y = torch.tensor(X), torch.tensor(Y)
    return run(alg, classification_loss(model), INIT, x, y, batches(), ENGINES[engine])


def _close(a, b):
    return all(np.allclose(a[k], b[k], rtol=1e-10, atol=1e-12) for k in b)


@pytest.mark.parametrize("engine", ["loop", "vmap"])
@pytest.mark.parametrize("weights", ["samples", "clients"])
def test_three_rounds_match_the_numpy_reference(weights, engine):
    got = _fedforge(weights, engine)
    want = reference(weights)
    for t, ((params, state), (models, _, _)) in enumerate(zip(got, want, strict=True), 1):
        for c in range(3):
            mine = {k: state[f"personal/{k}"][c] for k in INIT}
            assert _close(mine, models[c]), f"round {t}, client {c}"
        assert _close(params, INIT)  # the global model never moves: nothing is averaged


@pytest.mark.parametrize("wrong", [{"weights": "clients"}, {"d_scale": 1.0},
                                   {"post_step_features": True}],
                         ids=["client_weighting", "sum_over_d", "post_step_features"])
def test_wrong_variants_miss_fedforges_trajectory(wrong):
    """The count-weighted run differs from each wrong rule's reference by round 3."""
    got = _fedforge("samples", "loop")
    bad = reference(**wrong)
    state = got[-1][1]
    mine = [{k: state[f"personal/{k}"][c] for k in INIT} for c in range(3)]
    assert not all(_close(mine[c], bad[-1][0][c]) for c in range(3))
    assert all(_close(mine[c], reference()[-1][0][c]) for c in range(3))


def test_prototypes_are_what_travels():
    """Bytes per client: the prototypes [3, 2] and their flags [3] down, sums and counts up."""
    model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 3)).double()
    alg = build_algorithm("fedproto")
    alg.bind_model(model)
    params = {k: torch.tensor(v) for k, v in INIT.items()}
    assert alg.message_nbytes(params, alg.server_init(params)) == (9 * 8, 9 * 8)


def test_refusals_name_the_field():
    with pytest.raises(ValueError, match="algorithm.lam"):
        build_algorithm("fedproto", lam=-1.0)
    with pytest.raises(ValueError, match="algorithm.weights"):
        build_algorithm("fedproto", weights="uniform")
    alg = build_algorithm("fedproto", head=["0.*", "1.*"])
    params = {k: torch.tensor(v) for k, v in INIT.items()}
    with pytest.raises(ValueError, match="fedproto: the model's head must be one linear layer"):
        alg.server_init(params)


def _nearest_reference(p, protos, present, x):
    """The paper's inference in NumPy: argmin_j ||h(x) − C_j||² over the present classes."""
    h = x @ p["0.weight"].T + p["0.bias"]
    dist = ((h[:, None, :] - protos[None]) ** 2).sum(-1)
    return np.where(present[None] > 0, dist, np.inf).argmin(1)


def test_nearest_prototype_accuracy_is_the_papers_inference_rule():
    """After three rounds, each client's accuracy by the nearest present global prototype of
    its own model's features, on samples its head gets wrong at times: not the head's
    accuracy, and class 2, its prototype dropped, is never predicted."""
    model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 3)).double()
    alg = build_algorithm("fedproto", local_lr=LR, lam=LAM, client_optimizer="sgd")
    alg.bind_model(model)
    params, state = _fedforge("samples", "loop")[-1]
    _, protos, present = reference()[-1]
    present = present.copy()
    present[2] = 0.0  # a class the server has no prototype of is never predicted
    parts = {"fedproto": {"protos": torch.tensor(protos), "present": torch.tensor(present)}}
    spec = alg.personal.evaluated_at(parts)
    models = {k: torch.tensor(np.stack([state[f"personal/{k}"][c] for c in range(3)]))
              for k in INIT}
    indices = [torch.arange(9), torch.tensor([2, 4, 5]), torch.tensor([], dtype=torch.long)]
    got = spec.accuracies(model, models, torch.tensor(X), torch.tensor(Y), indices)
    acc = got["prototype_accuracy"].numpy()
    for c, idx in enumerate(indices[:2]):
        mine = {k: v[c].numpy() for k, v in models.items()}
        pred = _nearest_reference(mine, protos, present, X[idx.numpy()])
        assert acc[c] == pytest.approx((pred == Y[idx.numpy()]).mean())
        assert 2 not in pred
    assert acc[2] == 0.0  # no test samples
    assert acc[1] == pytest.approx(1 / 3)  # of classes 1, 2, 2 only the class-1 one is right
    with_all = alg.personal.evaluated_at(
        {"fedproto": {"protos": torch.tensor(protos), "present": torch.ones(3)}})
    everyone = with_all.accuracies(model, models, torch.tensor(X), torch.tensor(Y), indices)
    assert not np.array_equal(everyone["prototype_accuracy"].numpy(), acc)
    none_yet = alg.personal.evaluated_at(
        {"fedproto": {"protos": torch.zeros(3, 2), "present": torch.zeros(3)}})
    assert none_yet.accuracies(model, models, torch.tensor(X), torch.tensor(Y), indices) == {}


def test_a_quickstart_run_reports_both_accuracies(tmp_path):
    """The head's accuracy and the nearest prototype's, summarised and per client (named
    for the quickstart: the mutation runs' scratch copy holds no examples/)."""
    from pathlib import Path

    from fedforge.experiment.config import load_config
    from fedforge.experiment.runner import run_experiment

    root = Path(__file__).resolve().parents[2]
    cfg = load_config(root / "examples/quickstart.toml", [
        "algorithm.name=fedproto", "model.name=mlp", "model.options.hidden=[8]", "rounds=2",
        "eval.every=2", "client.local_epochs=null", "client.local_steps=2"])
    records = run_experiment(cfg, tmp_path / "run", progress=False)
    last = records[-1]
    for stat in ("mean", "weighted", "p10", "worst"):
        assert 0.0 <= last[f"prototype_accuracy_{stat}"] <= 1.0
    assert last["prototype_accuracy_mean"] != last["personal_accuracy_mean"]
    columns = np.load(tmp_path / "run" / "client_metrics.npz")
    assert columns["prototype_accuracy"].shape == columns["personal_accuracy"].shape
