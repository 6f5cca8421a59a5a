"""One task of a multi-task run: its algorithm, server, executor and evaluation."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from fedforge.core.tree import Params
from fedforge.protocol.algorithm import Algorithm
from fedforge.schedulers.buffered import BufferedServer
from fedforge.schedulers.jobs import TaskExecutor


@dataclass
class Task:
    """Everything the drivers need about task m (each task has its own round counter t_m).

    Attributes:
      tau: local steps per request; ``step_time``: the per-step time factor e_m of the delay.
      local_lr, server_lr: eta_c, eta_s (scalars; used by the variance estimate).
      target: test accuracy at which the task stops (None: never).
      eval_every: evaluate every this many server rounds of the task.
    """

    name: str
    algorithm: Algorithm
    executor: TaskExecutor
    server: BufferedServer
    tau: int
    step_time: float
    local_lr: float
    server_lr: float
    evaluate: Callable[[Params], dict]
    target: float | None = None
    eval_every: int = 1
    done: bool = False
    done_time: float | None = None
    losses: list[float] = field(default_factory=list)  # local losses since the last eval

    def broadcast(self) -> dict:
        """What a request carries besides the model (parts' broadcast, the round for schedules)."""
        dev = next(iter(self.server.params.values())).device
        return {**self.algorithm.broadcast(self.server.server_state),
                "round": torch.tensor(float(self.server.round + 1), device=dev)}
