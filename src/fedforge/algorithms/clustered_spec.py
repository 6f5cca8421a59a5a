"""Where a clustered method's client starts and which model it is evaluated with.

A client's round starts from the cluster model its round inputs name (``info[START]``, a
one-hot over the M models), and its personal model is the model of its stored cluster.
Selecting by a one-hot mean is exact (the other models are multiplied by zero) and
vmappable; a client with no cluster (all zeros) gets the global model.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch

from fedforge.algorithms.personal.base import Personal, Train
from fedforge.client.transforms import RoundContext
from fedforge.core.tree import Params

CLUSTERS = "clusters"
"""The part (client store, server state, broadcast) of a clustered method."""
START = "cluster_start"
"""Round-input key: one-hot ``[C, M]`` of the cluster model each client's round starts from."""


def one_hot(index: torch.Tensor, count: int, dtype: torch.dtype) -> torch.Tensor:
    """``[..., count]`` with 1 at ``index`` (a float index; -1 gives all zeros)."""
    return (index.unsqueeze(-1) == torch.arange(count, device=index.device)).to(dtype)


def pick(models: Params, which: int | torch.Tensor, fallback: Params | None = None) -> Params:
    """Model ``which`` of the stacked ``models`` ``[M, ...]``: an int, or a one-hot ``[M]``
    (all zeros: ``fallback``)."""
    if isinstance(which, int):
        return {k: v[which] for k, v in models.items()}
    out = {}
    for k, v in models.items():
        w = which.to(v.dtype).view(-1, *[1] * (v.dim() - 1))
        chosen = (w * v).sum(0)
        out[k] = chosen if fallback is None else torch.where(which.sum() > 0, chosen,
                                                             fallback[k])
    return out


@dataclass(frozen=True)
class ClusterSpec(Personal):
    """A clustered method's personal model: its cluster's, from the server's models bound
    for an evaluation (:meth:`evaluated_at`)."""

    num_models: int = 1
    models: Params | None = field(default=None, compare=False, repr=False)

    def begin(self, train: Train, ctx: RoundContext) -> tuple[Params, RoundContext]:
        models = ctx.broadcast[CLUSTERS]["models"]
        return pick(models, ctx.info[START], ctx.global_params), ctx

    def client_params(self, global_params: Params, state: dict) -> Params:
        if self.models is None:
            raise ValueError("clustered FL: the cluster models are not bound; evaluate "
                             "with algorithm.evaluated_at(server_state)")
        cluster = state[CLUSTERS]["cluster"]
        dtype = next(iter(global_params.values())).dtype
        return pick(self.models, one_hot(cluster, self.num_models, dtype), global_params)

    def evaluated_at(self, parts: dict) -> ClusterSpec:
        return replace(self, models=parts[CLUSTERS]["models"])

    def client_columns(self, states: dict, count: int) -> dict[str, torch.Tensor]:
        """Each client's cluster (-1: none yet, and every held-out client)."""
        if not states:
            return {"cluster": torch.full((count,), -1, dtype=torch.int64)}
        return {"cluster": states[CLUSTERS]["cluster"].reshape(-1).to(torch.int64)}

    def covered_by_dp_sgd(self) -> bool:
        return False  # the trained models uploaded in their cluster's slot are not noised
