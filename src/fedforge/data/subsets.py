"""Fixed subsets of a training split, as ``data.options`` every dataset accepts.

* ``train_part = "public" | "private"`` splits the training set in two disjoint parts by a
  fixed permutation (seed 0, independent of the run's seed): ``"public"`` is the first
  ``public_fraction`` of it, ``"private"`` the rest. ``fedforge pretrain`` trains centrally on
  the public part and the federated run fine-tunes on the private part, so the two never share
  a sample (SAFL's fine-tuning regime).
* ``max_train = n`` keeps the first ``n`` samples of a second fixed permutation (after
  ``train_part``): a documented, reproducible shrink of a dataset for CPU-scale runs.

The test split is never touched. Natural client ids follow their samples.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Literal

import torch

from fedforge.data.base import DatasetSplits

SUBSET_OPTIONS = ("train_part", "public_fraction", "max_train")
_SEED = 0  # fixed: pretraining and the federated run must draw the same halves


def _permutation(n: int, stream: int) -> torch.Tensor:
    return torch.randperm(n, generator=torch.Generator().manual_seed(_SEED + stream))


def select_train(
    splits: DatasetSplits,
    train_part: Literal["public", "private"] | None = None,
    public_fraction: float = 0.5,
    max_train: int | None = None,
) -> DatasetSplits:
    """The training samples ``train_part`` and ``max_train`` select (see the module doc)."""
    n = int(splits.train_y.shape[0])
    idx = torch.arange(n)
    if train_part is not None:
        if train_part not in ("public", "private"):
            raise ValueError(f"data.options.train_part: expected 'public' or 'private', got "
                             f"{train_part!r}")
        if not 0.0 < public_fraction < 1.0:
            raise ValueError(f"data.options.public_fraction: expected a number in (0, 1), got "
                             f"{public_fraction!r}")
        perm, cut = _permutation(n, 0), int(round(public_fraction * n))
        idx = perm[:cut] if train_part == "public" else perm[cut:]
        idx = idx.sort().values
    if max_train is not None:
        if int(max_train) < 1:
            raise ValueError(f"data.options.max_train: expected an int >= 1, got {max_train!r}")
        keep = _permutation(idx.numel(), 1)[: int(max_train)]
        idx = idx[keep.sort().values]
    if idx.numel() == n:
        return splits
    groups = splits.train_groups
    return replace(splits, train_x=splits.train_x[idx], train_y=splits.train_y[idx],
                   train_groups=None if groups is None else groups[idx.numpy()])


def pop_subset_options(options: dict) -> tuple[dict, dict]:
    """``options`` -> (the loader's own options, the subset options)."""
    own = {k: v for k, v in options.items() if k not in SUBSET_OPTIONS}
    return own, {k: v for k, v in options.items() if k in SUBSET_OPTIONS}
