"""What a throughput row trains: the workloads, their random data, and the baselines.

The plain PyTorch client (``torch.optim.SGD`` over its batches) is shared by the in-process
rows, the ``:procs2`` workers and the Flower baseline, so each times the same client.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F

from fedforge.algorithms import build_algorithm
from fedforge.core.store import ClientStore
from fedforge.engine import (
    AutoEngine,
    LoopEngine,
    ProcessEngine,
    VmapEngine,
    classification_loss,
)
from fedforge.engine.draw import RoundDraw
from fedforge.engine.round import RoundResult, RoundSetup, federated_round
from fedforge.models import build_model

LR = 0.01


@dataclass(frozen=True)
class Workload:
    """A throughput workload: every client runs ``steps`` SGD steps of ``batch`` samples."""

    name: str
    model: str
    input_shape: tuple[int, ...]
    steps: int
    batch: int
    num_classes: int = 10
    vocab: int | None = None  # token inputs in [1, vocab) instead of images (sequence models)

    def inputs(self, n: int, generator: torch.Generator | None = None) -> torch.Tensor:
        """``n`` random inputs: images, or token sequences (0 is padding, never drawn)."""
        if self.vocab is None:
            return torch.randn(n, *self.input_shape, generator=generator)
        return torch.randint(1, self.vocab, (n, *self.input_shape), generator=generator)


W1 = Workload("W1", "cnn", (1, 28, 28), steps=10, batch=32)  # 320 samples, 1 epoch
W2 = Workload("W2", "resnet18_gn", (3, 32, 32), steps=20, batch=50)
# W1's schedule on Shakespeare-shaped sequences: 80 characters, next-character classes
W1_TEXT = Workload("W1 text", "char_lstm", (80,), steps=10, batch=32, num_classes=80, vocab=80)


def for_model(work: Workload, model: str) -> Workload:
    """The image workload ``work`` with another registered model; a model that embeds tokens
    (an ``nn.Embedding``) gets :data:`W1_TEXT`'s token inputs with ``work``'s schedule."""
    try:
        probe = build_model(model, W1_TEXT.input_shape, W1_TEXT.num_classes)
    except ValueError:  # an image model refuses a 1-D input shape
        probe = None
    if probe is None or not any(isinstance(m, torch.nn.Embedding) for m in probe.modules()):
        return replace(work, model=model)
    return replace(W1_TEXT, name=f"{work.name} text", model=model, steps=work.steps,
                   batch=work.batch)


def make_data(num_clients: int, device: torch.device, work: Workload = W1):
    """Random images; each client's epoch = its ``steps * batch`` samples in a random order."""
    g = torch.Generator().manual_seed(0)
    per_client = work.steps * work.batch
    x = work.inputs(num_clients * per_client, g).to(device)
    y = torch.randint(0, work.num_classes, (num_clients * per_client,), generator=g).to(device)
    perm = torch.argsort(torch.rand(num_clients, per_client, generator=g), dim=1)
    idx = (torch.arange(num_clients).view(-1, 1) * per_client + perm)
    return x, y, idx.view(num_clients, work.steps, work.batch).to(device)


def train_client(model, x, y, client_idx, precision: str = "fp32") -> None:
    """One client's local epoch the way most FL code writes it: ``torch.optim.SGD`` over its
    batches ``client_idx [steps, batch]``. Shared by the plain-loop and Flower baselines."""
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    for b in client_idx:
        opt.zero_grad(set_to_none=True)
        with torch.autocast(x.device.type, torch.bfloat16, enabled=precision == "bf16"):
            logits = model(x[b])
        F.cross_entropy(logits.float(), y[b]).backward()
        opt.step()


def plain_loop(model, x, y, idx, precision: str = "fp32") -> None:
    """The baseline: reload the global model per client, train, average."""
    global_state = {k: v.clone() for k, v in model.state_dict().items()}
    model.load_state_dict(plain_sum(model, global_state, x, y, idx, idx.shape[0], precision))


def plain_sum(model: torch.nn.Module, global_state: dict[str, torch.Tensor], x: torch.Tensor,
              y: torch.Tensor, idx: torch.Tensor, num: int, precision: str = "fp32"
              ) -> dict[str, torch.Tensor]:
    """Sum over the clients ``idx`` of their trained state / ``num`` (the cohort's size, so a
    ``:procs2`` worker's share of the average); ``model`` is overwritten."""
    acc = {k: torch.zeros_like(v) for k, v in global_state.items()}
    for c in range(idx.shape[0]):
        model.load_state_dict(global_state)
        train_client(model, x, y, idx[c], precision)
        for k, v in model.state_dict().items():
            acc[k] += v / num
    return acc


def fedforge_round(engine, model, x, y, idx, precision: str = "fp32", algo=None,
                   loss_fn=None) -> RoundResult:
    algo = algo or build_algorithm("fedavg", local_lr=LR)
    loss_fn = loss_fn or classification_loss(model, precision)
    params = {k: v.detach().clone() for k, v in model.named_parameters()}
    store = ClientStore(idx.shape[0], {})
    weights = torch.ones(idx.shape, device=x.device)
    return federated_round(RoundSetup(algo, engine, loss_fn, store, x, y), params,
                           algo.server_init(params),
                           RoundDraw(torch.arange(idx.shape[0]), idx, weights))


def make_engine(engine: str, chunk, compile_=False, cohort: int = 1,
                channels_last: bool = False):
    """The fedforge engine a benchmark row names; ``auto`` is given a 1000-round budget and,
    as under ``fedforge run``, may start worker processes (without them it lost to the plain
    floor of two single-threaded processes on every small conv net)."""
    if engine == "loop":
        return LoopEngine(channels_last=channels_last)
    if engine == "auto":
        return AutoEngine(chunk_size=chunk, budget_updates=1000 * cohort, allow_processes=True)
    if engine == "procs":  # one single-threaded worker per CPU, each running the loop
        return ProcessEngine(channels_last=channels_last)
    return VmapEngine(chunk_size=chunk, compile=compile_)
