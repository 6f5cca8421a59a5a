"""Missing, truncated and corrupt files raise DatasetError naming the file and the expectation."""

from __future__ import annotations

import gzip
import re
import struct
from pathlib import Path

import numpy as np
import pytest

from fedforge.data import DatasetError, load_dataset
from fedforge.data.images import read_idx

IDX_FILES = [
    "train-images-idx3-ubyte.gz",
    "train-labels-idx1-ubyte.gz",
    "t10k-images-idx3-ubyte.gz",
    "t10k-labels-idx1-ubyte.gz",
]


def _mirror(src: Path, dst: Path, skip: tuple[str, ...] = ()) -> Path:
    """Symlink every file of ``src`` into ``dst`` except ``skip`` (to be written by the test)."""
    dst.mkdir(parents=True)
    for f in src.iterdir():
        if f.name not in skip:
            (dst / f.name).symlink_to(f)
    return dst


def _raises_naming(path: Path, *patterns: str):
    """pytest.raises(DatasetError) whose message contains ``path`` and every pattern."""
    return pytest.raises(
        DatasetError, match=re.escape(str(path)) + "".join(f"(?=.*{p})" for p in patterns)
    )


def test_missing_directory(tmp_path):
    with _raises_naming(tmp_path / "mnist", "not found"):
        load_dataset("mnist", tmp_path)


def test_no_root(monkeypatch, tmp_path):
    monkeypatch.delenv("FEDFORGE_DATA", raising=False)
    monkeypatch.setattr("fedforge.data.root.DEFAULT_ROOTS", (tmp_path / "data",))
    with pytest.raises(DatasetError, match="FEDFORGE_DATA"):
        load_dataset("mnist")


def test_missing_file(shared_data, tmp_path):
    d = _mirror(shared_data / "mnist", tmp_path / "mnist", skip=("t10k-labels-idx1-ubyte.gz",))
    with _raises_naming(d / "t10k-labels-idx1-ubyte.gz", "file not found"):
        load_dataset("mnist", tmp_path)


def test_truncated_gzip(shared_data, tmp_path):
    src = shared_data / "mnist" / "train-images-idx3-ubyte.gz"
    d = _mirror(shared_data / "mnist", tmp_path / "mnist", skip=(src.name,))
    (d / src.name).write_bytes(src.read_bytes()[:1000])
    with _raises_naming(d / src.name, "truncated or corrupt gzip"):
        load_dataset("mnist", tmp_path)


def test_truncated_idx_payload(shared_data, tmp_path):
    src = shared_data / "mnist" / "train-images-idx3-ubyte.gz"
    d = _mirror(shared_data / "mnist", tmp_path / "mnist", skip=(src.name,))
    with gzip.open(src) as f:
        head = f.read(1000)
    (d / src.name).write_bytes(gzip.compress(head))
    with _raises_naming(d / src.name, "truncated IDX file", "47040016", "got 1000"):
        load_dataset("mnist", tmp_path)


def test_bad_magic_and_label_range(tmp_path):
    path = tmp_path / "labels.gz"
    path.write_bytes(gzip.compress(struct.pack(">II", 2051, 3) + bytes([1, 2, 3])))
    with _raises_naming(path, "magic number", "2049"):
        read_idx(path, (None,))
    d = tmp_path / "mnist"
    d.mkdir()
    images = struct.pack(">IIII", 2051, 2, 28, 28) + bytes(2 * 784)
    labels = struct.pack(">II", 2049, 2) + bytes([3, 10])
    for split in ("train", "t10k"):
        (d / f"{split}-images-idx3-ubyte.gz").write_bytes(gzip.compress(images))
        (d / f"{split}-labels-idx1-ubyte.gz").write_bytes(gzip.compress(labels))
    with _raises_naming(d / "train-labels-idx1-ubyte.gz", "out of range", "0..9"):
        load_dataset("mnist", tmp_path)


def test_wrong_image_shape(tmp_path):
    path = tmp_path / "images.gz"
    path.write_bytes(gzip.compress(struct.pack(">IIII", 2051, 1, 32, 32) + bytes(1024)))
    with _raises_naming(path, "shape"):
        read_idx(path, (None, 28, 28))


def test_truncated_cifar_xz(shared_data, tmp_path):
    src = shared_data / "cifar10" / "train_images.npy.xz"
    d = _mirror(shared_data / "cifar10", tmp_path / "cifar10", skip=(src.name,))
    (d / src.name).write_bytes(src.read_bytes()[:1000])
    with _raises_naming(d / src.name, "xz"):
        load_dataset("cifar10", tmp_path)


def test_truncated_femnist_npz(shared_data, tmp_path):
    src = shared_data / "femnist" / "femnist_leaf_subset.npz"
    d = _mirror(shared_data / "femnist", tmp_path / "femnist", skip=(src.name,))
    (d / src.name).write_bytes(src.read_bytes()[:100_000])
    with _raises_naming(d / src.name, "npz"):
        load_dataset("femnist", tmp_path)


def test_femnist_wrong_keys_and_labels(tmp_path):
    d = tmp_path / "femnist"
    d.mkdir()
    path = d / "femnist_leaf_subset.npz"
    np.savez(path, x_train=np.zeros((2, 28, 28), np.uint8))
    with _raises_naming(path, "missing arrays"):
        load_dataset("femnist", tmp_path)
    x = np.zeros((2, 28, 28), np.uint8)
    w = np.zeros(2, np.int32)
    np.savez(
        path,
        x_train=x,
        y_train=np.array([0, 62]),
        writer_train=w,
        x_test=x,
        y_test=np.array([0, 1]),
        writer_test=w,
        writers=np.array(["a"]),
    )
    with _raises_naming(path, "out of range", "0..61"):
        load_dataset("femnist", tmp_path)


def test_truncated_shakespeare(shared_data, tmp_path):
    src = shared_data / "shakespeare" / "shakespeare_train.json.gz"
    d = _mirror(shared_data / "shakespeare", tmp_path / "shakespeare", skip=(src.name,))
    (d / src.name).write_bytes(src.read_bytes()[:5000])
    with _raises_naming(d / src.name, "gzip"):
        load_dataset("shakespeare", tmp_path)
    (d / src.name).write_bytes(gzip.compress(b'{"ROLE": ["to be", '))
    with _raises_naming(d / src.name, "invalid JSON"):
        load_dataset("shakespeare", tmp_path)


def test_sst2_bad_rows(shared_data, tmp_path):
    d = _mirror(shared_data / "sst2", tmp_path / "sst2", skip=("dev.tsv.gz",))
    (d / "dev.tsv.gz").write_bytes(gzip.compress(b"sentence\tlabel\ngood film \t1\nbad \t7\n"))
    with _raises_naming(d / "dev.tsv.gz", "expected"):
        load_dataset("sst2", tmp_path)
    (d / "dev.tsv.gz").write_bytes(gzip.compress(b"index\tsentence\n0\tgood\n"))
    with _raises_naming(d / "dev.tsv.gz", "header"):
        load_dataset("sst2", tmp_path)


def test_dataset_error_is_value_error():
    assert issubclass(DatasetError, ValueError)


# --- wrong shapes, out-of-range labels, pickled arrays, count mismatches ----------


def _cifar_dir(tmp_path: Path, images: np.ndarray, labels: np.ndarray) -> Path:
    import io
    import lzma

    d = tmp_path / "cifar10"
    d.mkdir()
    buf = io.BytesIO()
    np.save(buf, images)
    for split in ("train", "test"):
        (d / f"{split}_images.npy.xz").write_bytes(lzma.compress(buf.getvalue()))
        np.save(d / f"{split}_labels.npy", labels)
    return d


def test_cifar_wrong_image_shape(tmp_path):
    d = _cifar_dir(tmp_path, np.zeros((2, 32, 32, 3), np.uint8), np.array([0, 1], np.uint8))
    with _raises_naming(d / "train_images.npy.xz", "shape", r"\?x3x32x32"):
        load_dataset("cifar10", tmp_path)


def test_cifar_labels_out_of_range_and_count_mismatch(tmp_path):
    d = _cifar_dir(tmp_path, np.zeros((2, 3, 32, 32), np.uint8), np.array([0, 10], np.uint8))
    with _raises_naming(d / "train_labels.npy", "out of range", "0..9"):
        load_dataset("cifar10", tmp_path)
    np.save(d / "train_labels.npy", np.array([0, 1, 2], np.uint8))
    with _raises_naming(d / "train_images.npy.xz", "2 samples", "3 labels"):
        load_dataset("cifar10", tmp_path)


def test_pickled_npy_is_refused(tmp_path):
    d = _cifar_dir(tmp_path, np.zeros((2, 3, 32, 32), np.uint8), np.array([0, 1], np.uint8))
    np.save(d / "train_labels.npy", np.array([{"evil": 1}, 2], dtype=object), allow_pickle=True)
    with _raises_naming(d / "train_labels.npy", "unreadable"):
        load_dataset("cifar10", tmp_path)


def test_mnist_image_label_count_mismatch(tmp_path):
    d = tmp_path / "mnist"
    d.mkdir()
    images = struct.pack(">IIII", 2051, 3, 28, 28) + bytes(3 * 784)
    labels = struct.pack(">II", 2049, 2) + bytes([1, 2])
    for split in ("train", "t10k"):
        (d / f"{split}-images-idx3-ubyte.gz").write_bytes(gzip.compress(images))
        (d / f"{split}-labels-idx1-ubyte.gz").write_bytes(gzip.compress(labels))
    with _raises_naming(d / "train-images-idx3-ubyte.gz", "3 samples", "2 labels"):
        load_dataset("mnist", tmp_path)


def test_femnist_wrong_image_shape(tmp_path):
    d = tmp_path / "femnist"
    d.mkdir()
    path = d / "femnist_leaf_subset.npz"
    x = np.zeros((2, 32, 32), np.uint8)
    w = np.zeros(2, np.int32)
    np.savez(path, x_train=x, y_train=np.array([0, 1]), writer_train=w, x_test=x,
             y_test=np.array([0, 1]), writer_test=w, writers=np.array(["a"]))
    with _raises_naming(path, "shape"):
        load_dataset("femnist", tmp_path)
