"""IFCA and CFL against independent float64 references on two well-separated client groups.

Quadratic clients (tests/quadratic.py: loss ``a/2 ||w - b||²``): clients 0-2 have their
optimum near (2, 2), clients 3-4 near (-2, -2). The references are NumPy loops written from
the papers and the official codes (module docstring of src/fedforge/algorithms/clustered.py);
each test also shows that a wrong rule (the highest-loss cluster, one average across
clusters, no split, a split that groups the least similar updates) fails the comparison.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedforge.algorithms import build_algorithm
from fedforge.core.store import ClientStore
from fedforge.engine import LoopEngine, VmapEngine
from fedforge.engine.draw import RoundDraw
from fedforge.engine.round import RoundSetup, federated_round
from tests.quadratic import quadratic_loss

A = np.array([1.0, 2.0, 1.5, 1.0, 0.5])
B = np.array([[2.0, 2.0], [2.5, 1.5], [1.5, 2.5], [-2.0, -2.0], [-2.5, -1.5]])
N = len(A)
W0 = np.array([0.3, -0.2])
LR = 0.2
K = 3
THETA0 = [np.array([0.5, 0.5]), np.array([-0.5, -0.5])]  # IFCA's initial cluster models
# (cohort, local steps): client 3 has no data in round 3 (it keeps its cluster)
SCHEDULE = [([0, 3, 4], [3, 3, 2]), ([1, 2, 3], [3, 1, 3]), ([0, 3, 4, 1], [2, 0, 3, 3]),
            ([4, 2], [3, 3])]
FULL = [(list(range(N)), [3, 3, 2, 3, 3]), (list(range(N)), [3, 3, 3, 2, 3]),
        (list(range(N)), [3, 2, 3, 3, 3]), (list(range(N)), [3, 3, 3, 3, 1])]


def loss(i, x):
    return 0.5 * A[i] * np.sum((x - B[i]) ** 2)


def train(i, x, k):
    for _ in range(k):
        x = x - LR * A[i] * (x - B[i])
    return x


def run(algo, schedule, engine=None, theta0=None):
    """fedforge's trajectory: after each round the global model, the cluster models, every
    client's stored cluster and its personal model as evaluated."""
    if theta0 is not None:
        algo.parts[0].initial = lambda params: [{"w": torch.tensor(t)} for t in theta0]
    engine = engine or LoopEngine()
    x_all = torch.tensor(np.c_[A, B], dtype=torch.float64)
    y_all = torch.zeros(N, dtype=torch.long)
    params = {"w": torch.tensor(W0, dtype=torch.float64)}
    algo.bind_population(N)
    server_state = algo.server_init(params)
    store = ClientStore(N, algo.client_init(params))
    out = []
    for t, (ids, steps) in enumerate(schedule, start=1):
        ids_t = torch.tensor(ids)
        sample_idx = ids_t.view(-1, 1, 1).expand(-1, K, 1).clone()
        weights = torch.zeros(sample_idx.shape, dtype=torch.float64)
        for c, k in enumerate(steps):
            weights[c, :k] = 1.0
        params, server_state, _ = federated_round(
            RoundSetup(algo, engine, quadratic_loss, store, x_all, y_all), params, server_state,
            RoundDraw(ids_t, sample_idx, weights, round=t))
        states = store.gather(torch.arange(N))
        spec = algo.evaluated_at(server_state).personal
        personal = torch.func.vmap(spec.client_params, in_dims=(None, 0))(params, states)
        out.append({"w": params["w"].numpy().copy(),
                    "theta": server_state["parts"]["clusters"]["models"]["w"].numpy().copy(),
                    "cluster": states["clusters"]["cluster"].numpy().copy(),
                    "personal": personal["w"].numpy().copy(),
                    "metrics": algo.server_metrics(server_state, store.state)})
    return out


def compare(got, want, rtol=1e-9):
    assert len(got) == len(want)
    for t, (g, w) in enumerate(zip(got, want), start=1):
        for key in ("w", "theta", "cluster", "personal"):
            np.testing.assert_allclose(g[key], w[key], rtol=rtol, atol=1e-12,
                                       err_msg=f"round {t}: {key}")


def personal_models(w, theta, cluster):
    return np.stack([theta[int(c)] if c >= 0 else w for c in cluster])


# ----------------------------------------------------------------------------------- IFCA
def ifca_ref(choose=np.argmin, per_cluster=True):
    """Ghosh et al. 2020, Alg. 1 (model averaging), as jichan3751/ifca: each client of the
    round takes ``argmin_j F_i(θ_j)`` (a client without data keeps its cluster), trains from
    θ_j, and θ_j <- the uniform mean of its members' models; the global model is the mean of
    every trained model. ``choose=np.argmax`` or ``per_cluster=False`` are wrong rules."""
    theta = np.stack(THETA0).astype(float)
    cluster = np.full(N, -1.0)
    w, out = W0.copy(), []
    for ids, steps in SCHEDULE:
        trained = []
        for i, k in zip(ids, steps):
            if k > 0:
                cluster[i] = choose([loss(i, th) for th in theta])
            start = theta[int(cluster[i])] if cluster[i] >= 0 else w
            trained.append(train(i, start, k))
        w = np.mean(trained, 0)
        new = theta.copy()
        for j in range(len(theta)):
            members = [x for x, i in zip(trained, ids) if cluster[i] == j]
            if members:
                new[j] = np.mean(members if per_cluster else trained, 0)
        theta = new
        out.append({"w": w, "theta": theta.copy(), "cluster": cluster.copy(),
                    "personal": personal_models(w, theta, cluster)})
    return out


def test_ifca_four_rounds():
    got = run(build_algorithm("ifca", local_lr=LR, num_clusters=2), SCHEDULE, theta0=THETA0)
    want = ifca_ref()
    compare(got, want)
    np.testing.assert_array_equal(got[-1]["cluster"], [0, 0, 0, 1, 1])  # the two groups
    assert got[-1]["metrics"]["cluster_size_0"] == 3.0
    assert got[-1]["metrics"]["cluster_size_1"] == 2.0
    assert got[-1]["metrics"]["clusters"] == 2.0
    assert got[0]["metrics"]["cluster_size_0"] == 1.0  # client 0 only; 1 and 2 not yet seen
    for wrong in (ifca_ref(choose=np.argmax), ifca_ref(per_cluster=False)):
        with pytest.raises(AssertionError):
            compare(got, wrong)


def test_ifca_vmap_equals_loop():
    loop = run(build_algorithm("ifca", local_lr=LR, num_clusters=2), SCHEDULE, theta0=THETA0)
    vmap = run(build_algorithm("ifca", local_lr=LR, num_clusters=2), SCHEDULE,
               VmapEngine(chunk_size=2), theta0=THETA0)
    compare(vmap, loop, rtol=1e-12)


def test_ifca_starts_clusters_apart_from_the_model():
    """Cluster 0 is the run's initial model, the others fresh initialisations of it (seeded)."""
    net = torch.nn.Linear(3, 2)
    params = {k: v.detach().clone() for k, v in net.named_parameters()}
    models = []
    for seed in (0, 0, 1):
        algo = build_algorithm("ifca", num_clusters=3, seed=seed)
        algo.bind_model(net)
        models.append(algo.server_init(params)["parts"]["clusters"]["models"])
    for k, v in params.items():
        assert torch.equal(models[0][k][0], v)
        assert not torch.equal(models[0][k][1], v) and not torch.equal(models[0][k][1],
                                                                      models[0][k][2])
        assert torch.equal(models[0][k], models[1][k])  # same seed, same models
        assert not torch.equal(models[0][k][1:], models[2][k][1:])
    with pytest.raises(ValueError, match="bind_model"):
        build_algorithm("ifca", num_clusters=2).server_init(params)
    with pytest.raises(ValueError, match="algorithm.num_clusters"):
        build_algorithm("ifca", num_clusters=0)


# ------------------------------------------------------------------------------------ CFL
def bipartition_ref(sims):
    """scipy's complete linkage on 1 - S (complete linkage is unchanged by the shift from
    the code's -S), cut at two clusters; -> True for the group without member 0."""
    from scipy.cluster.hierarchy import fcluster, linkage
    from scipy.spatial.distance import squareform

    dist = squareform(np.clip(1.0 - sims, 0.0, None), checks=False)
    labels = fcluster(linkage(dist, "complete"), 2, "maxclust")
    return labels != labels[0]


def cfl_ref(eps1, eps2, warmup, slots, similar=True):
    """Sattler et al. 2020, Alg. 1, as felisat/clustered-federated-learning, with the split
    made at the start of the next round from the stored updates: a cluster with more than
    two clients, ‖mean ΔW‖ < ε1 and max ‖ΔW‖ > ε2 is bipartitioned (complete linkage on
    the cosine similarities); its new half starts once from the parent's model.
    ``similar=False`` groups by the least similar updates (a wrong rule)."""
    theta = np.stack([W0] * slots)
    cluster, update = np.zeros(N), np.zeros((N, 2))
    w, out = W0.copy(), []
    for t, (ids, steps) in enumerate(FULL, start=1):
        start = cluster.copy()
        if t - 1 > warmup:
            free = int(cluster.max()) + 1
            for c in sorted(set(cluster.tolist())):
                members = np.flatnonzero(start == c)
                u = update[members]
                norms = np.linalg.norm(u, axis=1)
                if (free < slots and len(members) > 2 and np.linalg.norm(u.mean(0)) < eps1
                        and norms.max() > eps2):
                    sims = (u @ u.T) / (norms[:, None] * norms[None, :] + 1e-12)
                    cluster[members[bipartition_ref(sims if similar else -sims)]] = free
                    free += 1
        trained = []
        for i, k in zip(ids, steps):
            x = train(i, theta[int(start[i])], k)
            update[i] = x - theta[int(start[i])]
            trained.append(x)
        w = np.mean(trained, 0)
        for j in range(slots):
            members = [x for x, i in zip(trained, ids) if cluster[i] == j]
            if members:
                theta[j] = np.mean(members, 0)
        out.append({"w": w, "theta": theta.copy(), "cluster": cluster.copy(),
                    "personal": personal_models(w, theta, cluster)})
    return out


CFL = {"local_lr": LR, "eps1": 1.5, "eps2": 0.5, "warmup_rounds": 1, "max_clusters": 3}


def test_cfl_four_rounds():
    got = run(build_algorithm("cfl", **CFL), FULL)
    want = cfl_ref(1.5, 0.5, 1, 3)
    compare(got, want)
    np.testing.assert_array_equal(got[1]["cluster"], [0, 0, 0, 0, 0])  # warm-up: FedAvg
    np.testing.assert_array_equal(got[2]["cluster"], [0, 0, 0, 1, 1])  # the split
    assert got[-1]["metrics"]["clusters"] == len(set(got[-1]["cluster"].tolist()))
    no_split = cfl_ref(1.5, 0.5, 10, 3)
    for wrong in (no_split, cfl_ref(1.5, 0.5, 1, 3, similar=False)):
        with pytest.raises(AssertionError):
            compare(got, wrong)


def test_cfl_criterion_and_cap():
    """ε1 below the mean update's norm, or a single model slot: no split (FedAvg)."""
    fedavg = cfl_ref(1.5, 0.5, 10, 3)
    compare(run(build_algorithm("cfl", **{**CFL, "eps1": 1e-3}), FULL), fedavg)
    compare(run(build_algorithm("cfl", **{**CFL, "max_clusters": 1}), FULL),
            cfl_ref(1.5, 0.5, 10, 1))
    compare(run(build_algorithm("cfl", **{**CFL, "eps2": 100.0}), FULL), fedavg)


def test_cfl_vmap_equals_loop():
    loop = run(build_algorithm("cfl", **CFL), FULL)
    vmap = run(build_algorithm("cfl", **CFL), FULL, VmapEngine(chunk_size=2))
    compare(vmap, loop, rtol=1e-12)


def test_cfl_needs_every_client():
    algo = build_algorithm("cfl")
    assert "full_participation" in algo.needs({"w": torch.zeros(2)})
    with pytest.raises(ValueError, match="algorithm.eps1"):
        build_algorithm("cfl", eps1=-1.0)


def test_ifca_defaults_in_effect_equal_the_table():
    from fedforge.algorithms.defaults import ALGORITHM_DEFAULTS

    table = {k: d.value for k, d in ALGORITHM_DEFAULTS["ifca"].items()}
    table["num_clusters"] = 2  # THETA0's two models
    implicit = run(build_algorithm("ifca", num_clusters=2), SCHEDULE, theta0=THETA0)
    explicit = run(build_algorithm("ifca", **table), SCHEDULE, theta0=THETA0)
    compare(implicit, explicit, rtol=0)
    assert build_algorithm("ifca").parts[0].num_models == 4  # the code's p = 4


# ------------------------------------------------------------------- runs, resume, report
def load_metrics(run):
    import json

    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def _clustered_cfg(name: str, *extra: str):
    from pathlib import Path

    from fedforge.experiment.config import load_config

    root = Path(__file__).resolve().parents[2]
    cl = "8" if name == "cfl" else "4"
    return load_config(root / "examples/clustered_synthetic.toml", [
        "rounds=4", "eval.every=1", "checkpoint.every=1", "data.options.num_clients=8",
        f"server.clients_per_round={cl}", "client.batch_size=5", "client.local_epochs=null",
        "client.local_steps=2", f"algorithm.name={name}", "algorithm.num_clusters=2"
        if name == "ifca" else "algorithm.warmup_rounds=1", *extra])


@pytest.mark.slow
@pytest.mark.parametrize("name", ["ifca", "cfl"])
def test_resumed_run_keeps_every_clients_cluster(tmp_path, name):
    """Stopped after round 2 and resumed: the per-client file's ``cluster`` column and the
    metrics equal an uninterrupted run's; the report shows the clients per cluster."""
    from fedforge.experiment.client_metrics import load_client_metrics
    from fedforge.experiment.runner import run_experiment
    from fedforge.study.labels import without_wall_clock
    from fedforge.study.report import render

    whole, parts = tmp_path / "whole", tmp_path / "parts"
    run_experiment(_clustered_cfg(name), whole, progress=False)
    run_experiment(_clustered_cfg(name, "rounds=2"), parts, progress=False)
    run_experiment(_clustered_cfg(name), parts, resume=True, progress=False)
    a, b = load_client_metrics(whole), load_client_metrics(parts)
    assert set(a) == set(b) and "cluster" in a
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)
    assert [without_wall_clock(r) for r in load_metrics(whole)] == \
        [without_wall_clock(r) for r in load_metrics(parts)]
    last = [r for r in load_metrics(whole) if "cluster_size_0" in r][-1]
    rows = a["round"] == a["round"].max()
    for j in range(2):
        assert last[f"cluster_size_{j}"] == float((a["cluster"][rows] == j).sum())
    assert "clients per cluster at each evaluated round" in render(whole)


def test_cluster_table_lists_the_clusters_ever_used():
    from fedforge.study.cluster_table import cluster_sizes, cluster_table

    records = [{"round": 1, "train_loss": 1.0},
               {"round": 2, "cluster_size_0": 5.0, "cluster_size_1": 0.0, "cluster_size_2": 0.0},
               {"round": 3, "train_loss": 1.0},
               {"round": 4, "cluster_size_0": 3.0, "cluster_size_1": 0.0, "cluster_size_2": 2.0}]
    assert cluster_sizes(records) == ([0, 2], [(2, [5, 0]), (4, [3, 2])])
    assert "<th>cluster 2</th>" in cluster_table("cfl", records)
    assert "cluster 1" not in cluster_table("cfl", records)
    assert cluster_table("fedavg", [{"round": 1, "test_accuracy": 0.5}]) == ""


def test_client_metrics_file_keeps_the_cluster_column(tmp_path):
    from fedforge.experiment.client_metrics import COLUMNS, ClientMetricsFile, read_columns

    path = tmp_path / "client_metrics.npz"
    row = {k: np.zeros(2) for k in COLUMNS[1:]}
    log = ClientMetricsFile(path)
    log.append(1, {**row, "cluster": np.array([0, 1])})
    log.append(2, {**row, "cluster": np.array([1, 1])})
    resumed = ClientMetricsFile(path, keep_rounds={1})  # a resume cut back to round 1
    np.testing.assert_array_equal(read_columns(path)["cluster"], [0, 1])
    resumed.append(2, {**row, "cluster": np.array([1, -1])})
    np.testing.assert_array_equal(read_columns(path)["cluster"], [0, 1, 1, -1])
    plain = ClientMetricsFile(tmp_path / "plain.npz")
    plain.append(1, row)
    assert "cluster" not in read_columns(tmp_path / "plain.npz")


def test_bytes_per_client():
    """IFCA: the K models down; CFL: only the client's cluster's model; up one model + index."""
    params = {"w": torch.zeros(2, dtype=torch.float64)}
    ifca = build_algorithm("ifca", num_clusters=3)
    ifca.parts[0].initial = lambda p: [p] * 3
    assert ifca.message_nbytes(params, ifca.server_init(params)) == (3 * 16, 16 + 4)
    cfl = build_algorithm("cfl", max_clusters=5)
    assert cfl.message_nbytes(params, cfl.server_init(params)) == (16, 16 + 4)
