"""DistributedEngine: the cohort split across ``torch.distributed`` ranks.

Each rank runs a contiguous, deterministic shard of the sampled cohort with the
VmapEngine; the weighted delta sum and the upload sums are all-reduced (SUM), and the new
client states and metrics are all-gathered so every rank holds the same store. With no
process group initialised it is exactly the VmapEngine. gloo on CPU, NCCL on GPU: the
backend is picked in :func:`init_distributed`. Rank 0 owns evaluation, metrics and
checkpoints (the runner checks :func:`is_main_rank`).
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist

from fedforge.algorithms.base import Algorithm
from fedforge.core.tree import tree_index, tree_map, tree_map2
from fedforge.engine.base import CohortInputs, CohortOutput, _cat
from fedforge.engine.local import LossFn
from fedforge.engine.vmap import VmapEngine


def init_distributed() -> bool:
    """Initialise the default group from torchrun's env vars; False when not launched so."""
    if dist.is_available() and dist.is_initialized():
        return True
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        return False
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend=backend)
    return True


def is_main_rank() -> bool:
    """True on rank 0 or when not distributed: that process writes metrics/checkpoints."""
    return not (dist.is_available() and dist.is_initialized()) or dist.get_rank() == 0


def shard_bounds(num_clients: int, rank: int, world: int) -> tuple[int, int]:
    """Contiguous shard [lo, hi) of the cohort for ``rank``; sizes differ by at most one."""
    base, extra = divmod(num_clients, world)
    lo = rank * base + min(rank, extra)
    return lo, lo + base + (1 if rank < extra else 0)


class DistributedEngine(VmapEngine):
    """VmapEngine per rank; sums all-reduced so the result equals the one-process run."""

    name = "distributed"

    def run_cohort(
        self,
        algorithm: Algorithm,
        loss_fn: LossFn,
        x_all: torch.Tensor,
        y_all: torch.Tensor,
        inputs: CohortInputs,
    ) -> CohortOutput:
        if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
            return super().run_cohort(algorithm, loss_fn, x_all, y_all, inputs)
        rank, world = dist.get_rank(), dist.get_world_size()
        num_clients = inputs.sample_idx.shape[0]
        lo, hi = shard_bounds(num_clients, rank, world)
        sl = slice(lo, hi)
        shard = CohortInputs(
            inputs.global_params, inputs.broadcast, tree_index(inputs.client_states, sl),
            tree_index(inputs.info, sl), inputs.sample_idx[sl], inputs.weights[sl],
            inputs.agg_weights[sl],  # global weights: the shard's "mean" is a partial sum
        )
        out = super().run_cohort(algorithm, loss_fn, x_all, y_all, shard)
        n = hi - lo
        delta_sum = out.mean_delta
        upload_sum = tree_map(lambda u: u * n, out.mean_uploads) if n else None
        # a rank with an empty shard has zero deltas and still joins every collective
        gathered: list = [None] * world
        dist.all_gather_object(gathered, {
            "u": upload_sum, "s": out.client_states, "m": out.metrics, "k": out.deltas})
        for leaf in _leaves(delta_sum):
            dist.all_reduce(leaf, op=dist.ReduceOp.SUM)
        ups = [g["u"] for g in gathered if g["u"] is not None]
        mean_uploads = {}
        if ups:
            total = ups[0]
            for u in ups[1:]:
                total = tree_map2(torch.add, total, u)
            mean_uploads = tree_map(lambda u: u / num_clients, total)
        parts = [g for g in gathered if g["m"]]
        return CohortOutput(
            delta_sum,
            mean_uploads,
            _cat([g["s"] for g in parts]),
            _cat([g["m"] for g in parts]),
            _cat([g["k"] for g in parts]) if self.keep_deltas else None,
        )


def _leaves(tree):
    if isinstance(tree, dict):
        for v in tree.values():
            yield from _leaves(v)
    elif isinstance(tree, torch.Tensor):
        yield tree
