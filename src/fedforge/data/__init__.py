"""Datasets, partitioners and federated views for fedforge.

``load_dataset(name)`` gives whole train/test tensors, ``partition``/``PARTITIONERS`` split them
over clients, and ``build_federated_dataset`` combines both into a :class:`FederatedDataset`
whose client index ranges let a round gather all clients' minibatches in one indexing op.
``load_population(name)`` gives a population whose clients are generated when drawn
(:mod:`fedforge.data.population`).
"""

from fedforge.data.base import DatasetError, DatasetSplits
from fedforge.data.batching import client_batches
from fedforge.data.federated import (
    FederatedDataset,
    build_federated_dataset,
    build_index_table,
    gather_round_indices,
)
from fedforge.data.loaders import DATASETS, dataset_options, default_data_root, load_dataset
from fedforge.data.partition import (
    PARTITIONERS,
    dirichlet_label,
    iid,
    natural,
    partition,
    quantity_skew,
    shards,
)
from fedforge.data.synthetic import make_synthetic
from fedforge.data.text import LEAF_CHARS, decode_chars, encode_chars, tokenize

__all__ = [
    "DATASETS",
    "LEAF_CHARS",
    "PARTITIONERS",
    "DatasetError",
    "DatasetSplits",
    "FederatedDataset",
    "build_federated_dataset",
    "build_index_table",
    "client_batches",
    "dataset_options",
    "decode_chars",
    "default_data_root",
    "dirichlet_label",
    "encode_chars",
    "gather_round_indices",
    "iid",
    "load_dataset",
    "make_synthetic",
    "natural",
    "partition",
    "quantity_skew",
    "shards",
    "tokenize",
]
