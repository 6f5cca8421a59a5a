"""A dataset from CSV files as a fedforge plugin; docs/extending.md walks through it.

``blobs_csv/train.csv`` and ``blobs_csv/test.csv`` under the data root hold one sample per
row: the integer label first, then the features (a header line names the columns). The
shipped copy is in ``examples/plugins/data``:

    fedforge run examples/plugins/blobs_dirichlet.toml \\
        --plugin examples/plugins/csv_dataset_plugin.py \\
        --data-root examples/plugins/data --out runs/blobs
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

import fedforge
from fedforge.data import DatasetError, DatasetSplits


def _read(path: Path) -> tuple[torch.Tensor, torch.Tensor]:
    try:
        table = np.loadtxt(path, delimiter=",", skiprows=1, ndmin=2)
    except ValueError as exc:  # a non-numeric cell: name the file
        raise DatasetError(f"{path}: not a numeric CSV ({exc})") from None
    labels = table[:, 0]
    if not np.array_equal(labels, labels.round()) or labels.min() < 0:
        raise DatasetError(f"{path}: the first column must hold integer labels >= 0")
    return torch.tensor(table[:, 1:], dtype=torch.float32), torch.tensor(labels).long()


def load_blobs_csv(root: Path, standardize: bool = True) -> DatasetSplits:
    """``root`` is the data root fedforge resolved; the files are checked before this runs."""
    train_x, train_y = _read(root / "blobs_csv" / "train.csv")
    test_x, test_y = _read(root / "blobs_csv" / "test.csv")
    if standardize:  # with the training set's statistics only
        mean, std = train_x.mean(0), train_x.std(0).clamp_min(1e-6)
        train_x, test_x = (train_x - mean) / std, (test_x - mean) / std
    return DatasetSplits(
        name="blobs_csv", train_x=train_x, train_y=train_y, test_x=test_x, test_y=test_y,
        num_classes=int(train_y.max()) + 1, input_shape=(train_x.shape[1],),
        train_groups=None, test_groups=None,  # no natural clients: a partition splits it
    )


fedforge.register_dataset(
    "blobs_csv", load_blobs_csv, "three Gaussian blobs in 4-d, 300/90 rows (CSV example)",
    folder="blobs_csv", files=("train.csv", "test.csv"),
    source="examples/plugins/data/blobs_csv from the fedforge repository")
