"""Decoded datasets cached beside their files, so a compare or a sweep decodes them once.

CIFAR-10's xz-compressed arrays take 10-25 s to decompress; every run of a ``compare`` or
``sweep`` paid it again. :func:`cached_arrays` keeps the decoded uint8 arrays (before
normalisation: every option reads the same cache) as an uncompressed ``.npz`` in the
dataset's folder, ``<dataset>/.fedforge-cache/<name>.npz``, read back in well under a
second. The cache is only a shortcut, never a source:

* its key is the SHA-256 of the source files' bytes (and of this format's version), stored
  in the file and compared on every read, so a replaced source file is decoded afresh;
* it is written to a temporary file and renamed into place, so a reader never sees half a
  cache, and runs that decode at the same time each write a whole one;
* a cache file or folder that is a symbolic link is neither read nor written;
* anything that fails (a read-only data root, a full disk, a damaged cache) falls back to
  decoding, as without a cache; a folder whose mode has no write bit counts as read-only,
  even for root;
* the process also keeps the last few decoded datasets by the same key, so the runs of a
  ``compare`` decode a read-only data root's files once, not once a run.

``FEDFORGE_DATA_CACHE=0`` turns the cache off.
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
import zipfile
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from fedforge.data.base import check_declared_size

logger = logging.getLogger(__name__)
CACHE_DIR = ".fedforge-cache"
ENV_VAR = "FEDFORGE_DATA_CACHE"
_FORMAT = b"fedforge decoded-dataset cache 1"
_KEY = "__source_sha256__"
_CHUNK = 1 << 20
_KEPT = 4  # decoded splits the process keeps (a dataset's train and test, and one more)
_DECODED: dict[tuple[str, str], dict[str, np.ndarray]] = {}  # (name, key) -> arrays, oldest first


def source_key(sources: Sequence[Path]) -> str:
    """SHA-256 over this format's version and each source file's name and bytes."""
    h = hashlib.sha256(_FORMAT)
    for path in sources:
        h.update(path.name.encode() + b"\0")
        with open(path, "rb") as f:
            while chunk := f.read(_CHUNK):
                h.update(chunk)
        h.update(b"\0")
    return h.hexdigest()


def cache_path(folder: Path, name: str) -> Path:
    return folder / CACHE_DIR / f"{name}.npz"


def cached_arrays(folder: Path, name: str, sources: Sequence[Path],
                  decode: Callable[[], dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """``decode()``'s arrays, from ``folder``'s cache ``name`` when its key matches the
    ``sources``' bytes; else decoded and cached. A missing source decodes at once (the
    decoder names the file)."""
    if os.environ.get(ENV_VAR, "1").strip() == "0" or not all(p.is_file() for p in sources):
        return decode()
    key = source_key(sources)
    if (name, key) in _DECODED:  # a copy: callers own what they get
        return {k: v.copy() for k, v in _DECODED[name, key].items()}
    path = cache_path(folder, name)
    arrays = _read(path, key)
    if arrays is None:
        arrays = decode()
        _write(path, key, arrays)
    _keep((name, key), arrays)
    return arrays


def _keep(entry: tuple[str, str], arrays: dict[str, np.ndarray]) -> None:
    """Remember ``arrays`` (a copy) as ``entry``, forgetting the oldest beyond ``_KEPT``."""
    _DECODED[entry] = {k: v.copy() for k, v in arrays.items()}
    while len(_DECODED) > _KEPT:
        del _DECODED[next(iter(_DECODED))]


def _linked(path: Path) -> bool:
    return path.is_symlink() or path.parent.is_symlink()


def _read(path: Path, key: str) -> dict[str, np.ndarray] | None:
    """The cached arrays if ``path`` is a regular file holding ``key``; None otherwise."""
    if _linked(path):
        logger.warning("%s: a symbolic link, not read; decoding the dataset", path)
        return None
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return None  # no cache yet (or unreadable)
    try:
        with os.fdopen(fd, "rb") as f, np.load(f, allow_pickle=False) as z:
            check_declared_size(sum(i.file_size for i in z.zip.infolist()),
                                f"{path}: the arrays its .npz index declares")
            if _KEY not in z.files or str(z[_KEY]) != key:
                return None
            return {k: z[k] for k in z.files if k != _KEY}
    except (OSError, EOFError, ValueError, KeyError, zipfile.BadZipFile) as exc:
        logger.warning("%s: unreadable cache (%s); decoding the dataset", path, exc)
        return None


def _writable(folder: Path) -> bool:
    """Whether ``folder`` may be written: its permissions allow it, and its mode has a write
    bit (a folder marked read-only stays so for root, which ``os.access`` lets write)."""
    return os.access(folder, os.W_OK) and bool(folder.stat().st_mode & 0o222)


def _write(path: Path, key: str, arrays: dict[str, np.ndarray]) -> None:
    """``arrays`` and ``key`` into ``path`` atomically; any failure leaves no file behind."""
    if _linked(path):
        logger.warning("%s: a symbolic link, not written", path)
        return
    tmp = None
    try:
        if not _writable(path.parent if path.parent.is_dir() else path.parent.parent):
            raise OSError(f"{path.parent}: read-only")
        path.parent.mkdir(exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}-", suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            np.savez(f, **{_KEY: np.array(key)}, **arrays)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        tmp = None
    except OSError as exc:  # a read-only data root, a full disk: decode next time too
        logger.info("%s: not cached (%s)", path, exc)
    finally:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
