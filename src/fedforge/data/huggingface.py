"""``dataset = "huggingface"``: a local Hugging Face dataset as fedforge's in-memory tensors.

The ``datasets`` library reads a ``save_to_disk`` folder (Arrow), Parquet, CSV or JSON-lines
files, or an image folder; the rows become the same tensors the built-in loaders give
(images float32 ``[N, C, H, W]`` standardised per channel, numeric columns float32
``[N, D]`` standardised per column, labels int64; a text column becomes the model's token
ids, :mod:`.hf_text`). Only local paths are read: the loader runs offline and refuses
anything that is not a file or folder, so a hub name never turns into a download. The
library's cache goes to a temporary folder that is removed once the tensors are built.

flwr-datasets' partitioners (``flwr:iid``, ``flwr:dirichlet``, ``flwr:pathological``,
``flwr:natural_id``) are registered as fedforge partitions: they run on a small Hugging Face
dataset of the labels (and natural ids) and their partitions become per-client index lists,
so they work on every fedforge dataset.
"""

from __future__ import annotations

import io
import json
import os
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager, redirect_stderr
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch

from fedforge.core.memory import out_of_memory
from fedforge.data.base import DatasetError, DatasetSplits, check_declared_size, labels_to_tensor
from fedforge.data.hf_text import text_fields

Format = Literal["auto", "arrow", "parquet", "csv", "json", "imagefolder"]
_SUFFIXES = {".parquet": "parquet", ".csv": "csv", ".jsonl": "json", ".json": "json"}
_IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp"}
_HOLDOUT_SEED = 0  # fixed: the held-out test split must not change with the run's seed
MAX_CLASSES = 1 << 24
"""Largest class id + 1 a label column may hold: per-class arrays and the model's head are
sized by it, so a stray huge id (2**62) is refused at load instead of failing later."""


@dataclass
class HuggingFaceSplits(DatasetSplits):
    """``DatasetSplits`` whose clients also get their own test samples under any partition
    (natural groups, else the client's training label mix), for ``eval.per_client``."""

    client_tests: bool = True


# ----------------------------------------------------------------------------- the library


def _datasets() -> Any:
    """The ``datasets`` module, offline and quiet (set before the first import reads them)."""
    os.environ["HF_DATASETS_OFFLINE"] = "1"
    os.environ["HF_HUB_OFFLINE"] = "1"
    try:
        import datasets
    except ImportError as exc:
        raise DatasetError("data.dataset: 'huggingface' and the flwr:* partitions need the "
                           "datasets library: pip install 'fedforge[huggingface]'") from exc
    datasets.config.HF_DATASETS_OFFLINE = True  # an earlier import read the environment first
    datasets.disable_progress_bars()
    return datasets


def _partitioners() -> Any:
    try:
        from flwr_datasets import partitioner
    except ImportError as exc:
        raise ValueError("data.partition: the flwr:* partitions need flwr-datasets: "
                         "pip install 'fedforge[huggingface]'") from exc
    return partitioner


@contextmanager
def _scratch_cache() -> Iterator[str]:
    """A cache folder for ``load_dataset`` that is gone when the tensors are built."""
    with tempfile.TemporaryDirectory(prefix="fedforge-hf-") as tmp:
        yield tmp


# ----------------------------------------------------------------------------- reading


def _local_path(path: str) -> Path:
    """The dataset's path; anything else (a hub name) is refused, never fetched."""
    where = Path(path).expanduser()
    if not (where.is_file() or where.is_dir()):
        raise DatasetError(
            f"data.options.path: {path!r} is not a local file or folder; the huggingface "
            "dataset reads only local data and fetches nothing from a hub (save it with "
            "save_to_disk, or as Parquet, CSV or JSON lines, and give that path)")
    return where


def _detect(path: Path) -> str:
    """The format a path holds, from its files (``format = "auto"``)."""
    if path.is_file():
        kind = _SUFFIXES.get(path.suffix.lower())
        if kind is None:
            raise DatasetError(f"data.options.format: cannot tell the format of {path}; set "
                               "format to arrow, parquet, csv, json or imagefolder")
        return kind
    if any((path / f).is_file() for f in ("dataset_dict.json", "state.json")):
        return "arrow"
    files = [f for f in path.rglob("*") if f.is_file()]
    for suffix, kind in _SUFFIXES.items():
        if any(f.suffix.lower() == suffix for f in files):
            return kind
    if any(f.suffix.lower() in _IMAGE_SUFFIXES for f in files):
        return "imagefolder"
    raise DatasetError(f"data.options.path: {path} holds no Arrow (save_to_disk), Parquet, "
                       "CSV, JSON lines or image files")


def _read(path: Path, fmt: str) -> dict[str, Any]:
    """split name -> ``datasets.Dataset``, all in memory."""
    hf = _datasets()
    if fmt == "arrow":
        _check_arrow_files(path)
    try:
        if fmt == "arrow":
            loaded = hf.load_from_disk(str(path), keep_in_memory=True)
        else:
            where = {"data_files": {"train": str(path)}} if path.is_file() else {
                "data_dir": str(path)}
            with _scratch_cache() as cache:
                loaded = hf.load_dataset(fmt, cache_dir=cache, keep_in_memory=True, **where)
    except Exception as exc:  # noqa: BLE001 (any failure to read the files: one line)
        text = out_of_memory(exc) or " ".join(str(exc).split())[:300]
        raise DatasetError(f"data.options.path: {path}: not readable as {fmt} ({text})"
                           ) from None
    return dict(loaded) if isinstance(loaded, hf.DatasetDict) else {"train": loaded}


def _json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None  # unreadable: load_from_disk reports it


def _inside(target: Path, root: Path, named_in: Path) -> None:
    """``target`` (links followed) must lie in ``root``; a name with ``..``, an absolute
    path or a link out of the folder is refused."""
    if not target.resolve().is_relative_to(root):
        raise DatasetError(f"data.options.path: {named_in} names {target}, outside the "
                           f"dataset folder {root}; only files inside it are read")


def _check_arrow_files(path: Path) -> None:
    """Refuse a save_to_disk folder whose ``dataset_dict.json`` or ``state.json`` names a
    split folder or Arrow file outside it: load_from_disk would read any file they name."""
    root = path.resolve()
    folders = [path]
    index = _json(path / "dataset_dict.json") if path.is_dir() else None
    if isinstance(index, dict) and isinstance(index.get("splits"), list):
        folders = [path / str(name) for name in index["splits"]]
        for folder in folders:
            _inside(folder, root, path / "dataset_dict.json")
    for folder in folders:
        state = _json(folder / "state.json")
        files = state.get("_data_files") if isinstance(state, dict) else None
        for entry in files if isinstance(files, list) else []:
            if isinstance(entry, dict) and isinstance(entry.get("filename"), str):
                _inside(folder / entry["filename"], root, folder / "state.json")


def _pick(dsets: dict[str, Any], split: str, test_split: str | None, path: Path
          ) -> tuple[Any, Any | None]:
    """(train, test or None: hold one out) from the named splits."""
    for key, name in (("split", split), ("test_split", test_split)):
        if name is not None and name not in dsets:
            raise DatasetError(f"data.options.{key}: no split {name!r} in {path}; it has "
                               f"{sorted(dsets)}")
    if test_split is None and "test" in dsets and split != "test":
        test_split = "test"
    return dsets[split], None if test_split is None else dsets[test_split]


# ----------------------------------------------------------------------------- columns


def _columns(ds: Any, names: list[str], key: str, path: Path) -> list[np.ndarray]:
    """The named columns as numpy arrays (decoded images included), read in one pass."""
    for name in names:
        if name not in ds.column_names:
            raise DatasetError(f"data.options.{key}: no column {name!r} in {path} (columns: "
                               f"{', '.join(ds.column_names)})")
    for name in names:
        if _is_image(ds, name):
            raise DatasetError(f"data.options.{key}: column {name!r} of {path} holds images; "
                               "give one image column alone as the features")
    batch = ds.with_format("numpy", columns=names)[0:len(ds)]
    for name in names:
        values = batch[name]
        if values.dtype == object and any(map(_is_missing, values)):
            raise DatasetError(f"data.options.{key}: column {name!r} of {path} has missing "
                               "values (NaN or empty cells); fill or drop those rows")
        if values.dtype == object:
            raise DatasetError(f"data.options.{key}: column {name!r} of {path} has rows of "
                               "different shapes")
    return [batch[name] for name in names]


def _is_missing(value: Any) -> bool:
    """A missing cell, as the numpy format gives it: None or a NaN scalar."""
    return value is None or (isinstance(value, float | np.floating) and bool(np.isnan(value)))


def _column(ds: Any, name: str, key: str, path: Path) -> np.ndarray:
    return _columns(ds, [name], key, path)[0]


def _feature_columns(ds: Any, features: str | list[str] | None, label: str,
                     partition_by: str | None) -> list[str]:
    if features is not None:
        return [features] if isinstance(features, str) else list(features)
    if "image" in ds.column_names:
        return ["image"]
    return [c for c in ds.column_names if c not in (label, partition_by)]


def _inputs(ds: Any, columns: list[str], path: Path) -> np.ndarray:
    """Raw inputs: images ``[N, C, H, W]`` (one image column) or numbers ``[N, D]``."""
    if not columns:
        raise DatasetError("data.options.features: no feature columns")
    arrays = _columns(ds, columns, "features", path)
    for name, a in zip(columns, arrays):
        if a.dtype.kind not in "biuf":
            raise DatasetError(f"data.options.features: column {name!r} of {path} holds "
                               f"{a.dtype} values; expected images or numbers")
        if a.dtype.kind == "f" and not np.isfinite(a).all():
            raise DatasetError(f"data.options.features: column {name!r} of {path} has NaN "
                               "or infinite values; fill or drop those rows")
    if len(arrays) == 1 and arrays[0].ndim in (3, 4):
        return _channels_first(arrays[0])
    flat = [a.reshape(len(a), -1) for a in arrays]
    return np.concatenate(flat, axis=1)


def _channels_first(x: np.ndarray) -> np.ndarray:
    """``[N, H, W]`` / ``[N, H, W, C]`` (as images decode) -> ``[N, C, H, W]``."""
    if x.ndim == 3:
        return x[:, None]
    if x.shape[-1] in (1, 3, 4) and x.shape[1] not in (1, 3):
        return np.ascontiguousarray(x[..., :3].transpose(0, 3, 1, 2))
    return x


# ----------------------------------------------------------------------------- images


_FLOAT_BYTES_PER_VALUE = 4
"""The float32 tensor each decoded value becomes; with the decoded array and its
channels-first copy this is the loader's peak (see ``_decoded_bytes``)."""


def _is_image(ds: Any, column: str) -> bool:
    return type(ds.features.get(column)).__name__ == "Image"


def _image_refs(ds: Any, column: str, path: Path) -> list[tuple[str, bytes | Path]]:
    """Each row's image, undecoded: (its name for messages, its bytes or its file). A file
    outside the dataset's folder is refused, never opened."""
    root = (path if path.is_dir() else path.parent).resolve()
    cells = ds.with_format("arrow", columns=[column])[0:len(ds)].column(column).to_pylist()
    refs: list[tuple[str, bytes | Path]] = []
    for row, cell in enumerate(cells):
        data, file = (cell or {}).get("bytes"), (cell or {}).get("path")
        if data is not None:
            refs.append((f"{path} (column {column!r}, row {row}"
                         f"{', ' + file if file else ''})", data))
        elif file is not None:
            _inside(Path(file), root, path)
            refs.append((file, Path(file)))
        else:
            raise DatasetError(f"data.options.features: column {column!r} of {path} has no "
                               f"image in row {row}")
    return refs


@contextmanager
def _opened(name: str, source: bytes | Path) -> Iterator[Any]:
    """The image, its header read and nothing decoded yet; a decompression bomb, an
    unreadable or truncated file (also when decoded inside the block) -> one line naming it."""
    from PIL import Image

    try:
        with Image.open(io.BytesIO(source) if isinstance(source, bytes) else source) as im:
            yield im
    except Image.DecompressionBombError as exc:
        raise DatasetError(f"{name}: refused as a decompression bomb ({exc})") from None
    except (OSError, ValueError, SyntaxError, EOFError) as exc:  # PIL's corrupt-file errors
        raise DatasetError(f"{name}: truncated or unreadable image ({exc})") from None


def _decoded_bytes(refs: list[tuple[str, bytes | Path]], mode: str | None) -> int:
    """Peak bytes of decoding ``refs``, from their headers: width x height x bands values,
    each held decoded, copied channels-first and as float32."""
    from PIL import ImageMode

    total = 0
    for name, source in refs:
        with _opened(name, source) as im:
            kind = mode or im.mode
            values = im.width * im.height * len(ImageMode.getmode(kind).bands)
        item = 4 if kind in ("I", "F") else 2 if kind.startswith("I;16") else 1
        total += values * (2 * item + _FLOAT_BYTES_PER_VALUE)
    return total


def _decode(refs: list[tuple[str, bytes | Path]], column: str, mode: str | None
            ) -> np.ndarray:
    """The images as one ``[N, H, W(, C)]`` array, decoded as ``datasets`` decodes them
    (EXIF orientation applied, converted to the feature's mode), one at a time."""
    from PIL import ExifTags, ImageOps

    out: np.ndarray | None = None
    for row, (name, source) in enumerate(refs):
        with _opened(name, source) as im:
            im.load()
            if im.getexif().get(ExifTags.Base.Orientation) is not None:
                im = ImageOps.exif_transpose(im)
            a = np.asarray(im if mode is None or im.mode == mode else im.convert(mode))
        if out is None:
            out = np.empty((len(refs), *a.shape), a.dtype)
        elif a.shape != out.shape[1:] or a.dtype != out.dtype:
            raise DatasetError(f"data.options.features: column {column!r}: {name} decodes to "
                               f"{a.shape} {a.dtype} but {refs[0][0]} to {out.shape[1:]} "
                               f"{out.dtype} (resize the images to one size and mode)")
        out[row] = a
    assert out is not None, "no rows"  # _images refuses an empty split
    return out


def _images(splits: list[Any], column: str, path: Path) -> list[np.ndarray]:
    """Each split's images ``[N, C, H, W]``, decoded only once their headers show that the
    decoded size fits in free memory (one line naming the dataset and the size otherwise)."""
    refs = [_image_refs(ds, column, path) for ds in splits]
    if not all(refs):
        raise DatasetError(f"data.options.path: {path}: a split has no rows")
    mode = getattr(splits[0].features[column], "mode", None)
    count = sum(map(len, refs))
    check_declared_size(sum(_decoded_bytes(r, mode) for r in refs),
                        f"data.options.path: {path}: {count} images of column {column!r} "
                        "decoded (from their headers)")
    try:
        return [_channels_first(_decode(r, column, mode)) for r in refs]
    except MemoryError as exc:
        raise DatasetError(f"data.options.path: {path}: decoding column {column!r}: "
                           f"{out_of_memory(exc)}") from None


def _standardise(train: np.ndarray, test: np.ndarray, normalize: bool
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """float32 tensors; uint8 images scaled to [0, 1]; with ``normalize``, standardised by
    the training split's per-channel (images) or per-column (numbers) mean and std."""
    scale = 255.0 if train.dtype == np.uint8 else 1.0
    # one float32 copy each, standardised in place: the loader's peak stays near
    # what _decoded_bytes estimates
    a = torch.from_numpy(np.divide(train, scale, dtype=np.float32))
    b = torch.from_numpy(np.divide(test, scale, dtype=np.float32))
    if normalize and len(a):
        dims = (0, 2, 3) if a.dim() == 4 else (0,)
        mean, std = a.mean(dims, keepdim=True), a.std(dims, keepdim=True)
        std = torch.where(std > 0, std, torch.ones_like(std))
        a.sub_(mean).div_(std)
        b.sub_(mean).div_(std)
    return a, b


def _names(ds: Any, column: str) -> list[str] | None:
    feature = ds.features.get(column)
    return list(feature.names) if type(feature).__name__ == "ClassLabel" else None


def _encode(train: np.ndarray, test: np.ndarray, key: str, path: Path
            ) -> tuple[np.ndarray, np.ndarray, list[str] | None]:
    """Integer codes for a label or id column: ints kept, strings numbered in sorted order."""
    if train.dtype.kind in "iub" and test.dtype.kind in "iub":
        return train.astype(np.int64), test.astype(np.int64), None
    if train.dtype.kind in "US" and test.dtype.kind in "US":
        names, codes = np.unique(np.concatenate([train, test]), return_inverse=True)
        codes = codes.reshape(-1)
        return codes[:len(train)], codes[len(train):], [str(n) for n in names]
    raise DatasetError(f"data.options.{key}: column of {path} holds {train.dtype} values; "
                       "expected integers or strings")


def _labels(train: Any, test: Any, label: str, path: Path
            ) -> tuple[np.ndarray, np.ndarray, int]:
    ytr, yte, names = _encode(_column(train, label, "label", path),
                              _column(test, label, "label", path), "label", path)
    declared = _names(train, label)
    names = declared or names
    both = np.concatenate([ytr, yte])
    if both.size and int(both.min()) < 0:
        raise DatasetError(f"data.options.label: column {label!r} of {path} has negative "
                           "labels; expected class ids 0..C-1")
    top = int(both.max(initial=-1))
    if declared and top >= len(declared):
        raise DatasetError(f"data.options.label: column {label!r} of {path} holds class id "
                           f"{top}, outside its ClassLabel's {len(declared)} names "
                           f"(0..{len(declared) - 1})")
    if top >= MAX_CLASSES:
        raise DatasetError(f"data.options.label: column {label!r} of {path} holds class id "
                           f"{top}; class ids must be below {MAX_CLASSES} (number the classes "
                           "0..C-1, or store them as strings)")
    num_classes = len(names) if names else top + 1
    return ytr, yte, max(num_classes, 1)


def _groups(train: Any, test: Any, column: str, path: Path
            ) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """Natural client ids numbered in sorted order, with their names."""
    gtr, gte, names = _encode(_column(train, column, "partition_by", path),
                              _column(test, column, "partition_by", path), "partition_by", path)
    if names is None:
        values, codes = np.unique(np.concatenate([gtr, gte]), return_inverse=True)
        codes = codes.reshape(-1)
        gtr, gte, names = codes[:len(gtr)], codes[len(gtr):], [str(v) for v in values]
    return gtr, gte, names


def _hold_out(ds: Any, fraction: float) -> tuple[Any, Any]:
    """(train, test): a fixed random ``fraction`` of the rows becomes the test split."""
    if not 0.0 < fraction < 1.0:
        raise DatasetError(f"data.options.test_fraction: expected a number in (0, 1), got "
                           f"{fraction!r}")
    order = np.random.default_rng(_HOLDOUT_SEED).permutation(len(ds))
    cut = int(round(fraction * len(ds)))
    if not 0 < cut < len(ds):
        raise DatasetError(f"data.options.test_fraction: {fraction} of {len(ds)} rows leaves "
                           "no train or no test rows")
    return ds.select(np.sort(order[cut:])), ds.select(np.sort(order[:cut]))


# ----------------------------------------------------------------------------- the loader


def load_huggingface(
    path: str,
    format: Format = "auto",
    features: str | list[str] | None = None,
    label: str = "label",
    split: str = "train",
    test_split: str | None = None,
    test_fraction: float = 0.2,
    partition_by: str | None = None,
    normalize: bool = True,
    text: str | None = None,
    tokenizer: str | None = None,
    max_len: int = 128,
) -> DatasetSplits:
    """A local Hugging Face dataset in memory (see the module doc).

    ``features``: one image column (default ``image`` when there is one) or numeric
    columns (default: all but ``label`` and ``partition_by``). ``test_split``: default
    ``test`` when the dataset has it, else ``test_fraction`` of ``split`` is held out (a
    fixed draw). ``partition_by``: a natural client id column (writer, device) for
    ``partition = "natural"`` or ``flwr:natural_id``. ``text``: a text column, tokenised
    with ``tokenizer`` to ``max_len`` tokens (:mod:`.hf_text`); ``label = ""`` then makes
    next-token sequences instead of classes.
    """
    where = _local_path(path)
    fmt = _detect(where) if format == "auto" else format
    train, test = _pick(_read(where, fmt), split, test_split, where)
    if test is None:
        train, test = _hold_out(train, test_fraction)
    if text is not None:  # the model's tokens; label = "": next-token sequences
        return HuggingFaceSplits(**text_fields(
            train, test, where, text=text, tokenizer=tokenizer, max_len=max_len,
            labels=_labels(train, test, label, where) if label else None,
            groups=_groups(train, test, partition_by, where) if partition_by else None))
    columns = _feature_columns(train, features, label, partition_by)
    if len(columns) == 1 and _is_image(train, columns[0]):
        xtr, xte = _images([train, test], columns[0], where)
    else:
        xtr, xte = _inputs(train, columns, where), _inputs(test, columns, where)
    if xtr.shape[1:] != xte.shape[1:]:
        raise DatasetError(f"data.options.features: train rows have shape {xtr.shape[1:]} but "
                           f"test rows {xte.shape[1:]} in {where}")
    ytr, yte, num_classes = _labels(train, test, label, where)
    gtr = gte = names = None
    if partition_by is not None:
        gtr, gte, names = _groups(train, test, partition_by, where)
    x_train, x_test = _standardise(xtr, xte, normalize)
    return HuggingFaceSplits(
        name=f"huggingface:{where.name}", train_x=x_train, train_y=labels_to_tensor(ytr),
        test_x=x_test, test_y=labels_to_tensor(yte), num_classes=num_classes,
        input_shape=tuple(x_train.shape[1:]), train_groups=gtr, test_groups=gte,
        group_names=names)


# ----------------------------------------------------------------------------- flwr partitions


def _seed(rng: np.random.Generator) -> int:
    return int(rng.integers(2**31 - 1))


def _run_flwr(make: Callable[[str], Any], labels: Any, groups: Any, partition_by: str,
              shuffle_seed: int | None = None) -> list[np.ndarray]:
    """Run a flwr-datasets partitioner on a dataset of the labels (and natural ids) and read
    each partition's row numbers back as a sorted index array."""
    hf = _datasets()
    y = np.asarray(labels.detach().cpu() if hasattr(labels, "detach") else labels)
    columns: dict[str, Any] = {"label": y, "__row": np.arange(len(y))}
    if partition_by != "label":
        if groups is None:
            raise ValueError(f"data.partition_options.partition_by: {partition_by!r}: this dataset "
                             "has no natural ids; use 'label' or set data.options.partition_by")
        columns[partition_by] = np.asarray(groups)
    ds = hf.Dataset.from_dict(columns)
    if shuffle_seed is not None:  # as flwr-datasets' FederatedDataset shuffles before IID
        ds = ds.shuffle(seed=shuffle_seed, keep_in_memory=True)
    part = make(partition_by)
    part.dataset = ds
    try:
        with redirect_stderr(io.StringIO()):  # NaturalIdPartitioner's progress bar
            count = part.num_partitions
        return [np.sort(np.asarray(part.load_partition(i)["__row"], dtype=np.int64))
                for i in range(count)]
    except ValueError as exc:  # e.g. no Dirichlet draw met min_partition_size
        text = " ".join(str(exc).split())
        raise ValueError(f"data.partition_options: {type(part).__name__}: {text}") from None


def flwr_iid(labels: Any, num_clients: int, rng: np.random.Generator) -> list[np.ndarray]:
    """flwr-datasets' ``IidPartitioner`` (after a seeded shuffle, as FederatedDataset does)."""
    p = _partitioners()
    return _run_flwr(lambda _: p.IidPartitioner(num_partitions=num_clients), labels, None,
                     "label", shuffle_seed=_seed(rng))


def flwr_dirichlet(labels: Any, num_clients: int, alpha: float, rng: np.random.Generator,
                   partition_by: str = "label", min_partition_size: int = 10,
                   self_balancing: bool = False, groups: Any = None) -> list[np.ndarray]:
    """flwr-datasets' ``DirichletPartitioner``: ``partition_by``'s values spread over
    clients by Dir(``alpha``) proportions."""
    p = _partitioners()
    return _run_flwr(lambda col: p.DirichletPartitioner(
        num_partitions=num_clients, partition_by=col, alpha=alpha,
        min_partition_size=min_partition_size, self_balancing=self_balancing,
        seed=_seed(rng)), labels, groups, partition_by)


def flwr_pathological(labels: Any, num_clients: int, num_classes_per_partition: int,
                      rng: np.random.Generator, partition_by: str = "label",
                      class_assignment_mode: Literal["random", "deterministic",
                                                     "first-deterministic"] = "random",
                      groups: Any = None) -> list[np.ndarray]:
    """flwr-datasets' ``PathologicalPartitioner``: each client holds
    ``num_classes_per_partition`` values of ``partition_by``."""
    p = _partitioners()
    return _run_flwr(lambda col: p.PathologicalPartitioner(
        num_partitions=num_clients, partition_by=col,
        num_classes_per_partition=num_classes_per_partition,
        class_assignment_mode=class_assignment_mode, seed=_seed(rng)),
        labels, groups, partition_by)


def flwr_natural_id(labels: Any, rng: np.random.Generator, num_clients: int | None = None,
                    partition_by: str | None = None, groups: Any = None) -> list[np.ndarray]:
    """flwr-datasets' ``NaturalIdPartitioner``: one client per natural id (default: the
    column given as ``data.options.partition_by``), in sorted id order; ``num_clients``
    keeps the first ones."""
    p = _partitioners()
    parts = _run_flwr(lambda col: p.NaturalIdPartitioner(partition_by=col), labels, groups,
                      partition_by or "natural_id")
    if num_clients is not None:
        if not 1 <= num_clients <= len(parts):
            raise ValueError(f"num_clients={num_clients} but there are {len(parts)} natural ids")
        parts = parts[:num_clients]
    return parts


FLWR_PARTITIONERS: dict[str, Callable[..., list[np.ndarray]]] = {
    "flwr:iid": flwr_iid,
    "flwr:dirichlet": flwr_dirichlet,
    "flwr:pathological": flwr_pathological,
    "flwr:natural_id": flwr_natural_id,
}
