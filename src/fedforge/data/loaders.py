"""``load_dataset``: one entry point from a dataset name to in-memory :class:`DatasetSplits`.

The dataset registry lives here, once: each name maps to a :class:`DatasetEntry` (loader,
description, the folder and files it reads and where to get them). Users add entries with
``fedforge.register_dataset`` (:mod:`fedforge.plugins`). A loader that takes a ``root``
parameter reads files and is given the data root resolved by :mod:`fedforge.data.root`;
one without it (``synthetic``) needs no files.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from fedforge.data.base import DatasetError, DatasetSplits
from fedforge.data.huggingface import load_huggingface
from fedforge.data.images import (
    FEMNIST_FILE,
    load_cifar10,
    load_fashion_mnist,
    load_femnist,
    load_mnist,
)
from fedforge.data.next_token import load_shakespeare_lm
from fedforge.data.population import PopulationDataset, make_population
from fedforge.data.root import ENV_VAR, DataRoot, describe_root, resolve_data_root, resolved
from fedforge.data.subsets import pop_subset_options, select_train
from fedforge.data.synthetic import make_synthetic
from fedforge.data.text import load_shakespeare, load_sst2


@dataclass(frozen=True)
class DatasetEntry:
    """A registered dataset. ``folder``/``files``/``source`` say what a missing one needs."""

    loader: Callable[..., DatasetSplits]
    description: str
    folder: str | None = None  # the dataset's folder under the data root; None: no files
    files: tuple[str, ...] = ()  # files expected in that folder (checked before loading)
    source: str = ""  # how to get the files, shown when they are missing
    population: bool = False  # clients generated when drawn: load_population, not load_dataset

    @property
    def reads_files(self) -> bool:
        return "root" in inspect.signature(self.loader).parameters


_IDX = ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz",
        "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz")
_REGISTRY: dict[str, DatasetEntry] = {
    "mnist": DatasetEntry(
        load_mnist, "MNIST digits, 60k/10k 1x28x28 images, 10 classes (no natural clients)",
        "mnist", _IDX, "the four original MNIST IDX .gz files (as torchvision downloads them)"),
    "fashion_mnist": DatasetEntry(
        load_fashion_mnist, "Fashion-MNIST clothing, 60k/10k 1x28x28 images, 10 classes",
        "fashion_mnist", _IDX, "the four Fashion-MNIST IDX .gz files from Zalando Research "
        "(or apt-get install dataset-fashion-mnist)"),
    "cifar10": DatasetEntry(
        load_cifar10,
        "CIFAR-10, 50k/10k 3x32x32 RGB images, 10 classes (~10 s to decompress once, then cached)",
        "cifar10", ("train_images.npy.xz", "train_labels.npy", "test_images.npy.xz",
                    "test_labels.npy"),
        "CIFAR-10 as xz-compressed .npy arrays (uint8 NHWC images, int labels)"),
    "femnist": DatasetEntry(
        load_femnist, "LEAF FEMNIST subset, 41k/4.7k 1x28x28 characters, 62 classes, 300 writers",
        "femnist", (FEMNIST_FILE,), "a LEAF FEMNIST export by writer as one .npz"),
    "shakespeare": DatasetEntry(
        load_shakespeare, "LEAF Shakespeare next-char prediction, 80-char windows, 715 roles",
        "shakespeare", ("shakespeare_train.json.gz", "shakespeare_test.json.gz"),
        "the TFF/LEAF Shakespeare split by speaking role as gzipped JSON"),
    "shakespeare_lm": DatasetEntry(
        load_shakespeare_lm, "LEAF Shakespeare by role for next-token fine-tuning: each role's "
        "text in the model's own tokens (data.options.tokenizer), perplexity per role",
        "shakespeare", ("shakespeare_train.json.gz", "shakespeare_test.json.gz"),
        "the TFF/LEAF Shakespeare split by speaking role as gzipped JSON"),
    "sst2": DatasetEntry(
        load_sst2, "GLUE SST-2 sentiment, 67k train / 872 dev sentences, 2 classes, token ids",
        "sst2", ("train.tsv.gz", "dev.tsv.gz"), "the GLUE SST-2 train.tsv and dev.tsv, gzipped"),
    "synthetic": DatasetEntry(
        make_synthetic,
        "FedProx Synthetic(alpha, beta) logistic data, 60 features, 10 classes, no files"),
    "synthetic_population": DatasetEntry(
        make_population,  # type: ignore[arg-type]
        "Synthetic(alpha, beta) generated per client when drawn: up to 10^6 clients and more, "
        "no files", population=True),
    "huggingface": DatasetEntry(
        load_huggingface, "your local Hugging Face dataset (Arrow, Parquet, CSV, JSON lines, "
        "image folder; a text column in the model's tokens) at data.options.path (the "
        "huggingface extra)"),
}
_ALIASES = {"fmnist": "fashion_mnist", "fashion-mnist": "fashion_mnist", "cifar-10": "cifar10"}


class _View(Mapping):
    """A read-only view of one field of the registry (so there is one registry, no copies)."""

    def __init__(self, attr: str) -> None:
        self._attr = attr

    def __getitem__(self, name: str):
        return getattr(_REGISTRY[name], self._attr)

    def __iter__(self) -> Iterator[str]:
        return iter(_REGISTRY)

    def __len__(self) -> int:
        return len(_REGISTRY)

    def __repr__(self) -> str:
        return repr(dict(self))


DATASETS: Mapping[str, str] = _View("description")
"""name -> one-line description of every registered dataset (``fedforge datasets``)."""
_LOADERS: Mapping[str, Callable[..., DatasetSplits]] = _View("loader")


def default_data_root() -> Path | None:
    """``$FEDFORGE_DATA`` if set (and non-empty), else ``None`` (see :mod:`fedforge.data.root`
    for the whole resolution order)."""
    root = resolve_data_root()
    return root.path if root.source == f"${ENV_VAR}" else None


def dataset_options(name: str) -> dict[str, object]:
    """The options ``load_dataset(name, ...)`` accepts, with their defaults."""
    params = inspect.signature(_REGISTRY[_canonical(name)].loader).parameters
    subset = inspect.signature(select_train).parameters  # every dataset: fixed subsets
    return {k: p.default for k, p in [*params.items(), *subset.items()]
            if k not in ("root", "splits")}


def _canonical(name: str) -> str:
    key = _ALIASES.get(name.lower(), name.lower())
    if key not in _REGISTRY:
        raise ValueError(f"unknown dataset {name!r}; known: {', '.join(_REGISTRY)}")
    return key


def check_files(name: str, root: DataRoot) -> None:
    """One line naming the files looked for, where, and how to get them, if any is missing."""
    entry = _REGISTRY[_canonical(name)]
    if entry.folder is None:
        return
    base = root.path
    inside = base.name == entry.folder or any((base / f).is_file() for f in entry.files[:1])
    folder = base if inside and not (base / entry.folder).is_dir() else base / entry.folder
    missing = [f for f in entry.files if not (folder / f).is_file()]
    if folder.is_dir() and not missing:
        return
    if not folder.is_dir():
        what = f"{resolved(folder)}/ not found"
    else:
        more = f" (and {', '.join(missing[1:])})" if len(missing) > 1 else ""
        what = f"{resolved(folder) / missing[0]}: file not found{more}"
    get = f"get {entry.source}" if entry.source else "get its files"
    raise DatasetError(
        f"dataset {name!r}: {what} (data root {describe_root(root)}); "
        f"looked for {', '.join(entry.files) or 'its files'}; {get} into that folder, or point "
        f"--data-root, data.root or ${ENV_VAR} at the folder holding {entry.folder}/ "
        "(README.md: Where your data lives)")


def is_population(name: str) -> bool:
    """Whether dataset ``name`` generates its clients when drawn (:func:`load_population`)."""
    return _REGISTRY[_canonical(name)].population


def load_population(name: str, options: Mapping[str, object] | None = None,
                    num_clients: int | None = None) -> PopulationDataset:
    """The population dataset ``name`` with loader ``options`` (``num_clients``, when given,
    replaces the option of that name: the first n clients, the same clients whatever n)."""
    key = _canonical(name)
    options = dict(options or {})
    entry = _REGISTRY[key]
    if not entry.population:
        raise ValueError(f"dataset {key!r} holds every client's data; use load_dataset")
    params = inspect.signature(entry.loader).parameters
    unknown = sorted(set(options) - set(params))
    if unknown:
        raise ValueError(f"data.options: dataset {key!r} does not take {unknown}; accepted: "
                         f"{sorted(params)}")
    if num_clients is not None:
        options = {**options, "num_clients": num_clients}
    data = entry.loader(**options)
    data.name = key
    return data


def load_dataset(name: str, root: str | Path | None = None, **options: object) -> DatasetSplits:
    """Load dataset ``name`` fully into memory (CPU tensors).

    ``root`` is the folder holding the dataset folders, or the dataset folder itself; ``None``
    resolves it as :mod:`fedforge.data.root` says (``--data-root``, ``$FEDFORGE_DATA``,
    ``./data``). ``options`` go to the dataset's loader (see
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
    entry = _REGISTRY[key]
    if entry.population:
        raise ValueError(f"dataset {key!r} generates its clients when they are drawn; use "
                         "load_population")
    options, subset = pop_subset_options(options)
    if not entry.reads_files:
        return select_train(entry.loader(**options), **subset)
    where = resolve_data_root(root)
    check_files(key, where)
    return select_train(entry.loader(where.path, **options), **subset)
