"""Each client's own held-out data, for evaluating personalised models.

Personalised FL evaluates client i's model on client i's data. Datasets whose clients are
natural writers with a test split of their own (FEMNIST, Shakespeare) use it; any other
partition holds out ``fraction`` of each client's training samples (a seeded shuffle per
client, ``floor(fraction * n_i)`` samples; PFLlib and FL-bench hold out 25 %). The held-out
clients (``eval.held_out``, the highest ids), which the run never draws to train, are evaluated
the same way after fine-tuning on their own training samples.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from fedforge.data.federated import FederatedDataset, build_index_table
from fedforge.data.population import check_held_out


@dataclass
class ClientTests:
    """Per-client test data and the training samples evaluation-time fine-tuning uses."""

    x: Tensor  # the samples ``indices`` point into (the test split, or the training set)
    y: Tensor
    indices: list[Tensor]  # client i's test samples
    train_table: Tensor  # [N, max n_i] each client's training samples (into train_x), padded
    train_sizes: Tensor  # [N] int64, held-out clients included
    held_out: Tensor  # int64 ids of the clients that never train (the highest)

    @property
    def num_clients(self) -> int:
        return len(self.indices)

    def test_sizes(self) -> Tensor:
        return torch.tensor([len(i) for i in self.indices], dtype=torch.int64)


def _hold_out(parts: list[Tensor], fraction: float, seed: int) -> tuple[list, list]:
    rng = np.random.default_rng([seed, 0x9F1])  # its own stream: the partition is untouched
    train, test = [], []
    for p in parts:
        order = torch.from_numpy(rng.permutation(len(p))).to(p.device)
        n_test = int(np.floor(fraction * len(p)))
        test.append(p[order[:n_test]].sort().values)
        train.append(p[order[n_test:]].sort().values)
    return train, test


def client_split(data: FederatedDataset, fraction: float, seed: int, held_out: int = 0,
                 natural: bool = False) -> tuple[FederatedDataset, ClientTests]:
    """``data`` with each client's test samples removed from training, and the clients' test
    data; the ``held_out`` highest ids are the clients that never train (the run does not
    draw them; they keep their training samples for fine-tuning). ``natural``: the
    dataset's own per-client test split is used where it has one."""
    if not 0.0 <= fraction < 1.0:
        raise ValueError(f"data.client_test_fraction: expected a value in [0, 1), got {fraction}")
    check_held_out(held_out, data.num_clients)
    if natural and data.client_test_indices is not None:
        train, test = list(data.client_indices), list(data.client_test_indices)
        x, y = data.test_x, data.test_y
    else:
        train, test = _hold_out(list(data.client_indices), fraction, seed)
        x, y = data.train_x, data.train_y
    device = data.train_x.device
    table = build_index_table(train, device)
    sizes = torch.tensor([len(t) for t in train], dtype=torch.int64)
    ids = torch.arange(data.num_clients - held_out, data.num_clients, dtype=torch.int64)
    stale = {f.name: None for f in dataclasses.fields(data) if f.init and f.name == "index_table"}
    split = dataclasses.replace(data, client_indices=train, **stale)  # index table rebuilt
    return split, ClientTests(x, y, test, table, sizes, ids)
