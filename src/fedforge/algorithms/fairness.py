"""Fair federated objectives: q-FFL (q-FedAvg) and AFL (agnostic federated learning).

Both weight clients by their loss at the round's global model, F_k(x^t), which each sampled
client evaluates on the samples it trains on this round (:class:`StartLoss`, before local
training; under ``client.local_epochs`` that is its whole training set, as fair_flearn's
``get_loss``).

q-FFL (Li, Sanjabi, Beirami & Smith, "Fair Resource Allocation in Federated Learning", ICLR
2020, Alg. 2; litian96/fair_flearn ``flearn/trainers/qffedavg.py``): with L = 1/η_l and
Δw_k = L (x^t - x_k),

    Δ_k = F_k^q Δw_k,   h_k = q F_k^(q-1) ||Δw_k||² + L F_k^q,   x <- x - Σ_k Δ_k / Σ_k h_k

over the cohort (F_k + 1e-10, as the code). q = 0 is FedAvg with uniform weights.

AFL (Mohri, Sivek & Suresh, "Agnostic Federated Learning", ICML 2019, Alg. 1 Stochastic-AFL;
litian96/fair_flearn ``flearn/trainers/afl.py``), each client its own domain:
min_x max_λ Σ_k λ_k F_k(x) over the simplex Δ_N. With S of N clients sampled,

    x <- x - η_g (N/S) Σ_S λ_k Δ_k,   λ <- Proj_Δ(λ + γ_λ (N/S) Σ_S F_k e_k),

both from (x^t, λ^t); the model is evaluated at the mean of the iterates x^1..x^t, as the code's
``resulting_model`` (the paper's w^A). With every client sampled (the code's setting) both
steps are exact; λ = 1/N is FedAvg with uniform weights.
"""

from __future__ import annotations

import time

import torch

from fedforge.algorithms.defaults import defaults_from
from fedforge.client.optimizers import local_optimizer
from fedforge.client.transforms import at_round
from fedforge.core.schedules import ScheduleLike, as_schedule
from fedforge.core.tree import Params, tree_sq_norm
from fedforge.protocol.algorithm import (
    CLIENT_ID,
    PREP_SAMPLES,
    PREP_SECONDS,
    Algorithm,
    FinalizeInputs,
    Part,
    PrepareInputs,
)
from fedforge.server.chain import ServerTransform

START_LOSS = "start_loss"
"""Round-input key of F_k(x^t) per sampled client ``[C]`` (set by :class:`StartLoss`)."""


def start_losses(prep: PrepareInputs) -> torch.Tensor:
    """F_k(x^t) for each client of the cohort: the weighted mean loss over its round's
    samples, one step's batch at a time, without gradients and with dropout off."""
    model = getattr(prep.loss_fn, "model", None)
    was_training = model is not None and model.training
    if model is not None:
        model.train(False)  # a loss evaluation, as fair_flearn's get_loss: no dropout
    try:
        with torch.no_grad():
            out = [_client_loss(prep, c) for c in range(prep.sample_idx.shape[0])]
    finally:
        if model is not None:
            model.train(was_training)
    ref = next(iter(prep.global_params.values()))
    return torch.stack(out).to(ref.dtype) if out else ref.new_zeros(0)


def _client_loss(prep: PrepareInputs, c: int) -> torch.Tensor:
    total = count = 0.0
    for k in range(prep.sample_idx.shape[1]):
        idx, w = prep.sample_idx[c, k], prep.weights[c, k]
        mass = w.sum()
        if float(mass) == 0:  # padding: nothing trained on this step
            continue
        loss = prep.loss_fn(prep.global_params, prep.x_all[idx], prep.y_all[idx], w)
        total = total + loss * mass.clamp_min(1.0)  # the loss is a masked mean
        count = count + mass
    if isinstance(total, float):  # a client without data this round
        return prep.weights.new_zeros(())  # on the weights' device: the cohort is stacked
    return total / torch.as_tensor(count).clamp_min(1.0)


class StartLoss(Part):
    """Evaluates each sampled client's loss at x^t before it trains (``info[START_LOSS]``)."""

    name = "start_loss"
    prepares = True
    sends_uploads = False

    def prepare_cohort(self, prep: PrepareInputs) -> tuple[dict, dict, dict]:
        begin = time.perf_counter()
        losses = start_losses(prep)
        count = prep.sample_idx.shape[0]
        seconds = (time.perf_counter() - begin) / max(count, 1)
        metrics = {PREP_SECONDS: torch.full((count,), seconds, dtype=torch.float64),
                   PREP_SAMPLES: torch.zeros(count, dtype=torch.float64)}  # forward passes only
        return prep.client_states.get(self.name, {}), {START_LOSS: losses}, metrics


# --------------------------------------------------------------------------------- q-FFL
class QFairUpdate(Part):
    """Uploads Δ_k = F_k^q Δw_k and h_k (fair_flearn's ``Deltas`` and ``hs``)."""

    name = "qffl"

    def __init__(self, q: float, local_lr: ScheduleLike) -> None:
        self.q, self.local_lr = q, as_schedule(local_lr, "local_lr")

    def finalize(self, fin: FinalizeInputs) -> tuple[dict, dict]:
        loss = fin.ctx.info[START_LOSS] + 1e-10
        lipschitz = 1.0 / at_round(self.local_lr, fin.ctx)  # L = 1/η_l
        dw = {k: v * lipschitz for k, v in fin.delta.items()}
        fq = loss.pow(self.q)
        h = self.q * loss.pow(self.q - 1) * tree_sq_norm(dw) + lipschitz * fq
        return {}, {"delta": {k: fq.to(v.dtype) * v for k, v in dw.items()}, "h": h}


def qffl_step() -> ServerTransform:
    """x <- x - Σ Δ_k / Σ h_k (the uploads' cohort means: the 1/S cancels)."""

    def update(params, agg, state):
        up = agg.uploads["qffl"]
        return ({k: p - up["delta"][k] / up["h"].to(p.dtype) for k, p in params.items()},
                agg, state)

    return ServerTransform("opt", lambda params: {}, update, reads_delta=False)


@defaults_from("qffl")
def qffl(local_lr: ScheduleLike, q: float) -> Algorithm:
    """q-FedAvg (q-FFL's federated solver): local SGD, the server step of Alg. 2."""
    if q < 0:
        raise ValueError(f"algorithm.q: expected q >= 0, got {q}")
    return Algorithm(
        "qffl", local_optimizer("sgd", local_lr), qffl_step(),
        parts=(StartLoss(), QFairUpdate(q, local_lr)),
        description="q-FFL (Li et al. 2020): q-FedAvg, steps weighted by loss^q; alias qfedavg",
        primary_metric="global_accuracy_p10",  # its claim: the worst clients' accuracy rises
    )


# ------------------------------------------------------------------------------------ AFL
def project_simplex(v: torch.Tensor) -> torch.Tensor:
    """The Euclidean projection of ``v`` onto the probability simplex (Wang &
    Carreira-Perpiñán 2013, as fair_flearn's ``project``)."""
    u = torch.sort(v, descending=True).values
    css = torch.cumsum(u, 0)
    j = torch.arange(1, v.numel() + 1, dtype=v.dtype, device=v.device)
    rho = int(torch.nonzero(u - (css - 1) / j > 0).max())
    theta = (css[rho] - 1) / (rho + 1)
    return (v - theta).clamp_min(0.0)


class MixtureWeights(Part):
    """λ over the N clients (server state, broadcast). A client uploads N λ_k Δ_k and its loss
    on the one-hot of its id, so the cohort means are the unbiased (N/S) Σ_S estimates."""

    name = "afl"
    needs_client_ids = True

    def __init__(self, lambda_lr: float) -> None:
        self.lambda_lr = lambda_lr
        self.num_clients: int | None = None

    def bind_population(self, num_clients: int) -> None:
        self.num_clients = num_clients

    def server_init(self, params: Params) -> dict:
        if self.num_clients is None:
            raise ValueError("algorithm 'afl': the number of clients is unknown; call "
                             "Algorithm.bind_population(N) before server_init (runs do)")
        ref = next(iter(params.values()))
        n = self.num_clients
        return {"lam": torch.full((n,), 1.0 / n, dtype=ref.dtype, device=ref.device)}

    def broadcast(self, server_state: dict) -> dict:
        return {"lam": server_state["lam"]}

    def finalize(self, fin: FinalizeInputs) -> tuple[dict, dict]:
        lam = fin.ctx.broadcast[self.name]["lam"]
        n = lam.shape[0]
        mine = (torch.arange(n, device=lam.device) == fin.ctx.info[CLIENT_ID]).to(lam.dtype)
        weight = n * (lam * mine).sum()  # N λ_k
        loss = fin.ctx.info[START_LOSS].to(lam.dtype)
        return {}, {"delta": {k: weight.to(v.dtype) * v for k, v in fin.delta.items()},
                    "loss": mine * loss}

    def server_update(self, server_state: dict, mean_uploads: dict, agg) -> dict:
        grad = mean_uploads["loss"] * agg.num_clients  # (N/S) Σ_S F_k e_k
        return {"lam": project_simplex(server_state["lam"] + self.lambda_lr * grad)}

    def server_metrics(self, server_state: dict, client_states: dict) -> dict:
        lam = server_state["lam"]
        return {"afl_lambda_max": lam.max(), "afl_lambda_entropy":
                -(lam * lam.clamp_min(1e-30).log()).sum()}


def afl_step(server_lr: float, average: bool) -> ServerTransform:
    """x <- x - η_g mean(N λ_k Δ_k); keeps the mean of the iterates for evaluation."""

    def init(params):
        if not average:
            return {}
        ref = next(iter(params.values()))
        return {"avg": {k: v.detach().clone() for k, v in params.items()},
                "count": torch.zeros((), dtype=ref.dtype, device=ref.device)}

    def update(params, agg, state):
        up = agg.uploads["afl"]["delta"]
        new = {k: p - server_lr * up[k] for k, p in params.items()}
        if average:
            count = state["count"] + 1
            state = {"avg": {k: a + (new[k] - a) / count.to(a.dtype)
                             for k, a in state["avg"].items()}, "count": count}
        return new, agg, state

    def eval_params(params, state):
        return state["avg"] if average else params

    return ServerTransform("opt", init, update, eval_params, reads_delta=False)


@defaults_from("afl")
def afl(local_lr: ScheduleLike, lambda_lr: float, server_lr: float,
        average_iterates: bool) -> Algorithm:
    """AFL: minimax over the clients' mixture weights λ, projected gradient ascent on λ."""
    return Algorithm(
        "afl", local_optimizer("sgd", local_lr), afl_step(server_lr, average_iterates),
        parts=(StartLoss(), MixtureWeights(lambda_lr)),
        description="AFL (Mohri et al. 2019): minimax over client mixture weights λ",
        primary_metric="global_accuracy_worst",  # its claim: the worst domain's accuracy
    )
