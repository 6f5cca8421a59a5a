"""Shared pieces of the dataset loaders: the result type, the error type and safe file reading.

Every loader goes through the helpers here so that a missing, truncated or corrupt file always
surfaces as a :class:`DatasetError` that names the file and says what was expected, instead of
an ``EOFError`` or ``zlib.error`` deep inside numpy.
"""

from __future__ import annotations

import gzip
import io
import lzma
import zlib
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from math import prod
from pathlib import Path
from typing import BinaryIO

import numpy as np
import torch

from fedforge.core.memory import AllocationError, check_allocation


class DatasetError(ValueError):
    """A dataset file is missing, unreadable or does not have the expected content."""


@dataclass
class DatasetSplits:
    """A whole dataset in memory: train and test tensors plus natural client ids if any.

    ``train_x`` is float32 ``[N, C, H, W]`` (normalised images), int64 ``[N, T]`` (tokens) or
    float32 ``[N, D]`` (features); labels are int64 ``[N]``. ``train_groups``/``test_groups``
    hold the natural client id of every sample (FEMNIST writer, Shakespeare role, synthetic
    device) and are ``None`` for datasets without natural clients. ``group_names[g]`` is the
    original name of group ``g`` when one exists.
    """

    name: str
    train_x: torch.Tensor
    train_y: torch.Tensor
    test_x: torch.Tensor
    test_y: torch.Tensor
    num_classes: int
    input_shape: tuple[int, ...]
    train_groups: np.ndarray | None
    test_groups: np.ndarray | None
    vocab_size: int | None = None
    group_names: list[str] | None = None

    @property
    def num_train(self) -> int:
        return int(self.train_y.shape[0])

    @property
    def num_test(self) -> int:
        return int(self.test_y.shape[0])


# ----------------------------------------------------------------------------- locating files


def find_dataset_dir(root: str | Path, folder: str, marker: str) -> Path:
    """Accept both ``root`` (holding ``folder/``) and ``root`` pointing at ``folder`` itself."""
    root = Path(root).expanduser()
    if (root / folder).is_dir():
        return root / folder
    if root.is_dir() and (root.name == folder or (root / marker).exists()):
        return root
    raise DatasetError(
        f"{root / folder}: dataset directory not found (expected a '{folder}/' folder under "
        f"{root}, or root pointing at it; pass root= or set $FEDFORGE_DATA)"
    )


def require_file(path: Path, what: str) -> Path:
    """Fail early, with the path, rather than inside a decompressor."""
    if not path.is_file():
        raise DatasetError(f"{path}: file not found (expected {what})")
    return path


# ----------------------------------------------------------------------------- reading files


MAX_TEXT_BYTES = 1 << 30
"""Decompressed size refused for a gzipped text file (the real ones are a few MiB); binary
arrays are bounded by the size their own header declares instead."""
_CHUNK = 1 << 20


@contextmanager
def open_compressed(path: Path, what: str, opener: Callable[..., BinaryIO] = gzip.open
                    ) -> Iterator[BinaryIO]:
    """``path`` opened for streamed decompression; truncation or corruption -> DatasetError.

    Callers read only as much as they expect, so a decompression bomb costs no more memory
    than a valid file."""
    require_file(path, what)
    kind = "xz" if opener is lzma.open else "gzip"
    try:
        with opener(path, "rb") as f:
            yield f
    except (OSError, EOFError, zlib.error, lzma.LZMAError) as e:
        raise DatasetError(f"{path}: truncated or corrupt {kind} file, expected {what} ({e})"
                           ) from e


def check_stream_end(f: BinaryIO, size: int, path: Path, what: str) -> None:
    """A stream must end where its header says (``size`` bytes): one byte more is refused."""
    if f.read(1):
        raise DatasetError(f"{path}: decompresses to more than the {size} bytes its header "
                           f"declares, expected {what}")


def check_declared_size(nbytes: int, what: str) -> None:
    """A size a file's header declares must fit in free memory; a DatasetError (the file is
    corrupt or hostile) rather than an allocation error."""
    try:
        check_allocation(nbytes, what)
    except AllocationError as e:
        raise DatasetError(str(e)) from None


def read_gzip(path: Path, what: str, limit: int = MAX_TEXT_BYTES) -> bytes:
    """Decompressed content of a .gz file, read in chunks and refused past ``limit`` bytes."""
    parts, total = [], 0
    with open_compressed(path, what) as f:
        while chunk := f.read(_CHUNK):
            total += len(chunk)
            if total > limit:
                raise DatasetError(f"{path}: decompresses to more than {limit} bytes, "
                                   f"expected {what}")
            parts.append(chunk)
    return b"".join(parts)


def read_gzip_text(path: Path, what: str) -> str:
    data = read_gzip(path, what)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise DatasetError(f"{path}: not UTF-8 text, expected {what} ({e})") from e


_NPY_HEADERS = {(1, 0): np.lib.format.read_array_header_1_0,
                (2, 0): np.lib.format.read_array_header_2_0}


def read_npy_xz(path: Path, what: str) -> np.ndarray:
    """An xz-compressed .npy array, never unpickled, decompressed only up to the size its
    header declares (checked against free memory first)."""
    with open_compressed(path, what, lzma.open) as f:
        try:
            read_header = _NPY_HEADERS.get(np.lib.format.read_magic(f))
            if read_header is None:
                raise ValueError("unsupported .npy format version")
            shape, fortran, dtype = read_header(f)
        except ValueError as e:
            raise DatasetError(f"{path}: unreadable .npy data, expected {what} ({e})") from e
        if dtype.hasobject:
            raise DatasetError(f"{path}: .npy of Python objects (needs pickle), expected {what}")
        size = prod(shape) * dtype.itemsize
        check_declared_size(size, f"{path}: .npy values of shape {shape} (from its header)")
        data = f.read(size)
        if len(data) < size:
            raise DatasetError(f"{path}: truncated .npy data, expected {size} bytes of "
                               f"{what}, got {len(data)}")
        check_stream_end(f, size, path, what)
    return np.frombuffer(data, dtype).reshape(shape, order="F" if fortran else "C")


def load_npy_bytes(source: Path | io.BytesIO, path: Path, what: str) -> np.ndarray:
    """``np.load`` of one .npy (file or buffer) with errors converted to DatasetError."""
    try:
        return np.load(source, allow_pickle=False)
    except (OSError, EOFError, ValueError) as e:
        raise DatasetError(f"{path}: unreadable .npy data, expected {what} ({e})") from e


# ----------------------------------------------------------------------------- validation


def check_array(
    arr: np.ndarray, path: Path, shape: Sequence[int | None], dtype: np.dtype | type | None = None
) -> np.ndarray:
    """Check ``arr`` against ``shape`` (``None`` = any size) and dtype, naming ``path``."""
    ok = arr.ndim == len(shape) and all(
        s is None or s == a for s, a in zip(shape, arr.shape, strict=True)
    )
    if not ok:
        want = "x".join("?" if s is None else str(s) for s in shape)
        raise DatasetError(f"{path}: expected an array of shape {want}, got {arr.shape}")
    if dtype is not None and arr.dtype != np.dtype(dtype):
        raise DatasetError(f"{path}: expected dtype {np.dtype(dtype)}, got {arr.dtype}")
    return arr


def check_labels(y: np.ndarray, num_classes: int, path: Path) -> np.ndarray:
    """Labels must be integers in ``[0, num_classes)``."""
    if y.size and (int(y.min()) < 0 or int(y.max()) >= num_classes):
        raise DatasetError(
            f"{path}: labels out of range, expected 0..{num_classes - 1}, "
            f"got {int(y.min())}..{int(y.max())}"
        )
    return y


def check_same_length(a: np.ndarray, b: np.ndarray, path_a: Path, path_b: Path) -> None:
    if len(a) != len(b):
        raise DatasetError(
            f"{path_a}: {len(a)} samples but {path_b} has {len(b)} labels (expected equal counts)"
        )


# ----------------------------------------------------------------------------- tensors


def images_to_tensor(
    x: np.ndarray, mean: Sequence[float], std: Sequence[float], normalize: bool = True
) -> torch.Tensor:
    """uint8 ``[N, C, H, W]`` -> float32 in [0, 1], then per-channel standardised."""
    t = torch.from_numpy(np.asarray(x).astype(np.float32)).div_(255.0)
    if normalize:
        c = t.shape[1]
        m = torch.tensor(mean, dtype=torch.float32).view(1, c, 1, 1)
        s = torch.tensor(std, dtype=torch.float32).view(1, c, 1, 1)
        t.sub_(m).div_(s)
    return t


def labels_to_tensor(y: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.array(y, dtype=np.int64))
