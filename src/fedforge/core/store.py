"""Per-client persistent state (SCAFFOLD c_i, FAdamGC y_i/v_i, error feedback, ...).

One stacked tensor per state leaf, ``[num_clients, ...]``, allocated on first use from the
algorithm's one-client template. Gather and scatter by client ids are single indexing ops,
and the whole store is checkpointed as flat tensors.

The store may live in host memory (``storage="cpu"``) while the cohort trains on a GPU:
only the sampled clients' rows travel to the device each round, so per-client state of
thousands of clients (e.g. FAdamGC keeps two model copies each) does not occupy GPU memory.

:class:`StateStore` is the interface every store offers (this one, the disk store of
:mod:`fedforge.core.disk_store`, the ones sharded over torchrun ranks), so rounds, screening,
robust aggregation, checkpoints and the drivers never ask which store they hold.
:func:`choose_store` is ``engine.client_store = "auto"``'s rule.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol, runtime_checkable

import torch

from fedforge.core.memory import available_memory, format_bytes
from fedforge.core.tree import (
    PyTree,
    flatten_dict,
    restore_like,
    tree_leaves,
    tree_map,
    unflatten_dict,
)

AUTO_MEMORY_FRACTION = 0.25
"""``auto`` keeps the clients' state in memory while it needs at most this share of the
memory available when the run starts; past it, on disk."""


@runtime_checkable
class StateStore(Protocol):
    """Per-client state of a population, read and written one cohort at a time, and
    checkpointed with the run.

    ``gather``/``scatter`` move the cohort's rows (every rank calls them with the same ids
    when sharded); a client never written reads as the algorithm's initial state.
    ``state_dict``/``load_state_dict`` are the whole population in the stacked
    ``[num_clients, ...]`` layout (the in-memory checkpoint format). ``state`` is every
    row this process holds, stacked, for evaluation-time diagnostics (``{}`` when that
    would not fit the store's memory budget).

    The checkpoint half: :meth:`checkpoint` gives what a checkpoint keeps, tensors for its
    file and a record for its JSON; :meth:`restore_checkpoint` continues from them;
    :meth:`collect` deletes what no kept checkpoint names; :meth:`close` releases open
    files. ``kind`` is what ``engine.client_store`` calls the store (``"memory"``,
    ``"disk"``): a resumed run continues in the kind its checkpoint holds
    (:func:`record_kind`)."""

    num_clients: int
    kind: str

    @property
    def empty(self) -> bool: ...

    @property
    def state(self) -> PyTree: ...

    def gather(self, client_ids: torch.Tensor) -> PyTree: ...

    def scatter(self, client_ids: torch.Tensor, values: PyTree) -> None: ...

    def nbytes_per_client(self) -> int: ...

    def state_dict(self) -> dict[str, torch.Tensor]: ...

    def load_state_dict(self, flat: dict[str, torch.Tensor]) -> None: ...

    def checkpoint(self, version: int) -> tuple[dict[str, torch.Tensor], dict | None]:
        """The store at the checkpoint of ``version`` (the run's round or update count) ->
        (tensors for the checkpoint file, the record for its JSON or None); a collective
        when sharded."""
        ...

    def restore_checkpoint(self, tensors: dict | None, record: dict | None = None,
                           where: object = "checkpoint", version: int | None = None) -> None:
        """Continue from a checkpoint's ``tensors`` and ``record`` (read from ``where``,
        written at ``version``; None: not checked); both None: every client's initial
        state, dropping what an earlier run left (a fresh run, a rollback to the start)."""
        ...

    def collect(self, records: Iterable[object]) -> object:
        """Delete what neither this store's state nor the kept checkpoints' ``records``
        (what :meth:`checkpoint` returned for each) name."""
        ...

    def close(self) -> None:
        """Release open files (the store stays usable)."""
        ...


def record_kind(record: object) -> str:
    """The kind of store that wrote a checkpoint's store ``record``: ``"memory"`` keeps its
    rows in the checkpoint's tensors and records nothing; the disk store is the one kind
    that records its files (a malformed record is then refused by it, naming the file)."""
    return "memory" if record is None else "disk"


def template_nbytes(template: dict) -> int:
    """Bytes of one client's state (the algorithm's one-client template)."""
    return sum(t.numel() * t.element_size() for t in tree_leaves(template))


def choose_store(setting: str, num_clients: int, nbytes_per_client: int,
                 available: int | None = None) -> tuple[str, str]:
    """``engine.client_store``'s value -> ``("memory" | "disk", why)``. ``auto``: memory
    while ``num_clients x nbytes_per_client`` is at most ``AUTO_MEMORY_FRACTION`` of the
    ``available`` memory (default: what the host has left now; unknown counts as enough)."""
    if setting in ("memory", "disk"):
        return setting, "set in the config"
    if setting != "auto":
        raise ValueError(f"engine.client_store: expected 'memory', 'disk' or 'auto', got "
                         f"{setting!r}")
    need = num_clients * nbytes_per_client
    free = available_memory() if available is None else available
    if need == 0:
        return "memory", "the algorithm keeps no per-client state"
    if free is None or need <= AUTO_MEMORY_FRACTION * free:
        room = "unknown free memory" if free is None else f"{format_bytes(free)} available"
        return "memory", f"{format_bytes(need)} of client state, {room}"
    return "disk", (f"{format_bytes(need)} of client state is over "
                    f"{AUTO_MEMORY_FRACTION:.0%} of the {format_bytes(free)} available")


class ClientStore:
    """Every client's state in memory, one stacked tensor per leaf; a checkpoint holds the
    rows as tensors and records nothing in its JSON."""

    kind = "memory"

    def __init__(self, num_clients: int, template: dict, device: torch.device | str = "cpu",
                 storage: torch.device | str | None = None):
        """``device``: where gathered cohort state is used; ``storage``: where all rows live
        (default: ``device``)."""
        self.num_clients = num_clients
        self.compute_device = torch.device(device)
        self.device = torch.device(storage) if storage is not None else self.compute_device
        pin = self.device.type == "cpu" and self.compute_device.type == "cuda"
        # template: one client's state, e.g. {"scaffold": {"c": {"w": tensor}}}
        self.template = tree_map(lambda t: t.detach().clone(), template)  # for a reset
        rows = self.num_rows()
        self.state: dict = tree_map(lambda t: self._alloc(rows, t, pin), template)

    def num_rows(self) -> int:
        """Rows this store holds (all clients here; a rank's share in a sharded store)."""
        return self.num_clients

    def _alloc(self, n: int, t: torch.Tensor, pin: bool) -> torch.Tensor:
        out = torch.empty((n, *t.shape), dtype=t.dtype, device=self.device, pin_memory=pin)
        out.copy_(t.to(self.device).expand_as(out))
        return out

    @property
    def empty(self) -> bool:
        return not tree_leaves(self.state)

    def gather(self, client_ids: torch.Tensor) -> PyTree:
        ids = client_ids.to(self.device)
        dev = self.compute_device
        return tree_map(lambda s: s[ids].to(dev, non_blocking=True), self.state)  # [C, ...]

    def scatter(self, client_ids: torch.Tensor, values: PyTree) -> None:
        if self.empty:
            return
        ids = client_ids.to(self.device)
        flat_store, flat_new = flatten_dict(self.state), flatten_dict(values)
        for name, dst in flat_store.items():
            dst[ids] = flat_new[name].to(dst.dtype).to(self.device)

    def nbytes_per_client(self) -> int:
        """Bytes of persistent state one client adds (benchmarks report it)."""
        return sum(t.shape[1:].numel() * t.element_size() for t in tree_leaves(self.state))

    def state_dict(self) -> dict[str, torch.Tensor]:
        return flatten_dict(self.state)

    def load_state_dict(self, flat: dict[str, torch.Tensor]) -> None:
        """Load a checkpoint's rows in this store's key order (refusing other layouts)."""
        self.state = restore_like(self.state, unflatten_dict(dict(flat)), "client")

    def checkpoint(self, version: int) -> tuple[dict[str, torch.Tensor], None]:
        """The rows are the checkpoint's tensors (``version`` is not needed)."""
        return self.state_dict(), None

    def restore_checkpoint(self, tensors: dict | None, record: dict | None = None,
                           where: object = "checkpoint", version: int | None = None) -> None:
        """The checkpoint's rows (``record`` and ``version``: unused); None: the initial
        state, written over the rows in place."""
        if tensors is not None:
            self.load_state_dict(tensors)
            return
        for leaf, init in zip(tree_leaves(self.state), tree_leaves(self.template), strict=True):
            leaf.copy_(init.to(leaf.device).expand_as(leaf))

    def collect(self, records: Iterable[object]) -> list:
        """Nothing to delete: the rows live in the checkpoints' own files."""
        return []

    def close(self) -> None:
        """Nothing open."""
