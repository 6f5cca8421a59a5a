"""A proximal term on local SGD as a plugin: an algorithm built from client transforms alone.
docs/extending.md ("A local optimizer from transforms") explains the order of the chain.

Run it:  fedforge compare examples/quickstart.toml --plugin examples/plugins/prox_plugin.py \\
             -a fedavg,my_prox compare.my_prox.algorithm.mu=0.1 --out runs/prox
"""

from __future__ import annotations

import fedforge
from fedforge.algorithms import Algorithm
from fedforge.client.transforms import add_prox, chain, sgd
from fedforge.server.optimizers import server_sgd


def my_prox(local_lr: float = 0.01, mu: float = 0.01) -> Algorithm:
    """Local SGD on the loss plus mu/2 ||x - x^t||^2, then the sample-weighted average."""
    local = chain(add_prox(mu), sgd(local_lr))  # the proximal gradient first, then the step
    return Algorithm("my_prox", local, server_sgd(1.0), aggregation="num_samples",
                     description="FedAvg with a proximal term (plugin example)")


fedforge.register_algorithm("my_prox", my_prox)
