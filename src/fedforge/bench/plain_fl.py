"""W3's plain PyTorch baseline, and what it shares with the Flower one (``flower_w3``).

FedAvg written the way most FL code is: one ``nn.Module``, ``torch.optim.SGD`` (no momentum,
no weight decay) per client over its mini-batches, then the clients' weights averaged with
weights ``n_i / sum n`` (``n_i``: the client's training samples), as fedforge's ``fedavg``
does. Everything else comes from the run config and from fedforge itself, so the three W3
engines run the same experiment:

* data and partition: fedforge's ``load_dataset`` and ``build_federated_dataset`` with the
  config's seed (every client holds the same samples as in ``fedforge run``);
* model: fedforge's registry, built after ``torch.manual_seed(seed)`` (the same initial
  weights; ``model.init_from`` is honoured);
* cohorts and mini-batch order: the draws of ``fedforge.experiment.build.sample_round``
  (a generator seeded by ``(seed, round)``, then ``client_batches``), so round ``t`` trains
  the same clients on the same batches in the same order;
* evaluation: test accuracy on the config's test set every ``eval.every`` rounds and at the
  last round.

Timing (:class:`TargetWatch`): the clock starts after the data are loaded and the model is
built, as ``wall_s`` in a run's ``metrics.jsonl``; "wall s to target" runs to the end of the
first evaluation at or above the target, where the engine stops. ``total_s`` is the whole
call, data loading included.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from fedforge.algorithms import canonical_name, resolved_hparams
from fedforge.data import FederatedDataset, build_federated_dataset, client_batches, load_dataset
from fedforge.experiment.build import resolve_device, round_generator
from fedforge.experiment.config import RunConfig, algorithm_kwargs
from fedforge.models import build_model
from fedforge.models.init_from import init_network

# the fedforge hyper-parameters under which its fedavg is this plain loop
PLAIN_FEDAVG = {"server_lr": 1.0, "client_optimizer": "sgd", "weight_decay": 0.0,
                "max_grad_norm": None, "nar": False}


@dataclass
class W3Result:
    """One engine's W3 run: ``round``/``wall_s`` of the first evaluation at or above the
    target (None if none was), the last evaluation's accuracy, the rounds run and the
    seconds of the whole call."""

    engine: str
    round: int | None
    wall_s: float | None
    accuracy: float
    rounds_run: int
    total_s: float


def baseline_lr(cfg: RunConfig) -> float:
    """The local learning rate of a config the plain and Flower baselines can run, or a
    one-line ``ValueError`` naming the first setting they do not implement."""

    def refuse(key: str, value: object) -> ValueError:
        return ValueError(f"--engines: the plain and flower rows run plain FedAvg (local SGD, "
                          f"sample-weighted average); {key} = {value!r} is not supported")

    if cfg.multitask:
        raise refuse("tasks", f"{len(cfg.tasks)} tasks")
    if canonical_name(cfg.algorithm.name) != "fedavg":
        raise refuse("algorithm.name", cfg.algorithm.name)
    hp = resolved_hparams("fedavg", algorithm_kwargs(cfg))
    for key, plain in PLAIN_FEDAVG.items():
        if hp[key] != plain:
            raise refuse(f"algorithm.{key}", hp[key])
    if isinstance(hp["local_lr"], bool) or not isinstance(hp["local_lr"], int | float):
        raise refuse("algorithm.local_lr", hp["local_lr"])
    for key, value, plain in (
        ("server.aggregation", cfg.server.aggregation, (None, "num_samples")),
        ("server.aggregator", cfg.server.aggregator, ("mean",)),
        ("attack.kind", cfg.attack.kind, ("none",)),
        ("privacy.mode", cfg.privacy.mode, ("off",)),
        ("sim.stragglers", cfg.sim.stragglers, (False,)),
        ("engine.precision", cfg.engine.precision, ("fp32",)),
    ):
        if value not in plain:
            raise refuse(key, value)
    return float(hp["local_lr"])


def load_federated(cfg: RunConfig, device: torch.device | None = None) -> FederatedDataset:
    """The config's clients and test set, exactly as ``fedforge run`` builds them."""
    device = device or resolve_device(cfg.engine.device)
    splits = load_dataset(cfg.data.dataset, cfg.data.root, **cfg.data.options)
    data = build_federated_dataset(splits, cfg.data.partition, cfg.data.num_clients, cfg.seed,
                                   **cfg.data.partition_options)
    return data.to(device).with_float_dtype(torch.get_default_dtype())


def build_network(cfg: RunConfig, data: FederatedDataset) -> nn.Module:
    """The config's model with fedforge's initial weights (same seed, same registry)."""
    torch.manual_seed(cfg.seed)
    net = build_model(cfg.model.name, data.input_shape, data.num_classes, **cfg.model.options)
    if cfg.model.init_from is not None:
        init_network(net, cfg.model.init_from)
    return net.to(data.train_x.device)


def draw_cohort(cfg: RunConfig, sizes: torch.Tensor, round_: int
                ) -> list[tuple[int, list[torch.Tensor]]]:
    """Round ``round_``'s clients, each with its mini-batches as positions into its own
    samples (padding dropped): the draws ``fedforge run`` makes for that round."""
    gen = round_generator(cfg.seed, round_)
    num = min(cfg.server.clients_per_round, len(sizes))
    ids = torch.randperm(len(sizes), generator=gen)[:num].sort().values
    pos, mask = client_batches(sizes[ids], cfg.client.local_steps, cfg.client.local_epochs,
                               cfg.client.batch_size, gen)
    cohort = []
    for c, cid in enumerate(ids.tolist()):
        steps = (pos[c, s][mask[c, s] > 0] for s in range(pos.shape[1]))
        cohort.append((cid, [b for b in steps if b.numel() > 0]))
    return cohort


def train_client(model: nn.Module, x: torch.Tensor, y: torch.Tensor,
                 batches: list[torch.Tensor], lr: float) -> None:
    """Local SGD: one ``torch.optim.SGD`` step of mean cross-entropy per batch of indices."""
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    for b in batches:
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(x[b]), y[b]).backward()
        opt.step()


def fedavg_round(model: nn.Module, data: FederatedDataset, cohort, sizes: torch.Tensor,
                 lr: float) -> None:
    """One FedAvg round in place: every client starts from the global weights, trains, and
    the new global weights are the ``n_i / sum n``-weighted mean of the clients'."""
    start = {k: v.detach().clone() for k, v in model.state_dict().items()}
    total = sum(int(sizes[cid]) for cid, _ in cohort)
    if total == 0:
        return
    mean = {k: torch.zeros_like(v) for k, v in start.items()}
    for cid, batches in cohort:
        model.load_state_dict(start)
        own = data.client_indices[cid]
        train_client(model, data.train_x, data.train_y, [own[b] for b in batches], lr)
        weight = int(sizes[cid]) / total
        for k, v in model.state_dict().items():
            mean[k] += weight * v.detach()
    model.load_state_dict(mean)


@torch.no_grad()
def test_accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor, batch_size: int) -> float:
    """Share of the test set the model classifies correctly."""
    correct = 0
    for s in range(0, x.shape[0], batch_size):
        correct += int((model(x[s:s + batch_size]).argmax(-1) == y[s:s + batch_size]).sum())
    return correct / max(x.shape[0], 1)


def evaluates(cfg: RunConfig, round_: int) -> bool:
    """Whether ``round_`` is evaluated: every ``eval.every`` rounds and the last one."""
    return round_ % cfg.eval.every == 0 or round_ == cfg.rounds


class TargetWatch:
    """The training clock of a baseline: started at construction (after data loading), it
    records evaluations until one reaches the target."""

    def __init__(self, target: float) -> None:
        self.target = target
        self.t0 = time.perf_counter()
        self.hit: tuple[int, float] | None = None  # (round, seconds)
        self.accuracy = float("nan")
        self.rounds = 0

    def evaluated(self, round_: int, accuracy: float) -> bool:
        """Record round ``round_``'s accuracy (its evaluation just ended) -> stop now?"""
        self.accuracy, self.rounds = accuracy, round_
        if self.hit is None and accuracy >= self.target:
            self.hit = (round_, time.perf_counter() - self.t0)
        return self.hit is not None

    def result(self, engine: str, started: float) -> W3Result:
        """The row of an engine whose whole call began at ``started`` (perf_counter)."""
        rnd, wall = self.hit if self.hit is not None else (None, None)
        return W3Result(engine, rnd, wall, self.accuracy, self.rounds,
                        time.perf_counter() - started)


def run_plain(cfg: RunConfig, target: float) -> W3Result:
    """W3 with the plain loop: FedAvg rounds until the first evaluation at or above
    ``target`` (or the last round). The clock starts after data loading and model building,
    and covers every round's cohort draw, local training, averaging and evaluation."""
    started = time.perf_counter()
    lr = baseline_lr(cfg)
    data = load_federated(cfg)
    model = build_network(cfg, data)
    sizes = data.client_sizes()
    watch = TargetWatch(target)
    for t in range(1, cfg.rounds + 1):
        fedavg_round(model, data, draw_cohort(cfg, sizes, t), sizes, lr)
        if evaluates(cfg, t) and watch.evaluated(
                t, test_accuracy(model, data.test_x, data.test_y, cfg.eval.batch_size)):
            break
    return watch.result("plain", started)
