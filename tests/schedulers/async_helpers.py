"""Quadratic tasks on the multi-task schedulers: RNG-free losses, so every number is checkable."""

from __future__ import annotations

import torch

from fedforge.algorithms import build_algorithm
from fedforge.data.federated import build_index_table
from fedforge.schedulers.buffered import BufferedServer
from fedforge.schedulers.jobs import TaskExecutor
from fedforge.schedulers.scheduler import Scheduler
from fedforge.schedulers.task import Task
from tests.quadratic import quadratic_loss


def quadratic_task(m: int, centers: list[list[float]], *, lr: float = 0.1, server_lr: float = 1.0,
                   tau: int = 2, step_time: float = 1.0, max_batch: int = 64, seed: int = 0,
                   target: float | None = None, w0=(0.0, 0.0), eval_every: int = 1) -> Task:
    """Task m: client i owns one sample ``[1, c_i]`` (loss ``1/2 ||w - c_i||^2``)."""
    x = torch.tensor([[1.0, *c] for c in centers], dtype=torch.float64)
    y = torch.zeros(len(centers), dtype=torch.long)
    table = build_index_table([torch.tensor([i]) for i in range(len(centers))])
    sizes = torch.ones(len(centers), dtype=torch.int64)
    alg = build_algorithm("fedavg", local_lr=lr, server_lr=server_lr, local_momentum=0.0)
    params = {"w": torch.tensor(w0, dtype=torch.float64)}
    ex = TaskExecutor(m, alg, quadratic_loss, x, y, table, sizes, tau, 1, seed, params,
                      max_batch=max_batch)
    server = BufferedServer(alg, params, 1, len(centers))
    opt = x[:, 1:].mean(0)

    def evaluate(p):
        dist = float((p["w"] - opt).norm())
        return {"test_accuracy": 1.0 / (1.0 + dist), "test_loss": dist}

    return Task(f"q{m}", alg, ex, server, tau, step_time, lr, server_lr, evaluate, target,
                eval_every)


def step_until(scheduler: Scheduler, max_updates: int) -> None:
    """Step ``scheduler`` as the multi-task driver does, until it is done or has applied
    ``max_updates`` client updates (evaluations are dropped)."""
    while not scheduler.done(max_updates):
        scheduler.step(lambda m, rec: None)
