"""Per-task asynchronous servers: FedAST/FedBuff's buffer and FedAsync's staleness mixing.

FedAST (Alg. 2 lines 7-11): every arriving delta ``D = x_sent - x_local`` joins the task's
buffer with weight 1 (no staleness weighting); when ``|B| = b`` the server applies
``x <- x - eta_s * mean(B)`` and starts round ``t + 1``. The step is the task algorithm's own
``server_step`` on the buffer mean, so ``server_lr`` is ``eta_s`` and a server optimizer other
than SGD (e.g. FedBuff with server momentum/Adam) works the same way.

FedAsync (Xie et al. 2019): ``x <- (1 - a_t) x + a_t x_i`` with ``a_t = alpha (1 + s)^-a`` for
staleness ``s`` (polynomial rule). With ``x_i = x_sent - D`` this is
``x <- x - a_t (x - x_sent + D)``.
"""

from __future__ import annotations

import torch

from fedforge.core.tree import Params, restore_like, tree_leaves, tree_map
from fedforge.protocol.algorithm import Algorithm
from fedforge.server.chain import Aggregate


class BufferedServer:
    """One task's model, server-optimizer state, round counter and update buffer."""

    def __init__(self, algorithm: Algorithm, params: Params, buffer_size: int,
                 num_clients: int) -> None:
        self.algorithm = algorithm
        self.params = params
        self.server_state = algorithm.server_init(params)
        self.round = 0  # t_m: server steps taken
        self.b = int(buffer_size)
        self.num_clients = num_clients
        self.buf_sum: Params = tree_map(torch.zeros_like, params)
        self.buf_count = 0

    def receive(self, delta: Params, weight: float = 1.0) -> bool:
        """Add one update (times ``weight``; FedAST uses 1); step when the buffer holds ``b``.

        -> whether a server step happened.
        """
        # in place: one arrival costs an add per leaf, not two new model-sized tensors
        # (the sum the same as ``s + weight * d``, bit for bit)
        for s, d in zip(tree_leaves(self.buf_sum), tree_leaves(delta), strict=True):
            s.add_(d if weight == 1.0 else weight * d)
        self.buf_count += 1
        if self.buf_count < self.b:
            return False
        mean = tree_map(lambda s: s / self.buf_count, self.buf_sum)
        aggregate = Aggregate(mean, {}, self.buf_count, self.num_clients, self.round + 1)
        self.params, self.server_state = self.algorithm.server_step(
            self.params, self.server_state, aggregate)
        self.round += 1
        self.buf_sum = tree_map(torch.zeros_like, self.params)
        self.buf_count = 0
        return True

    def mix(self, sent: Params, delta: Params, alpha: float, staleness: int,
            a: float = 0.5) -> bool:
        """FedAsync step with ``a_t = alpha (1 + staleness)^-a``. Always a server step."""
        a_t = alpha * (1.0 + staleness) ** (-a)
        self.params = {k: self.params[k] - a_t * (self.params[k] - sent[k] + delta[k])
                       for k in self.params}
        self.round += 1
        return True

    def state_dict(self) -> dict:
        return {"params": self.params, "server": self.server_state.tree(),
                "buf_sum": self.buf_sum}

    def meta(self) -> dict:
        return {"round": self.round, "b": self.b, "buf_count": self.buf_count}

    def load(self, tensors: dict, meta: dict) -> None:
        template = self.params
        self.params = restore_like(template, tensors["params"], "params")
        self.server_state = self.algorithm.server.restore(template, tensors.get("server", {}))
        self.buf_sum = restore_like(template, tensors["buf_sum"], "buffer")
        self.round, self.b, self.buf_count = meta["round"], meta["b"], meta["buf_count"]
