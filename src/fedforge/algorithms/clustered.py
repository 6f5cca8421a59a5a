"""Clustered FL: several server models, each client's cluster kept as its client state.

The server holds M cluster models θ_1..θ_M (server state, all broadcast). Before training,
each sampled client's cluster is decided (:meth:`ClusterModels.assign`, eagerly, outside the
vmapped round); the client trains from its cluster's model, uploads its trained model in its
cluster's slot, and the server sets each cluster's model to the mean of its members' trained
models (uniform weights, as both official codes; a cluster no client of the aggregate holds
keeps its model). The cluster index is the client's stored state (``-1``: not yet
assigned), so it resumes and scales with the disk store. A client is evaluated with its
cluster's model (the personalised protocol); the global model, the mean of every trained
model of the round, serves clients not yet assigned.

IFCA (Ghosh, Chung, Yin & Ramchandran, "An Efficient Framework for Clustered Federated
Learning", NeurIPS 2020, Alg. 1, model averaging; jichan3751/ifca
``mnist/train_cluster_mnist.py``): each sampled client takes the cluster of lowest loss on
the samples it trains on this round, ``argmin_j F_i(θ_j)``.

CFL (Sattler, Müller & Samek, "Clustered Federated Learning", IEEE TNNLS 2020, Alg. 1;
felisat/clustered-federated-learning): every client every round; a cluster c whose
clients' updates ΔW_i = x_i − θ_c satisfy ``‖mean ΔW_i‖ < ε1`` and ``max ‖ΔW_i‖ > ε2``
(more than two clients, after ``warmup_rounds``) is split in two by complete-linkage
clustering of the updates' pairwise cosine similarities, recursively over the rounds. The
updates are kept as client state; the split is made from them at the start of the next
round, so a new cluster's clients start from their parent's model once.
"""

from __future__ import annotations

import copy
import time

import numpy as np
import torch

from fedforge.algorithms.clustered_spec import CLUSTERS, START, ClusterSpec, one_hot, pick
from fedforge.algorithms.defaults import defaults_from
from fedforge.algorithms.fairness import start_losses
from fedforge.client.optimizers import local_optimizer
from fedforge.core.schedules import ScheduleLike
from fedforge.core.tree import Params, tree_nbytes
from fedforge.protocol.algorithm import (
    CLIENT_ID,
    PREP_SAMPLES,
    PREP_SECONDS,
    Algorithm,
    FinalizeInputs,
    Part,
    PrepareInputs,
)
from fedforge.server.optimizers import server_sgd


def fresh_models(model: torch.nn.Module, params: Params, count: int, seed: int
                 ) -> list[Params]:
    """``count`` independent initialisations of ``model`` (its layers' ``reset_parameters``
    under a generator seeded by ``(seed, j)``), in ``params``' dtypes and devices: IFCA's
    cluster models start apart, as the official code's separately built models."""
    out = []
    for j in range(count):
        clone = copy.deepcopy(model)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(int(np.random.SeedSequence([seed, j]).generate_state(1)[0]))
            for m in clone.modules():
                if hasattr(m, "reset_parameters"):
                    m.reset_parameters()
        named = dict(clone.named_parameters())
        missing = sorted(set(params) - set(named))
        if missing:
            raise ValueError(f"algorithm: the model has no parameter {missing[0]!r} to "
                             f"initialise a cluster model from")
        out.append({k: named[k].detach().to(v.dtype).to(v.device).clone()
                    for k, v in params.items()})
    return out


class ClusterModels(Part):
    """The M cluster models (server state, broadcast), each client's cluster (client state)
    and the per-cluster mean of the trained models; :meth:`assign` says who goes where."""

    name = CLUSTERS
    prepares = True

    def __init__(self, num_models: int, seed: int = 0) -> None:
        self.num_models, self.seed, self.model = num_models, seed, None

    def bind_model(self, model: torch.nn.Module) -> None:
        self.model = model

    def initial(self, params: Params) -> list[Params]:
        """Cluster 0 starts at the run's initial model, the others at fresh initialisations."""
        if self.num_models == 1:
            return [params]
        if self.model is None:
            raise ValueError("clustered FL: call algorithm.bind_model(model) first (the "
                             "runner does); the cluster models start at its initialisations")
        return [params, *fresh_models(self.model, params, self.num_models - 1, self.seed)]

    def client_init(self, params: Params) -> dict:
        ref = next(iter(params.values()))
        return {"cluster": ref.new_full((), -1.0)}

    def server_init(self, params: Params) -> dict:
        starts = self.initial(params)
        return {"models": {k: torch.stack([s[k] for s in starts]) for k in params}}

    def broadcast(self, server_state: dict) -> dict:
        return {"models": server_state["models"]}

    def assign(self, prep: PrepareInputs, cluster: torch.Tensor
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """-> (each client's cluster, the cluster whose model its round starts from), ``[C]``."""
        raise NotImplementedError

    def prepare_cohort(self, prep: PrepareInputs) -> tuple[dict, dict, dict]:
        begin = time.perf_counter()
        state = dict(prep.client_states[self.name])
        cluster, start = self.assign(prep, state["cluster"])
        state["cluster"] = cluster.to(state["cluster"].dtype)
        count = prep.sample_idx.shape[0]
        seconds = (time.perf_counter() - begin) / max(count, 1)
        metrics = {PREP_SECONDS: torch.full((count,), seconds, dtype=torch.float64),
                   PREP_SAMPLES: torch.zeros(count, dtype=torch.float64)}  # forward passes
        dtype = next(iter(prep.global_params.values())).dtype
        return state, {START: one_hot(start, self.num_models, dtype)}, metrics

    def finalize(self, fin: FinalizeInputs) -> tuple[dict, dict]:
        state = fin.ctx.client_state[self.name]
        mine = one_hot(state["cluster"], self.num_models, state["cluster"].dtype)
        slots = {k: mine.view(-1, *[1] * v.dim()).to(v.dtype) * v for k, v in fin.params.items()}
        return self.keep(fin, state), {"models": slots, "count": mine}

    def keep(self, fin: FinalizeInputs, state: dict) -> dict:
        """This client's stored state after its round (the cluster, as assigned)."""
        return state

    def server_update(self, server_state: dict, mean_uploads: dict, agg) -> dict:
        """θ_j <- the mean of cluster j's trained models; a cluster without members keeps θ_j."""
        count = mean_uploads["count"]
        held = count > 0
        models = {}
        for k, old in server_state["models"].items():
            shape = (-1, *[1] * (old.dim() - 1))
            mean = mean_uploads["models"][k] / count.clamp_min(1e-30).view(shape).to(old.dtype)
            models[k] = torch.where(held.view(shape), mean, old)
        return {"models": models}

    def upload_nbytes(self, params: Params, server_state: dict) -> int:
        return tree_nbytes(params) + 4  # the trained model and its cluster's index

    def server_metrics(self, server_state: dict, client_states: dict) -> dict:
        """Clients per cluster (``cluster_size_j``; unassigned ones in none) and the number of
        clusters that hold any (``clusters``)."""
        cluster = client_states["cluster"].reshape(-1)
        sizes = {f"cluster_size_{j}": (cluster == j).sum() for j in range(self.num_models)}
        return {**sizes, "clusters": sum((s > 0).to(torch.int64) for s in sizes.values())}


# ----------------------------------------------------------------------------------- IFCA
class LowestLoss(ClusterModels):
    """IFCA's rule: the cluster whose model has the lowest loss on the client's round samples
    (ties to the lower index, as ``np.argmin``); a client without data keeps its cluster."""

    def assign(self, prep: PrepareInputs, cluster: torch.Tensor
               ) -> tuple[torch.Tensor, torch.Tensor]:
        models = prep.broadcast[self.name]["models"]
        losses = torch.stack([start_losses(prep._replace(global_params=pick(models, j)))
                              for j in range(self.num_models)], 1)  # [C, M]
        has_data = prep.weights.flatten(1).sum(1) > 0
        best = torch.where(has_data, losses.argmin(1).to(cluster.dtype), cluster)
        return best, best


@defaults_from("ifca")
def ifca(local_lr: ScheduleLike, num_clusters: int, seed: int, client_optimizer: str,
         weight_decay: ScheduleLike, max_grad_norm: ScheduleLike | None, nar: bool
         ) -> Algorithm:
    """IFCA: each sampled client trains the lowest-loss of ``num_clusters`` models."""
    if num_clusters < 1:
        raise ValueError(f"algorithm.num_clusters: expected >= 1, got {num_clusters}")
    opt = local_optimizer(client_optimizer, local_lr, weight_decay=weight_decay,
                          max_grad_norm=max_grad_norm, nar=nar)
    return _clustered("ifca", opt, LowestLoss(int(num_clusters), int(seed)),
                      "IFCA (Ghosh et al. 2020): k_i = argmin_j F_i(θ_j), θ_j <- mean of "
                      "cluster j's trained models (model averaging)")


def _clustered(name: str, opt, part: ClusterModels, description: str,
               requires: frozenset[str] = frozenset()) -> Algorithm:
    spec = ClusterSpec(num_models=part.num_models)
    return Algorithm(name, opt, server_sgd(1.0), parts=(part,), description=description,
                     personal=spec, sends_model=False, requires=requires)


# ------------------------------------------------------------------------------------ CFL
def bipartition(distance: np.ndarray) -> np.ndarray:
    """Complete-linkage agglomerative clustering of ``distance`` ``[n, n]`` down to two
    groups (sklearn's ``AgglomerativeClustering(linkage="complete")``, as the CFL code);
    -> True for the members of the group that does not hold member 0."""
    groups = [[i] for i in range(len(distance))]
    link = distance.astype(np.float64).copy()
    np.fill_diagonal(link, np.inf)
    while len(groups) > 2:
        a, b = np.unravel_index(np.argmin(link), link.shape)
        a, b = min(a, b), max(a, b)
        groups[a] += groups.pop(b)
        merged = np.maximum(link[a], link[b])  # complete linkage: the farthest pair
        link[a], link[:, a] = merged, merged
        link[a, a] = np.inf
        link = np.delete(np.delete(link, b, 0), b, 1)
    other = np.zeros(len(distance), dtype=bool)
    other[groups[1]] = True  # groups merge into the lower index: groups[0] holds member 0
    return other


def cosine_similarities(updates: torch.Tensor) -> np.ndarray:
    """Pairwise cosine similarities of the rows ``[n, d]`` (the CFL code's 1e-12 guard)."""
    u = updates.to(torch.float64)
    norms = u.norm(dim=1)
    return ((u @ u.T) / (norms[:, None] * norms[None, :] + 1e-12)).numpy()


class Bipartition(ClusterModels):
    """CFL's rule: from the updates each client stored last round, split every cluster that
    has reached a stationary point of its joint objective (small mean update) while some
    client is far from its own (large update)."""

    needs_client_ids = True

    def __init__(self, max_clusters: int, eps1: float, eps2: float, warmup_rounds: int
                 ) -> None:
        super().__init__(max_clusters)
        self.eps1, self.eps2, self.warmup = eps1, eps2, warmup_rounds

    def initial(self, params: Params) -> list[Params]:
        """Every cluster starts at the run's model (one cluster of all clients at first)."""
        return [params] * self.num_models

    def client_init(self, params: Params) -> dict:
        return {**super().client_init(params),
                "update": {k: torch.zeros_like(v) for k, v in params.items()}}

    def download_nbytes(self, params: Params, server_state: dict) -> int:
        return tree_nbytes(params)  # a client needs only its cluster's model

    def keep(self, fin: FinalizeInputs, state: dict) -> dict:
        start = pick(fin.ctx.broadcast[self.name]["models"], fin.ctx.info[START])
        return {**state, "update": {k: v - start[k] for k, v in fin.params.items()}}

    def assign(self, prep: PrepareInputs, cluster: torch.Tensor
               ) -> tuple[torch.Tensor, torch.Tensor]:
        cluster = cluster.clamp_min(0)  # the first round: one cluster of every client
        new = cluster.clone()
        done = int(prep.broadcast["round"]) - 1  # the round whose updates are stored
        if done <= self.warmup:
            return new, cluster
        update = prep.client_states[self.name]["update"]
        flat = torch.cat([v.flatten(1) for v in update.values()], 1)  # [C, d]
        order = torch.argsort(prep.info[CLIENT_ID])  # splits independent of cohort order
        free = int(cluster.max()) + 1
        for c in torch.unique(cluster).tolist():
            if free >= self.num_models:
                break
            members = order[cluster[order] == c]
            if self.splits(flat[members]):
                other = bipartition(-cosine_similarities(flat[members]))
                new[members[torch.from_numpy(other)]] = free
                free += 1
        return new, cluster

    def splits(self, updates: torch.Tensor) -> bool:
        """The code's criterion: ``‖mean ΔW‖ < ε1``, ``max ‖ΔW‖ > ε2``, more than two clients."""
        if len(updates) <= 2:
            return False
        u = updates.to(torch.float64)
        return bool(u.mean(0).norm() < self.eps1) and bool(u.norm(dim=1).max() > self.eps2)


@defaults_from("cfl")
def cfl(local_lr: ScheduleLike, eps1: float, eps2: float, warmup_rounds: int,
        max_clusters: int, client_optimizer: str, weight_decay: ScheduleLike,
        max_grad_norm: ScheduleLike | None, nar: bool) -> Algorithm:
    """CFL: FedAvg within clusters, each split in two by cosine similarity of its clients'
    updates once its mean update is small and its largest is large."""
    for key, value in (("eps1", eps1), ("eps2", eps2)):
        if value < 0:
            raise ValueError(f"algorithm.{key}: expected >= 0, got {value}")
    if max_clusters < 1:
        raise ValueError(f"algorithm.max_clusters: expected >= 1, got {max_clusters}")
    opt = local_optimizer(client_optimizer, local_lr, weight_decay=weight_decay,
                          max_grad_norm=max_grad_norm, nar=nar)
    part = Bipartition(int(max_clusters), float(eps1), float(eps2), int(warmup_rounds))
    return _clustered("cfl", opt, part, "CFL (Sattler et al. 2020): FedAvg per cluster, split "
                      "in two by cos(ΔW_i, ΔW_j) when ||mean ΔW|| < ε1, max ||ΔW|| > ε2",
                      frozenset({"full_participation"}))
