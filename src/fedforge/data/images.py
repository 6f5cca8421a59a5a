"""Image datasets: MNIST, Fashion-MNIST (IDX), CIFAR-10 (encoded .npy.xz) and FEMNIST (.npz).

All of them come back as float32 ``[N, C, H, W]`` standardised with the dataset's usual
mean/std, so models see inputs on the same scale whichever benchmark is chosen.
"""

from __future__ import annotations

import zipfile
import zlib
from math import prod
from pathlib import Path

import numpy as np

from fedforge.data.base import (
    DatasetError,
    DatasetSplits,
    check_array,
    check_declared_size,
    check_labels,
    check_same_length,
    check_stream_end,
    find_dataset_dir,
    images_to_tensor,
    labels_to_tensor,
    load_npy_bytes,
    open_compressed,
    read_npy_xz,
    require_file,
)
from fedforge.data.cache import cached_arrays

# Per-dataset normalisation constants (train split, pixels scaled to [0, 1]).
MNIST_STATS = ((0.1307,), (0.3081,))
FASHION_MNIST_STATS = ((0.2860,), (0.3530,))
CIFAR10_STATS = ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616))
FEMNIST_STATS = ((0.0386,), (0.1644,))  # after inverting to MNIST polarity (ink = 1)

_IDX_FILES = {
    "train": ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"),
    "test": ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"),
}
_IDX_UBYTE = 0x08


def read_idx(path: Path, expected: tuple[int | None, ...]) -> np.ndarray:
    """Parse a gzipped unsigned-byte IDX file, checking magic number, dims and length.

    The header is read first and the payload only up to the size it declares, so a file that
    decompresses to more (a gzip bomb) costs no more memory than a valid one."""
    ndim = len(expected)
    want = "x".join("N" if s is None else str(s) for s in expected)
    what = f"an IDX ubyte array of shape {want}"
    header = 4 + 4 * ndim
    with open_compressed(path, what) as f:
        head = f.read(header)
        shape = _idx_shape(path, head, expected, want)
        size = header + prod(shape)
        dims = "x".join(map(str, shape))
        check_declared_size(size, f"{path}: IDX values of shape {dims} (from its header)")
        data = f.read(size - header)
        if header + len(data) != size:
            raise DatasetError(f"{path}: truncated IDX file, expected {size} bytes ({header}-byte "
                               f"header + {dims} values), got {header + len(data)}")
        check_stream_end(f, size, path, what)
    return np.frombuffer(data, dtype=np.uint8).reshape(shape)


def _idx_shape(path: Path, head: bytes, expected: tuple[int | None, ...], want: str
               ) -> tuple[int, ...]:
    """The shape an IDX header declares, after checking its magic number against ``expected``."""
    ndim, header = len(expected), 4 + 4 * len(expected)
    if len(head) < header:
        raise DatasetError(
            f"{path}: truncated IDX file, expected a {header}-byte header, got {len(head)} bytes"
        )
    magic = int.from_bytes(head[:4], "big")
    if magic != (_IDX_UBYTE << 8) + ndim:
        raise DatasetError(
            f"{path}: bad IDX magic number {magic} (0x{magic:08x}), expected "
            f"{(_IDX_UBYTE << 8) + ndim} (0x{(_IDX_UBYTE << 8) + ndim:08x}: unsigned bytes, "
            f"{ndim} dims)"
        )
    shape = tuple(int.from_bytes(head[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim))
    if any(e is not None and e != s for e, s in zip(expected, shape, strict=True)):
        raise DatasetError(f"{path}: IDX header says shape {shape}, expected {want}")
    return shape


def _load_idx_split(folder: Path, split: str, num_classes: int) -> tuple[np.ndarray, np.ndarray]:
    """The split's images and labels, decoded once and then read from the folder's cache."""
    sources = [folder / name for name in _IDX_FILES[split]]
    arrays = cached_arrays(folder, f"idx-{split}", sources,
                           lambda: dict(zip("xy", _decode_idx_split(folder, split, num_classes),
                                            strict=True)))
    return arrays["x"], arrays["y"]


def _decode_idx_split(folder: Path, split: str, num_classes: int
                      ) -> tuple[np.ndarray, np.ndarray]:
    img_name, lab_name = _IDX_FILES[split]
    img_path, lab_path = folder / img_name, folder / lab_name
    require_file(img_path, "gzipped IDX images")
    require_file(lab_path, "gzipped IDX labels")
    x = read_idx(img_path, (None, 28, 28))
    y = read_idx(lab_path, (None,))
    check_same_length(x, y, img_path, lab_path)
    check_labels(y, num_classes, lab_path)
    return x, y


def load_idx_dataset(
    name: str, root: str | Path, stats: tuple, normalize: bool = True
) -> DatasetSplits:
    """MNIST-format dataset (``name``/ holds the four original ``*-ubyte.gz`` files)."""
    folder = find_dataset_dir(root, name, _IDX_FILES["train"][0])
    tr_x, tr_y = _load_idx_split(folder, "train", 10)
    te_x, te_y = _load_idx_split(folder, "test", 10)
    mean, std = stats
    return DatasetSplits(
        name=name,
        train_x=images_to_tensor(tr_x[:, None], mean, std, normalize),
        train_y=labels_to_tensor(tr_y),
        test_x=images_to_tensor(te_x[:, None], mean, std, normalize),
        test_y=labels_to_tensor(te_y),
        num_classes=10,
        input_shape=(1, 28, 28),
        train_groups=None,
        test_groups=None,
    )


def load_mnist(root: str | Path, normalize: bool = True) -> DatasetSplits:
    """MNIST digits, 60k/10k x 1x28x28, 10 classes."""
    return load_idx_dataset("mnist", root, MNIST_STATS, normalize)


def load_fashion_mnist(root: str | Path, normalize: bool = True) -> DatasetSplits:
    """Fashion-MNIST clothing, 60k/10k x 1x28x28, 10 classes."""
    return load_idx_dataset("fashion_mnist", root, FASHION_MNIST_STATS, normalize)


# ----------------------------------------------------------------------------- CIFAR-10


def decode_cifar_planes(e: np.ndarray) -> np.ndarray:
    """Undo the folder's lossless encoding (2-D delta of G, R-G, B-G planes, mod 256).

    Returns NCHW RGB uint8; see cifar10/README.md for the encoding.
    """
    p = np.cumsum(np.cumsum(e, axis=2, dtype=np.uint8), axis=3, dtype=np.uint8)
    g = p[:, 0]
    return np.stack([p[:, 1] + g, g, p[:, 2] + g], axis=1)


def load_cifar_split(folder: Path, split: str) -> tuple[np.ndarray, np.ndarray]:
    """The split's NCHW images and labels, decoded once and then read from the folder's
    cache (:mod:`fedforge.data.cache`: decompressing them takes 10-25 s)."""
    sources = [folder / f"{split}_images.npy.xz", folder / f"{split}_labels.npy"]
    arrays = cached_arrays(folder, f"cifar10-{split}", sources,
                           lambda: dict(zip("xy", _decode_cifar_split(folder, split),
                                            strict=True)))
    return arrays["x"], arrays["y"]


def _decode_cifar_split(folder: Path, split: str) -> tuple[np.ndarray, np.ndarray]:
    img_path = folder / f"{split}_images.npy.xz"
    lab_path = folder / f"{split}_labels.npy"
    require_file(lab_path, "a uint8 label array (.npy)")
    require_file(img_path, "an xz-compressed uint8 array of shape Nx3x32x32")
    y = check_array(load_npy_bytes(lab_path, lab_path, "a uint8 label array"), lab_path, (None,))
    if y.dtype.kind not in "iu":
        raise DatasetError(f"{lab_path}: expected integer labels, got dtype {y.dtype}")
    check_labels(y, 10, lab_path)
    e = read_npy_xz(img_path, "a uint8 array of shape Nx3x32x32")
    check_array(e, img_path, (None, 3, 32, 32), np.uint8)
    check_same_length(e, y, img_path, lab_path)
    return decode_cifar_planes(e), y


def load_cifar10(root: str | Path, normalize: bool = True) -> DatasetSplits:
    """CIFAR-10, 50k/10k x 3x32x32, 10 classes (train is sorted by class: partition shuffles)."""
    folder = find_dataset_dir(root, "cifar10", "train_labels.npy")
    tr_x, tr_y = load_cifar_split(folder, "train")
    te_x, te_y = load_cifar_split(folder, "test")
    mean, std = CIFAR10_STATS
    return DatasetSplits(
        name="cifar10",
        train_x=images_to_tensor(tr_x, mean, std, normalize),
        train_y=labels_to_tensor(tr_y),
        test_x=images_to_tensor(te_x, mean, std, normalize),
        test_y=labels_to_tensor(te_y),
        num_classes=10,
        input_shape=(3, 32, 32),
        train_groups=None,
        test_groups=None,
    )


# ----------------------------------------------------------------------------- FEMNIST

FEMNIST_FILE = "femnist_leaf_subset.npz"
_NPZ_ERRORS = (OSError, EOFError, ValueError, KeyError, zipfile.BadZipFile, zlib.error)


def _integers(arr: np.ndarray, path: Path, key: str) -> np.ndarray:
    """Integer ids as int64; floats only when every value is a whole number (never rounded)."""
    if arr.dtype.kind in "iu":
        return arr.astype(np.int64)
    if arr.dtype.kind == "f":
        bad = ~np.isfinite(arr) | (arr != np.round(arr))
        if bad.any():
            value = arr[np.flatnonzero(bad)[0]]
            raise DatasetError(f"{path}: {key} holds non-integer values (e.g. {value}); "
                               "expected integer ids")
        return arr.astype(np.int64)
    raise DatasetError(f"{path}: {key} has dtype {arr.dtype}; expected integer ids")


def load_femnist(root: str | Path, normalize: bool = True, invert: bool = True) -> DatasetSplits:
    """LEAF FEMNIST subset, naturally split by writer; 62 classes (digits, A-Z, a-z).

    ``invert`` turns LEAF's white-background polarity into MNIST's (``255 - x``) so that
    MNIST-style models and normalisation apply unchanged.
    """
    folder = find_dataset_dir(root, "femnist", FEMNIST_FILE)
    path = require_file(folder / FEMNIST_FILE, "an .npz with x/y/writer train/test arrays")
    keys = ("x_train", "y_train", "writer_train", "x_test", "y_test", "writer_test", "writers")
    try:
        with np.load(path, allow_pickle=False) as z:  # zipfile stops at the declared sizes
            check_declared_size(sum(i.file_size for i in z.zip.infolist()),
                             f"{path}: the arrays its .npz index declares")
            missing = [k for k in keys if k not in z.files]
            if missing:
                raise DatasetError(f"{path}: missing arrays {missing}, expected keys {list(keys)}")
            arrays = {k: z[k] for k in keys}
    except DatasetError:
        raise
    except _NPZ_ERRORS as e:
        msg = f"truncated or corrupt .npz file ({type(e).__name__}: {e})"
        raise DatasetError(f"{path}: {msg}") from e
    writers = check_array(arrays["writers"], path, (None,))
    out = {}
    for split in ("train", "test"):
        x = check_array(arrays[f"x_{split}"], path, (None, 28, 28), np.uint8)
        y = _integers(check_array(arrays[f"y_{split}"], path, (len(x),)), path, f"y_{split}")
        w = _integers(check_array(arrays[f"writer_{split}"], path, (len(x),)), path,
                      f"writer_{split}")
        check_labels(y, 62, path)
        if w.size and (w.min() < 0 or w.max() >= len(writers)):
            raise DatasetError(f"{path}: writer_{split} ids out of range 0..{len(writers) - 1}")
        if invert:
            x = 255 - x
        out[split] = (x[:, None], y, w.astype(np.int64))
    mean, std = FEMNIST_STATS if invert else ((1 - FEMNIST_STATS[0][0],), FEMNIST_STATS[1])
    return DatasetSplits(
        name="femnist",
        train_x=images_to_tensor(out["train"][0], mean, std, normalize),
        train_y=labels_to_tensor(out["train"][1]),
        test_x=images_to_tensor(out["test"][0], mean, std, normalize),
        test_y=labels_to_tensor(out["test"][1]),
        num_classes=62,
        input_shape=(1, 28, 28),
        train_groups=out["train"][2],
        test_groups=out["test"][2],
        group_names=[str(s) for s in writers],
    )
