"""Which driver runs a multi-task method, and what that driver serves of an algorithm's needs.

The config refuses an algorithm that a method's driver cannot serve when it is loaded, in
one line, rather than mid-run (:func:`fedforge.protocol.algorithm.check_support`).
"""

from __future__ import annotations

import torch

from fedforge.protocol.algorithm import Algorithm
from fedforge.schedulers.fedast import ASYNC_METHODS
from fedforge.server.optimizers import ServerOptimizer

ASYNC_SERVES: frozenset[str] = frozenset()
"""What a buffered asynchronous server serves besides deltas and broadcasts: nothing else.
No per-client state (a client may hold several jobs at once), no uploads or codec messages (a
buffer mixes jobs sent at different rounds, so round-keyed codecs cannot decode it), no
per-cohort preparation or per-client round inputs (there is no cohort)."""

SYNC_MULTITASK_SERVES: frozenset[str] = frozenset({"client_state", "uploads", "codec"})
"""Synchronous multi-task rounds (sync_st, ...) run whole cohorts through the round, each task
keeping its clients' state in a store of the run's kind (checkpointed with the run), but draw
no per-client round inputs."""


def driver_serves(method: str) -> tuple[str, frozenset[str]]:
    """A multi-task ``method`` -> (its driver's name, what that driver serves)."""
    if method in ASYNC_METHODS:
        return "asynchronous driver", ASYNC_SERVES
    return "synchronous multi-task driver", SYNC_MULTITASK_SERVES


def check_model_mixing(algorithm: Algorithm, method: str, field: str) -> None:
    """FedAsync mixes the client's model into the server's (``x <- (1 - a) x + a x_i``) in
    place of the server step, so it can only stand for a plain server SGD step: refuse a
    server optimizer with state (momentum, Adam, FedExP, ...) that it would silently drop."""
    if method != "fedasync":
        return
    opt = algorithm.server_optimizer
    plain = (isinstance(opt, ServerOptimizer) and opt.name == "sgd"
             and "v" not in opt.init({"w": torch.zeros(1)}))
    if not plain:
        raise ValueError(
            f"{field}: '{algorithm.name}' has a server optimizer ({opt.name}) that FedAsync's "
            f"model mixing replaces; use method = 'fedbuff' or 'fedast', or a plain-SGD "
            f"algorithm such as 'fedavg'")
