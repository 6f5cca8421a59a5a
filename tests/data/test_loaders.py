"""Real datasets load with the documented shapes, dtypes, label ranges and client groups."""

from __future__ import annotations

import gzip
import hashlib
import json

import numpy as np
import pytest
import torch

from fedforge.data import DATASETS, dataset_options, decode_chars, default_data_root, load_dataset
from fedforge.data.images import load_cifar_split


def _check_common(s, n_train, n_test, num_classes, input_shape, x_dtype):
    assert s.train_x.shape == (n_train, *input_shape)
    assert s.test_x.shape == (n_test, *input_shape)
    assert s.train_y.shape == (n_train,) and s.test_y.shape == (n_test,)
    assert s.train_x.dtype == x_dtype and s.test_x.dtype == x_dtype
    assert s.train_y.dtype == torch.int64 and s.test_y.dtype == torch.int64
    assert s.num_classes == num_classes and s.input_shape == input_shape
    for y in (s.train_y, s.test_y):
        assert 0 <= int(y.min()) and int(y.max()) < num_classes


@pytest.mark.parametrize("name", ["mnist", "fashion_mnist"])
def test_idx_datasets(shared_data, name):
    s = load_dataset(name, shared_data)
    _check_common(s, 60000, 10000, 10, (1, 28, 28), torch.float32)
    assert s.train_groups is None and s.test_groups is None and s.vocab_size is None
    assert abs(float(s.train_x.mean())) < 0.01 and abs(float(s.train_x.std()) - 1) < 0.01
    assert torch.bincount(s.train_y).min() > 5000


def test_idx_unnormalised(shared_data):
    s = load_dataset("mnist", shared_data, normalize=False)
    assert float(s.train_x.min()) == 0.0 and float(s.train_x.max()) == 1.0
    assert abs(float(s.train_x.mean()) - 0.1307) < 1e-3


def test_femnist(shared_data):
    s = load_dataset("femnist", shared_data)
    _check_common(s, 41224, 4733, 62, (1, 28, 28), torch.float32)
    assert len(np.unique(s.train_y)) == 62
    assert s.train_groups.shape == (41224,) and s.test_groups.shape == (4733,)
    assert len(np.unique(s.train_groups)) == 300 and len(np.unique(s.test_groups)) == 300
    assert len(s.group_names) == 300
    # inverted to MNIST polarity: background (most pixels) is the minimum value
    raw = load_dataset("femnist", shared_data, normalize=False)
    assert float(raw.train_x.median()) == 0.0


def test_shakespeare(shared_data):
    s = load_dataset("shakespeare", shared_data)
    n_tr, n_te = s.train_y.shape[0], s.test_y.shape[0]
    _check_common(s, n_tr, n_te, 81, (80,), torch.int64)
    assert s.vocab_size == 81 and int(s.train_x.max()) < 81
    assert np.bincount(s.train_groups).max() <= 200 and np.bincount(s.test_groups).max() <= 50
    assert 500 < len(np.unique(s.train_groups)) <= 715 and len(s.group_names) == 715
    assert n_tr > 100_000
    # a window plus its target is a substring of its role's joined text
    with gzip.open(shared_data / "shakespeare" / "shakespeare_train.json.gz", "rt") as f:
        roles = json.load(f)
    for i in (0, 777, n_tr - 1):
        text = " ".join(roles[s.group_names[s.train_groups[i]]])
        window = decode_chars(s.train_x[i].tolist()) + decode_chars([int(s.train_y[i])])
        assert window in text


def test_shakespeare_options(shared_data):
    s = load_dataset(
        "shakespeare",
        shared_data / "shakespeare",
        seq_len=20,
        max_samples_per_client=5,
        max_test_samples_per_client=2,
        stride=3,
    )
    assert s.train_x.shape[1] == 20 and s.input_shape == (20,)
    assert np.bincount(s.train_groups).max() == 5 and np.bincount(s.test_groups).max() == 2


def test_sst2(shared_data):
    s = load_dataset("sst2", shared_data)
    _check_common(s, 67349, 872, 2, (64,), torch.int64)
    assert s.vocab_size == 10000 and int(s.train_x.max()) < 10000
    assert torch.bincount(s.train_y).tolist() == [29780, 37569]
    assert torch.bincount(s.test_y).tolist() == [428, 444]
    assert (s.train_x[:, 0] > 0).all()  # every sentence has a first token
    assert (s.train_x[:, -1] == 0).float().mean() > 0.9  # most are padded at the end
    small = load_dataset("sst2", shared_data, vocab_size=500, max_len=16)
    assert small.train_x.shape == (67349, 16) and int(small.train_x.max()) < 500
    assert (small.train_x == 1).any()  # rare words map to unk


def test_cifar10_test_split_is_lossless(shared_data):
    """Decoding reproduces the README's sha256 of the original (PNG-decoded) test pixels."""
    x, y = load_cifar_split(shared_data / "cifar10", "test")
    assert x.shape == (10000, 3, 32, 32) and x.dtype == np.uint8 and y.shape == (10000,)
    digest = hashlib.sha256(np.ascontiguousarray(x.transpose(0, 2, 3, 1)).tobytes()).hexdigest()
    assert digest == "52a9dc125982c0440d5eed87474b2f521e96c45a98df08e4329aa42c692b9d9d"


def test_cifar10(shared_data):  # ~10-15 s: decompressing 85 MB of xz
    s = load_dataset("cifar10", shared_data)
    _check_common(s, 50000, 10000, 10, (3, 32, 32), torch.float32)
    assert torch.bincount(s.train_y).tolist() == [5000] * 10
    mean = s.train_x.mean(dim=(0, 2, 3))
    assert torch.allclose(mean, torch.zeros(3), atol=2e-3)


def test_registry_and_root(shared_data, monkeypatch):
    assert set(DATASETS) >= {  # >=: plugins loaded by earlier tests may have added more
        "mnist",
        "fashion_mnist",
        "cifar10",
        "femnist",
        "shakespeare",
        "sst2",
        "synthetic",
        "huggingface",
    }
    assert all(isinstance(v, str) and v for v in DATASETS.values())
    assert "max_samples_per_client" in dataset_options("shakespeare")
    monkeypatch.delenv("FEDFORGE_DATA", raising=False)
    assert default_data_root() is None
    monkeypatch.setenv("FEDFORGE_DATA", str(shared_data))
    assert default_data_root() == shared_data
    s = load_dataset("femnist")  # root from $FEDFORGE_DATA
    assert s.num_classes == 62
    direct = load_dataset("femnist", shared_data / "femnist")  # root = the dataset folder itself
    assert torch.equal(direct.train_y, s.train_y)


def test_unknown_name_and_option(tmp_path):
    with pytest.raises(ValueError, match="unknown dataset"):
        load_dataset("imagenet", tmp_path)
    with pytest.raises(ValueError, match="unknown option"):
        load_dataset("mnist", tmp_path, alpha=0.1)
