"""FedNova (Wang et al. 2020, "Tackling the Objective Inconsistency Problem in Heterogeneous
Federated Optimization") as a fedforge plugin; docs/extending.md explains it line by line.
fedforge has FedNova built in (``fednova``, with local momentum and a proximal term, as the
official code); this plugin is its plain-SGD core under another name, ``my_fednova``.

Clients that take different numbers of local steps τ_i pull FedAvg towards the clients that
step most. FedNova averages *normalised* updates instead: each client sends
d_i = Δ_i / τ_i (plain local SGD) and τ_i, and the server steps

    x ← x − η_g · τ_eff · Σ_i p_i d_i,     τ_eff = Σ_i p_i τ_i,     p_i = n_i / Σ_j n_j.

Run it:  fedforge run examples/quickstart.toml --plugin examples/plugins/fednova_plugin.py \\
             algorithm.name=my_fednova --out runs/fednova
"""

from __future__ import annotations

import fedforge
from fedforge.algorithms import Algorithm, FinalizeInputs, Part
from fedforge.client.optimizers import local_optimizer
from fedforge.server.chain import ServerTransform


class NormalisedUpdate(Part):
    """Uploads d_i = Δ_i / τ_i and τ_i, averaged over the cohort with weights n_i / n."""

    name = "fednova"
    upload_weights = "num_samples"  # the server receives Σ p_i d_i and Σ p_i τ_i

    def finalize(self, fin: FinalizeInputs) -> tuple[dict, dict]:
        tau = fin.num_steps  # local steps this client took (0-d tensor)
        d = {k: v / tau.clamp_min(1.0) for k, v in fin.delta.items()}
        return {}, {"d": d, "tau": tau}


def fednova_step(server_lr: float = 1.0) -> ServerTransform:
    """The server stage: x ← x − η_g τ_eff Σ p_i d_i (no state)."""

    def update(params, agg, state):
        up = agg.uploads["fednova"]
        step = server_lr * up["tau"]  # η_g τ_eff
        new = {k: p - step.to(p.dtype) * up["d"][k] for k, p in params.items()}
        return new, agg, state

    return ServerTransform("opt", lambda params: {}, update)


def fednova(local_lr: float = 0.01, server_lr: float = 1.0) -> Algorithm:
    """FedNova with plain local SGD (a_i = [1, ..., 1], so ||a_i||_1 = τ_i)."""
    return Algorithm("my_fednova", local_optimizer("sgd", local_lr), fednova_step(server_lr),
                     parts=(NormalisedUpdate(),), aggregation="num_samples",
                     description="FedNova (Wang et al. 2020): normalised averaging")


fedforge.register_algorithm("my_fednova", fednova)
