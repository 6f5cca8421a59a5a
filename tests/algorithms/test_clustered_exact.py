"""Exact checks of the clustered-FL pieces (src/fedforge/algorithms/clustered.py and
clustered_spec.py) on hand-made inputs: the cluster models' initialisation, CFL's split
criterion at its boundaries, the bipartition against scipy, two splits in one round, the
cluster-size metrics and the selection of a cluster's model."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedforge.algorithms import build_algorithm
from fedforge.algorithms.clustered import (
    Bipartition,
    ClusterModels,
    bipartition,
    cosine_similarities,
    fresh_models,
)
from fedforge.algorithms.clustered_spec import CLUSTERS, START, ClusterSpec, one_hot, pick
from fedforge.protocol.algorithm import CLIENT_ID, PREP_SAMPLES, PREP_SECONDS, PrepareInputs


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(3, 2)
        self.b = torch.nn.Linear(2, 2)


def test_fresh_models_are_seeded_reinitialisations_in_the_params_dtype():
    net = Net()
    before = {k: v.detach().clone() for k, v in net.named_parameters()}
    params = {k: v.detach().double() for k, v in net.named_parameters()}
    got = fresh_models(net, params, 2, seed=7)
    for j, model in enumerate(got):
        want = Net()
        torch.manual_seed(int(np.random.SeedSequence([7, j]).generate_state(1)[0]))
        for m in want.modules():
            if hasattr(m, "reset_parameters"):
                m.reset_parameters()
        for k, v in model.items():
            assert v.dtype == torch.float64
            assert torch.equal(v, dict(want.named_parameters())[k].detach().double()), (j, k)
    for k, v in net.named_parameters():  # the bound model itself is left as it was
        assert torch.equal(v, before[k])
    with pytest.raises(ValueError, match=r"^algorithm: the model has no parameter 'zz' to "
                                         r"initialise a cluster model from$"):
        fresh_models(net, {**params, "zz": torch.zeros(1)}, 1, seed=0)


def test_ifca_server_state_holds_k_models_and_refuses_without_a_model():
    algo = build_algorithm("ifca", num_clusters=3)
    assert algo.name == "ifca" and algo.description.startswith("IFCA (Ghosh et al. 2020): ")
    net = Net()
    params = {k: v.detach().clone() for k, v in net.named_parameters()}
    algo.bind_model(net)
    models = algo.server_init(params)["parts"][CLUSTERS]["models"]
    assert {k: tuple(v.shape) for k, v in models.items()} == {
        k: (3, *v.shape) for k, v in params.items()}
    with pytest.raises(ValueError, match=r"^clustered FL: call algorithm\.bind_model\(model\) "
                                         r"first \(the runner does\); the cluster models start "
                                         r"at its initialisations$"):
        build_algorithm("ifca", num_clusters=2).server_init(params)
    one = build_algorithm("ifca", num_clusters=1)  # one cluster: FedAvg's start, no model
    assert torch.equal(one.server_init(params)["parts"][CLUSTERS]["models"]["a.weight"][0],
                       params["a.weight"])
    cfl = build_algorithm("cfl", max_clusters=2)
    assert cfl.name == "cfl" and cfl.description.startswith("CFL (Sattler et al. 2020): ")


def test_cluster_sizes_count_only_held_clusters():
    part = ClusterModels(4)
    got = part.server_metrics({}, {"cluster": torch.tensor([0.0, 2.0, 2.0, -1.0])})
    assert {k: float(v) for k, v in got.items()} == {
        "cluster_size_0": 1.0, "cluster_size_1": 0.0, "cluster_size_2": 2.0,
        "cluster_size_3": 0.0, "clusters": 2.0}


def test_one_hot_and_pick():
    assert torch.equal(one_hot(torch.tensor([1.0, -1.0]), 3, torch.float64),
                       torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 0.0]], dtype=torch.float64))
    models = {"w": torch.tensor([[1.0, 2.0], [3.0, 4.0]])}
    fallback = {"w": torch.tensor([9.0, 9.0])}
    assert torch.equal(pick(models, 1)["w"], torch.tensor([3.0, 4.0]))
    assert torch.equal(pick(models, torch.tensor([0.0, 1.0]), fallback)["w"],
                       torch.tensor([3.0, 4.0]))
    assert torch.equal(pick(models, torch.tensor([0.0, 0.0]), fallback)["w"], fallback["w"])
    assert torch.equal(pick(models, torch.tensor([1.0, 0.0]))["w"], torch.tensor([1.0, 2.0]))


def test_spec_evaluates_with_the_stored_cluster_and_needs_bound_models():
    spec = ClusterSpec(num_models=2)
    glob = {"w": torch.tensor([9.0, 9.0])}
    state = {CLUSTERS: {"cluster": torch.tensor(1.0)}}
    with pytest.raises(ValueError, match=r"^clustered FL: the cluster models are not bound; "
                                         r"evaluate with algorithm\.evaluated_at\(server_state\)$"):
        spec.client_params(glob, state)
    bound = spec.evaluated_at({CLUSTERS: {"models": {"w": torch.tensor([[1.0, 2.0],
                                                                          [3.0, 4.0]])}}})
    assert torch.equal(bound.client_params(glob, state)["w"], torch.tensor([3.0, 4.0]))
    none = {CLUSTERS: {"cluster": torch.tensor(-1.0)}}
    assert torch.equal(bound.client_params(glob, none)["w"], glob["w"])
    cols = bound.client_columns({CLUSTERS: {"cluster": torch.tensor([[1.0], [0.0]])}}, 2)
    assert cols["cluster"].dtype == torch.int64 and cols["cluster"].tolist() == [1, 0]
    assert bound.client_columns({}, 3)["cluster"].tolist() == [-1, -1, -1]
    assert not bound.covered_by_dp_sgd()


def test_cosine_similarities_by_hand():
    u = torch.tensor([[3.0, 4.0], [6.0, 8.0], [-4.0, 3.0]])
    np.testing.assert_allclose(cosine_similarities(u),
                               [[1, 1, 0], [1, 1, 0], [0, 0, 1]], atol=1e-11)
    assert cosine_similarities(torch.zeros(2, 2)).tolist() == [[0.0, 0.0], [0.0, 0.0]]


@pytest.mark.parametrize("seed", range(6))
def test_bipartition_is_complete_linkage(seed):
    from scipy.cluster.hierarchy import fcluster, linkage
    from scipy.spatial.distance import squareform

    rng = np.random.default_rng(seed)
    u = torch.tensor(rng.normal(size=(7, 3)))
    dist = -cosine_similarities(u)
    labels = fcluster(linkage(squareform(dist + 1.0, checks=False), "complete"), 2, "maxclust")
    np.testing.assert_array_equal(bipartition(dist), labels != labels[0])


def _prep(update: dict, cluster: list[float], round_: int, ids=None) -> PrepareInputs:
    c = len(cluster)
    ref = next(iter(update.values()))
    return PrepareInputs(
        global_params={k: v[0] for k, v in update.items()}, broadcast={"round": round_},
        client_states={CLUSTERS: {"cluster": torch.tensor(cluster, dtype=ref.dtype),
                                  "update": update}},
        info={CLIENT_ID: torch.arange(c) if ids is None else torch.tensor(ids)},
        loss_fn=None, x_all=None, y_all=None, sample_idx=torch.zeros(c, 3, 1, dtype=torch.long),
        weights=torch.ones(c, 3, 1, dtype=ref.dtype))


def test_cfl_splits_two_clusters_in_one_round_over_every_leaf():
    """Clusters 0 and 1 each hold two opposite groups (along the second leaf only): both split
    in the same round, into the next free slots 2 and 3; the half holding the lowest client
    id keeps the cluster's index, whatever the cohort's order."""
    part = Bipartition(max_clusters=5, eps1=0.5, eps2=0.5, warmup_rounds=0)
    w = torch.zeros(8, 1, dtype=torch.float64)
    v = torch.tensor([[1.0], [1.1], [-1.0], [-1.2], [-1.0], [1.0], [1.05], [-1.1]],
                     dtype=torch.float64)
    update = {"w": w, "v": v}
    cluster = [0, 0, 0, 0, 1, 1, 1, 1]
    new, start = part.assign(_prep(update, cluster, 2), torch.tensor(cluster, dtype=torch.float64))
    assert new.tolist() == [0, 0, 2, 2, 1, 3, 3, 1]
    assert start.tolist() == cluster
    perm = [3, 0, 6, 1, 4, 7, 2, 5]  # the same clients in another cohort order
    shuffled = {k: t[perm] for k, t in update.items()}
    again, _ = part.assign(_prep(shuffled, [cluster[i] for i in perm], 2, perm),
                           torch.tensor([cluster[i] for i in perm], dtype=torch.float64))
    assert again.tolist() == [new.tolist()[i] for i in perm]
    capped = Bipartition(max_clusters=3, eps1=0.5, eps2=0.5, warmup_rounds=0)
    one, _ = capped.assign(_prep(update, cluster, 2), torch.tensor(cluster, dtype=torch.float64))
    assert one.tolist() == [0, 0, 2, 2, 1, 1, 1, 1]  # a single free slot: one split
    early = Bipartition(max_clusters=5, eps1=0.5, eps2=0.5, warmup_rounds=1)
    none, _ = early.assign(_prep(update, cluster, 2), torch.tensor(cluster, dtype=torch.float64))
    assert none.tolist() == cluster  # round 1's updates are within the warm-up


def test_cfl_first_round_puts_every_client_in_cluster_zero():
    part = Bipartition(max_clusters=2, eps1=0.5, eps2=0.5, warmup_rounds=0)
    update = {"w": torch.zeros(3, 2, dtype=torch.float64)}
    new, start = part.assign(_prep(update, [-1, -1, -1], 1), torch.full((3,), -1.0,
                                                                       dtype=torch.float64))
    assert new.tolist() == [0, 0, 0] and start.tolist() == [0, 0, 0]


def _splits(rows, eps1, eps2):
    part = Bipartition(max_clusters=4, eps1=eps1, eps2=eps2, warmup_rounds=0)
    return part.splits(torch.tensor(rows, dtype=torch.float64))


def test_split_criterion_at_its_boundaries():
    three = [[3.0, 4.0], [-3.0, -4.0], [0.0, 0.0]]  # mean 0, largest norm 5, total norm √50
    assert _splits(three, 1e-9, 4.9)
    assert not _splits(three, 0.0, 4.9)  # ||mean|| < ε1 is strict
    assert not _splits(three, 1.0, 5.0)  # max ||ΔW|| > ε2 is strict
    assert not _splits(three, 1.0, 6.0)  # the largest client norm, not the norm of all
    assert not _splits([[3.0, 4.0], [-3.0, -4.0]], 1.0, 1.0)  # two clients never split
    same = [[1.0, -1.0], [1.0, -1.0], [1.0, -1.0]]  # mean vector norm √2, mean of entries 0
    assert not _splits(same, 1.0, 1.0)
    assert _splits(same, 1.5, 1.0)


def test_prepare_reports_per_client_work_and_a_model_dtype_start():
    part = Bipartition(max_clusters=2, eps1=0.5, eps2=0.5, warmup_rounds=0)
    update = {"w": torch.zeros(2, 2, dtype=torch.float64)}
    prep = _prep(update, [0, 0], 3)._replace(sample_idx=torch.zeros(2, 5, 1, dtype=torch.long))
    state, info, metrics = part.prepare_cohort(prep)
    assert info[START].dtype == torch.float64 and info[START].tolist() == [[1, 0], [1, 0]]
    for key in (PREP_SECONDS, PREP_SAMPLES):
        assert metrics[key].dtype == torch.float64 and metrics[key].shape == (2,)
    assert metrics[PREP_SAMPLES].tolist() == [0.0, 0.0]
    assert bool((metrics[PREP_SECONDS] >= 0).all())
    assert state["cluster"].dtype == torch.float64


def test_a_round_starts_from_the_named_cluster_or_the_global_model():
    from fedforge.client.transforms import RoundContext

    spec = ClusterSpec(num_models=2)
    glob = {"w": torch.tensor([9.0, 9.0])}
    broadcast = {CLUSTERS: {"models": {"w": torch.tensor([[1.0, 2.0], [3.0, 4.0]])}}}
    for start, want in (([0.0, 1.0], [3.0, 4.0]), ([0.0, 0.0], [9.0, 9.0])):
        ctx = RoundContext(glob, broadcast, {}, {START: torch.tensor(start)})
        got, same = spec.begin(None, ctx)
        assert got["w"].tolist() == want and same is ctx
