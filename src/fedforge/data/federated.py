"""A dataset split over clients, held as whole tensors plus each client's index range.

Keeping one copy of the data (on the training device) and only *indices* per client lets a
round gather every client's minibatches with a single indexing op. The indices are held as
ranges of one permutation (:class:`fedforge.data.ranges.ClientRanges`, CSR); the padded
``index_table`` is built only for the code that asks for it (asynchronous jobs, Flower).
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor

from fedforge.data.base import DatasetSplits
from fedforge.data.batching import client_batches
from fedforge.data.partition import label_matched_tests
from fedforge.data.partition import partition as run_partitioner
from fedforge.data.ranges import ClientRanges

__all__ = [
    "ClientRanges",
    "FederatedDataset",
    "build_federated_dataset",
    "build_index_table",
    "client_batches",
    "gather_round_indices",
]


def build_index_table(
    client_indices: list[Tensor], device: torch.device | str | None = None
) -> Tensor:
    """Pad per-client index lists into int64 ``[num_clients, max(1, max_size)]`` (pad = 0)."""
    dev = (
        torch.device(device)
        if device is not None
        else (client_indices[0].device if client_indices else torch.device("cpu"))
    )
    sizes = torch.tensor([len(ix) for ix in client_indices], dtype=torch.int64, device=dev)
    width = max(int(sizes.max()) if len(sizes) else 0, 1)
    table = torch.zeros(len(client_indices), width, dtype=torch.int64, device=dev)
    if int(sizes.sum()) > 0:
        flat = torch.cat([ix.to(dev, torch.int64) for ix in client_indices])
        row = torch.repeat_interleave(torch.arange(len(sizes), device=dev), sizes)
        col = torch.arange(len(flat), device=dev) - torch.repeat_interleave(
            torch.cumsum(sizes, 0) - sizes, sizes
        )
        table[row, col] = flat
    return table


def gather_round_indices(
    client_indices: list[Tensor] | Tensor, clients: Tensor, pos: Tensor
) -> Tensor:
    """Map local positions ``pos`` ``[C, ...]`` of cohort ``clients`` ``[C]`` to global indices.

    Pass the cached ``FederatedDataset.index_table`` (one indexing op); a list of per-client
    index tensors also works but builds the table first.
    """
    table = (
        client_indices if isinstance(client_indices, Tensor) else build_index_table(client_indices)
    )
    rows = clients.to(table.device, torch.int64).view(-1, *([1] * (pos.dim() - 1)))
    return table[rows, pos.to(table.device)]


@dataclass
class FederatedDataset:
    """Whole train/test tensors on one device plus each client's sample indices.

    ``client_indices`` is a list of index tensors (or a :class:`ClientRanges`, which holds
    no tensor per client); rounds gather through ``ranges``, built from it once."""

    train_x: Tensor
    train_y: Tensor
    test_x: Tensor
    test_y: Tensor
    client_indices: Sequence[Tensor]
    client_test_indices: list[Tensor] | None
    num_classes: int
    input_shape: tuple[int, ...]
    name: str
    vocab_size: int | None = None
    client_names: list[str] | None = None  # natural splits: writer / role name per client
    population = False  # every client's data is held (see fedforge.data.population)
    ranges: ClientRanges = field(init=False, repr=False)
    _sizes: Tensor = field(init=False, repr=False)
    _table: Tensor | None = field(init=False, repr=False, default=None)

    def __post_init__(self) -> None:
        self.ranges = ClientRanges.from_lists(self.client_indices, self.train_x.device)
        self._sizes = self.ranges.sizes()

    @property
    def index_table(self) -> Tensor:
        """int64 ``[num_clients, max(1, max_size)]`` padded indices (pad = 0), built on first
        use: rounds of this process gather through ``ranges`` instead."""
        if self._table is None:
            self._table = self.ranges.table()
        return self._table

    @property
    def num_clients(self) -> int:
        return len(self.client_indices)

    @property
    def device(self) -> torch.device:
        return self.train_x.device

    def client_sizes(self) -> Tensor:
        """int64 ``[num_clients]``: number of train samples per client (FedAvg weights)."""
        return self._sizes.clone()

    def label_counts(self) -> Tensor:
        """int64 ``[num_clients, num_classes]`` train label histogram, to report heterogeneity."""
        c = self.num_classes
        y = self.train_y[self.ranges.order].to(torch.int64)
        key = self.ranges.owners() * c + y
        counts = torch.bincount(key, minlength=self.num_clients * c)
        return counts.view(self.num_clients, c)

    def round_indices(self, clients: Tensor, pos: Tensor) -> Tensor:
        """Global sample ids ``[C, ...]`` of local positions ``pos`` of cohort ``clients``."""
        return self.ranges.gather(clients, pos)

    def with_float_dtype(self, dtype: torch.dtype) -> FederatedDataset:
        """A copy whose floating inputs have ``dtype`` (token inputs are left alone)."""
        if not self.train_x.is_floating_point() or self.train_x.dtype == dtype:
            return self
        return dataclasses.replace(self, train_x=self.train_x.to(dtype),
                                   test_x=self.test_x.to(dtype))

    def to(self, device: torch.device | str) -> FederatedDataset:
        """A copy with every tensor (data, indices) on ``device``."""

        def mv(ts: Sequence[Tensor] | None) -> Sequence[Tensor] | None:
            if ts is None or isinstance(ts, ClientRanges):
                return None if ts is None else ts.to(device)
            return [t.to(device) for t in ts]

        return FederatedDataset(
            train_x=self.train_x.to(device),
            train_y=self.train_y.to(device),
            test_x=self.test_x.to(device),
            test_y=self.test_y.to(device),
            client_indices=mv(self.client_indices) or [],
            client_test_indices=mv(self.client_test_indices),
            num_classes=self.num_classes,
            input_shape=self.input_shape,
            name=self.name,
            vocab_size=self.vocab_size,
            client_names=self.client_names,
        )

    def round_batches(
        self,
        clients: Tensor,
        batch_size: int,
        generator: torch.Generator,
        steps: int | None = None,
        epochs: int | None = None,
    ) -> tuple[Tensor, Tensor]:
        """Global sample indices ``[C, S, B]`` and float mask for cohort ``clients`` this round."""
        clients = clients.to(self.device, torch.int64)
        sizes = self._sizes[clients]
        pos, mask = client_batches(sizes, steps, epochs, batch_size, generator)
        return self.ranges.gather(clients, pos), mask


def _test_parts(test_groups: np.ndarray, group_ids: np.ndarray) -> list[np.ndarray]:
    order = np.argsort(test_groups, kind="stable")
    sorted_g = test_groups[order]
    lo = np.searchsorted(sorted_g, group_ids, "left")
    hi = np.searchsorted(sorted_g, group_ids, "right")
    return [order[a:b].astype(np.int64) for a, b in zip(lo, hi, strict=True)]


def _own_tests(splits: DatasetSplits, parts: list[np.ndarray], rng: np.random.Generator
               ) -> tuple[list[np.ndarray], list[str] | None]:
    """Clients' own test samples (and names): their natural group's when each client is one
    group (``flwr:natural_id``), else drawn with the client's training label mix."""
    groups, test_groups = splits.train_groups, splits.test_groups
    if groups is not None and test_groups is not None:
        owners = [np.unique(np.asarray(groups)[p]) for p in parts]
        if owners and all(len(o) == 1 for o in owners):
            ids = np.array([o[0] for o in owners])
            names = splits.group_names
            return (_test_parts(np.asarray(test_groups), ids),
                    None if names is None else [names[g] for g in ids.tolist()])
    test_labels = splits.test_y.cpu().numpy()
    return label_matched_tests(splits.train_y.cpu().numpy(), parts, test_labels, rng), None


def build_federated_dataset(
    splits: DatasetSplits,
    partition: str,
    num_clients: int | None,
    seed: int,
    **partition_kw: object,
) -> FederatedDataset:
    """Split ``splits.train_*`` over clients with partitioner ``partition`` (seeded).

    ``natural`` uses the dataset's own groups (writers, roles, devices): ``num_clients=None``
    keeps all groups, an int keeps the first n (sorted ids), and each client also gets its own
    test samples in ``client_test_indices``. Other partitioners need ``num_clients``.
    """
    rng = np.random.default_rng(seed)
    labels = splits.train_y.cpu().numpy()
    test_parts, names = None, None
    if partition == "natural":
        if splits.train_groups is None:
            raise ValueError(
                f"dataset {splits.name!r} has no natural clients; use iid, dirichlet, shards or "
                "quantity_skew"
            )
        parts = run_partitioner(
            "natural", labels, num_clients, rng, groups=splits.train_groups, **partition_kw
        )
        group_ids = np.unique(splits.train_groups)[: len(parts)]
        if splits.group_names is not None:
            names = [splits.group_names[g] for g in group_ids.tolist()]
        if splits.test_groups is not None:
            test_parts = _test_parts(np.asarray(splits.test_groups), group_ids)
    else:
        parts = run_partitioner(partition, labels, num_clients, rng,
                                groups=splits.train_groups, **partition_kw)
        if getattr(splits, "client_tests", False):  # e.g. the huggingface dataset
            test_parts, names = _own_tests(splits, parts, rng)
    empty = [i for i, p in enumerate(parts) if len(p) == 0]
    if empty:  # e.g. per-class Dirichlet at alpha 0.01: sampled, but no local work, weight 0
        warnings.warn(
            f"partition {partition!r}: {len(empty)} of {len(parts)} clients have no training "
            f"samples (ids {empty[:10]}{' ...' if len(empty) > 10 else ''}); they take no local "
            "steps and get aggregation weight 0",
            stacklevel=2,
        )
    return FederatedDataset(
        train_x=splits.train_x,
        train_y=splits.train_y,
        test_x=splits.test_x,
        test_y=splits.test_y,
        client_indices=[torch.from_numpy(p) for p in parts],  # rounds gather by ranges
        client_test_indices=None
        if test_parts is None
        else [torch.from_numpy(p) for p in test_parts],
        num_classes=splits.num_classes,
        input_shape=tuple(splits.input_shape),
        name=splits.name,
        vocab_size=splits.vocab_size,
        client_names=names,
    )
