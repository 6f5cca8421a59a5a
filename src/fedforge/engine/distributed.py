"""DistributedEngine: the cohort split across ``torch.distributed`` ranks.

Each rank runs a contiguous, deterministic shard of the sampled cohort with the
VmapEngine; the weighted delta sum and the upload sums are all-reduced (SUM), and the new
client states and metrics are all-gathered. With no process group initialised it is
exactly the VmapEngine. gloo on CPU, NCCL on GPU: the backend is picked in
:func:`init_distributed`. Rank 0 owns evaluation, metrics and checkpoints (the runner checks
:func:`is_main_rank`).

Per-client persistent state is sharded by client id (:class:`ShardedClientStore`): rank r
keeps the rows of clients ``r, r + W, r + 2W, ...``, so the population's state (SCAFFOLD c_i,
FAdamGC y_i/v_i, error feedback) costs each rank 1/W of the memory. Only the sampled cohort's
rows travel: assembled on every rank before the round (one SUM all-reduce of owner-filled
rows) and written back by their owners after it. A disk store
(:class:`ShardedDiskClientStore`) shards the same way, each rank with its own folder.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
import torch.distributed as dist

from fedforge.core.disk_store import DiskClientStore
from fedforge.core.store import ClientStore, StateStore
from fedforge.core.tree import (
    PyTree,
    flatten_dict,
    tree_leaves,
    tree_map,
    tree_to,
)
from fedforge.engine.base import CohortInputs, CohortOutput, combine_shards
from fedforge.engine.local import LossFn
from fedforge.engine.vmap import VmapEngine
from fedforge.protocol.algorithm import Algorithm


def init_distributed() -> bool:
    """Initialise the default group from torchrun's env vars; False when not launched so."""
    if dist.is_available() and dist.is_initialized():
        return True
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        return False
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if gpus:  # object collectives and NCCL use the current device: one GPU per local rank
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")) % gpus)
    backend = os.environ.get("FEDFORGE_DIST_BACKEND") or choose_backend(
        gpus, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    dist.init_process_group(backend=backend)
    return True


def choose_backend(gpus: int, local_ranks: int) -> str:
    """NCCL when every rank of a node has a GPU of its own; gloo on CPUs and when ranks share
    a GPU (NCCL refuses two ranks on one device). ``FEDFORGE_DIST_BACKEND`` overrides it."""
    return "nccl" if gpus and local_ranks <= gpus else "gloo"


def is_main_rank() -> bool:
    """True on rank 0 or when not distributed: that process writes metrics/checkpoints."""
    return not (dist.is_available() and dist.is_initialized()) or dist.get_rank() == 0


def world_size() -> int:
    """Ranks in the default group (1 when not distributed)."""
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def barrier() -> None:
    """Wait for every rank (no-op when not distributed): e.g. after rank 0 wrote a checkpoint
    that the others may read."""
    if world_size() > 1:
        dist.barrier()


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
        if world_size() == 1:
            return super().run_cohort(algorithm, loss_fn, x_all, y_all, inputs)
        rank, world = dist.get_rank(), dist.get_world_size()
        num_clients = inputs.sample_idx.shape[0]
        lo, hi = shard_bounds(num_clients, rank, world)
        # global weights: the shard's "mean" is a partial sum
        out = super().run_cohort(algorithm, loss_fn, x_all, y_all, inputs.clients(slice(lo, hi)))
        delta_sum = out.mean_delta
        # a rank with an empty shard has zero deltas and still joins every collective
        gathered: list = [None] * world
        # host tensors: unpickled CUDA tensors would land on the sender's GPU index
        dist.all_gather_object(gathered, tree_to({
            "u": out.mean_uploads, "s": out.client_states, "m": out.metrics, "k": out.deltas},
            "cpu"))
        gathered = tree_to(gathered, x_all.device)
        for leaf in tree_leaves(delta_sum):
            dist.all_reduce(leaf, op=dist.ReduceOp.SUM)
        sizes = [b - a for a, b in (shard_bounds(num_clients, r, world) for r in range(world))]
        shards = [CohortOutput(None, g["u"], g["s"], g["m"], g["k"]) for g in gathered]
        return combine_shards(shards, sizes, self.keep_deltas, delta_sum=delta_sum)


def make_client_store(num_clients: int, template: dict, device: torch.device | str = "cpu",
                      storage: torch.device | str | None = None, *, kind: str = "memory",
                      directory: str | Path | None = None, cache_mb: int = 256,
                      root: str | Path | None = None, sharded: bool | None = None
                      ) -> StateStore:
    """The one factory of client stores: ``kind`` ``"memory"`` (:class:`ClientStore`) or
    ``"disk"`` (:class:`DiskClientStore` in ``directory``, inside the run folder ``root``),
    sharded by client id over the ranks under a multi-rank process group (``sharded``:
    default; ``False`` for runs whose ranks each keep every client, such as multi-task
    runs, where every rank runs the same scheduler and writes its own checkpoints)."""
    if kind not in ("memory", "disk"):
        raise ValueError(f"engine.client_store: expected 'memory' or 'disk', got {kind!r}")
    sharded = world_size() > 1 if sharded is None else sharded
    if kind == "memory":
        cls = ShardedClientStore if sharded else ClientStore
        return cls(num_clients, template, device, storage)
    if directory is None:
        raise ValueError("a disk client store needs a folder inside the run folder")
    directory = Path(directory)
    if sharded:  # each rank its own folder
        return ShardedDiskClientStore(num_clients, template,
                                      directory / f"rank{dist.get_rank()}", device, cache_mb,
                                      root if root is not None else directory)
    return DiskClientStore(num_clients, template, directory, device, cache_mb, root)


class ShardedClientStore(ClientStore):
    """Client state sharded by id over the ranks: rank r holds clients ``r::W`` (row i//W).

    Same interface as :class:`ClientStore`, so rounds, screening and robust aggregation see
    the whole cohort's state as before. ``gather`` and ``state_dict`` are collectives: every
    rank must call them, with the same ids. ``state_dict`` assembles the full
    ``[num_clients, ...]`` layout on rank 0 only (others get ``{}``), so a checkpoint written by
    N ranks loads in one process and vice versa; ``load_state_dict`` takes the full layout.
    """

    def __init__(self, num_clients: int, template: dict, device: torch.device | str = "cpu",
                 storage: torch.device | str | None = None) -> None:
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        super().__init__(num_clients, template, device, storage)

    def num_rows(self, rank: int | None = None) -> int:
        """Rows of ``rank``'s shard (this rank's by default)."""
        return len(range(self.rank if rank is None else rank, self.num_clients, self.world))

    def _comm_device(self) -> torch.device:
        return _comm_device(self.compute_device)

    def gather(self, client_ids: torch.Tensor) -> PyTree:
        if self.empty:
            return {}
        pos, rows = _owned(client_ids)
        local = tree_map(lambda s: s[rows.to(s.device)], self.state)
        return _assemble(local, pos, client_ids.numel(), self._comm_device(),
                         self.compute_device)

    def scatter(self, client_ids: torch.Tensor, values: PyTree) -> None:
        if self.empty:
            return
        pos, rows = _owned(client_ids)
        flat_store, flat_new = flatten_dict(self.state), flatten_dict(values)
        for name, dst in flat_store.items():
            new = flat_new[name][pos.to(flat_new[name].device)]
            dst[rows.to(dst.device)] = new.to(dst.dtype).to(self.device)

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Full layout on rank 0 (``{}`` on the others); every rank must call it."""
        return _full_layout(flatten_dict(self.state), self.num_clients, self._comm_device())

    def load_state_dict(self, flat: dict[str, torch.Tensor]) -> None:
        super().load_state_dict(_rank_rows(flat, self.num_clients))


def _comm_device(compute: torch.device) -> torch.device:
    # NCCL moves CUDA tensors only; gloo moves CPU tensors (and CUDA ones through the host)
    return compute if dist.get_backend() == "nccl" else torch.device("cpu")


def _owned(client_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """-> (positions in ``client_ids`` this rank owns, their rows in its shard)."""
    ids, rank, world = client_ids.cpu(), dist.get_rank(), dist.get_world_size()
    pos = torch.nonzero(ids % world == rank).flatten()
    return pos, ids[pos] // world


def _assemble(local: PyTree, pos: torch.Tensor, n: int, comm: torch.device,
              dev: torch.device) -> PyTree:
    """The cohort's rows on every rank from each owner's ``local`` rows at ``pos``."""
    def one(s: torch.Tensor) -> torch.Tensor:
        full = torch.zeros((n, *s.shape[1:]), dtype=s.dtype, device=comm)
        full[pos.to(comm)] = s.to(comm)
        dist.all_reduce(full, op=dist.ReduceOp.SUM)  # one owner per row: the sum is a copy
        return full.to(dev, non_blocking=True)

    return tree_map(one, local)


def _full_layout(local: dict[str, torch.Tensor], num_clients: int,
                 comm: torch.device) -> dict[str, torch.Tensor]:
    """Every rank's rows ``r::W`` -> the ``[num_clients, ...]`` layout on rank 0 (``{}``
    elsewhere); a collective."""
    rank, world, full = dist.get_rank(), dist.get_world_size(), {}
    per_rank = -(-num_clients // world)  # shards padded to equal length
    for name, shard in local.items():
        padded = torch.zeros((per_rank, *shard.shape[1:]), dtype=shard.dtype, device=comm)
        padded[: shard.shape[0]] = shard.to(comm)
        parts = [torch.empty_like(padded) for _ in range(world)] if rank == 0 else None
        dist.gather(padded, parts, dst=0)
        if rank == 0:
            out = torch.empty((num_clients, *shard.shape[1:]), dtype=shard.dtype)
            for r, part in enumerate(parts):
                out[r::world] = part[: len(range(r, num_clients, world))].cpu()
            full[name] = out
    return full


def _rank_rows(flat: dict[str, torch.Tensor], num_clients: int) -> dict[str, torch.Tensor]:
    """This rank's rows ``r::W`` of a full ``[num_clients, ...]`` layout."""
    rank, world = dist.get_rank(), dist.get_world_size()
    flat = flatten_dict(flat)  # a checkpoint's nested dict or a flat one
    for name, t in flat.items():
        if t.shape[0] != num_clients:
            raise ValueError(f"client state {name!r}: expected {num_clients} rows "
                             f"(the full layout), got {t.shape[0]}")
    # clone: a strided view would keep the whole population's tensor alive
    return {k: t[rank::world].clone() for k, t in flat.items()}


class ShardedDiskClientStore(DiskClientStore):
    """A :class:`DiskClientStore` sharded by client id over the ranks like
    :class:`ShardedClientStore`: rank r keeps clients ``r::W`` in its own folder. ``gather``,
    ``state_dict`` and :meth:`record` are collectives (every rank, the same ids)."""

    def __init__(self, num_clients: int, template: dict, directory: str | Path,
                 device: torch.device | str = "cpu", cache_mb: int = 256,
                 root: str | Path | None = None) -> None:
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        super().__init__(num_clients, template, directory, device, cache_mb, root)

    def num_rows(self) -> int:
        return len(range(self.rank, self.num_clients, self.world))

    def gather(self, client_ids: torch.Tensor) -> PyTree:
        if self.empty:
            return super().gather(client_ids)
        pos, rows = _owned(client_ids)
        return _assemble(super().gather(rows), pos, client_ids.numel(),
                         _comm_device(self.compute_device), self.compute_device)

    def scatter(self, client_ids: torch.Tensor, values: PyTree) -> None:
        if self.empty:
            return
        pos, rows = _owned(client_ids)
        super().scatter(rows, tree_map(lambda v: v[pos.to(v.device)], values))

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Full layout on rank 0 (``{}`` on the others); every rank must call it."""
        if self.empty:
            return {}
        return _full_layout(super().state_dict(), self.num_clients,
                            _comm_device(self.compute_device))

    def load_state_dict(self, flat: dict[str, torch.Tensor]) -> None:
        super().load_state_dict(_rank_rows(flat, self.num_clients))

    def _exchange(self, meta: dict) -> list[dict]:
        metas: list = [None] * self.world
        dist.all_gather_object(metas, meta)
        return metas
