"""``load_dataset``: one entry point from a dataset name to in-memory :class:`DatasetSplits`.

File datasets are read from ``root`` (the folder holding ``mnist/``, ``cifar10/`` ...), which
defaults to ``$FEDFORGE_DATA``; ``synthetic`` needs no files at all.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable
from pathlib import Path

from fedforge.data.base import DatasetError, DatasetSplits
from fedforge.data.images import load_cifar10, load_fashion_mnist, load_femnist, load_mnist
from fedforge.data.synthetic import make_synthetic
from fedforge.data.text import load_shakespeare, load_sst2

DATASETS: dict[str, str] = {
    "mnist": "MNIST digits, 60k/10k 1x28x28 images, 10 classes (no natural clients)",
    "fashion_mnist": "Fashion-MNIST clothing, 60k/10k 1x28x28 images, 10 classes",
    "cifar10": "CIFAR-10, 50k/10k 3x32x32 RGB images, 10 classes (slow: ~10 s to decompress)",
    "femnist": "LEAF FEMNIST subset, 41k/4.7k 1x28x28 characters, 62 classes, 300 writers",
    "shakespeare": "LEAF Shakespeare next-char prediction, 80-char windows, 715 roles",
    "sst2": "GLUE SST-2 sentiment, 67k train / 872 dev sentences, 2 classes, token ids",
    "synthetic": "FedProx Synthetic(alpha, beta) logistic data, 60 features, 10 classes, no files",
}

_LOADERS: dict[str, Callable[..., DatasetSplits]] = {
    "mnist": load_mnist,
    "fashion_mnist": load_fashion_mnist,
    "cifar10": load_cifar10,
    "femnist": load_femnist,
    "shakespeare": load_shakespeare,
    "sst2": load_sst2,
}
_ALIASES = {"fmnist": "fashion_mnist", "fashion-mnist": "fashion_mnist", "cifar-10": "cifar10"}


def default_data_root() -> Path | None:
    """``$FEDFORGE_DATA`` if set (and non-empty), else ``None``."""
    value = os.environ.get("FEDFORGE_DATA")
    return Path(value).expanduser() if value else None


def dataset_options(name: str) -> dict[str, object]:
    """The options ``load_dataset(name, ...)`` accepts, with their defaults."""
    fn = make_synthetic if _canonical(name) == "synthetic" else _LOADERS[_canonical(name)]
    params = inspect.signature(fn).parameters
    return {k: p.default for k, p in params.items() if k != "root"}


def _canonical(name: str) -> str:
    key = _ALIASES.get(name.lower(), name.lower())
    if key not in DATASETS:
        raise ValueError(f"unknown dataset {name!r}; known: {', '.join(DATASETS)}")
    return key


def load_dataset(name: str, root: str | Path | None = None, **options: object) -> DatasetSplits:
    """Load dataset ``name`` fully into memory (CPU tensors).

    ``root`` is the folder holding the dataset folders, or the dataset folder itself; ``None``
    means ``$FEDFORGE_DATA``. ``options`` go to the dataset's loader (see
    :func:`dataset_options`), e.g. ``normalize=False``, ``max_samples_per_client=500`` or
    ``alpha=0.5``. Raises :class:`DatasetError` for missing or malformed files.
    """
    key = _canonical(name)
    accepted = dataset_options(key)
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        raise ValueError(
            f"load_dataset({key!r}): unknown option(s) {unknown}; accepted: {sorted(accepted)}"
        )
    if key == "synthetic":
        return make_synthetic(**options)  # type: ignore[arg-type]
    if root is None:
        root = default_data_root()
    if root is None:
        raise DatasetError(
            f"no data root for {key!r}: pass root=<folder holding {key}/> or set $FEDFORGE_DATA"
        )
    return _LOADERS[key](root, **options)
