"""Text columns of a local Hugging Face dataset, tokenised with the model's own tokenizer.

``data.options.text`` names the column. With a ``label`` column each row is one sample,
its text truncated and padded to ``max_len`` tokens (classification); with ``label = ""``
each row's text is cut into sequences of ``max_len`` tokens for next-token fine-tuning
(:mod:`.next_token`), a row's sequences keeping its ``partition_by`` id. The token ids are
cached beside the data (``.fedforge-cache/``), keyed by the SHA-256 of the data files and
the tokenizer's files; the entry's name hashes the texts, so another column or split has
its own entry.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedforge.data.base import DatasetError, labels_to_tensor
from fedforge.data.cache import CACHE_DIR
from fedforge.data.next_token import need_tokenizer, stream_sequences


def _texts(ds: Any, column: str, path: Path) -> list[str]:
    if column not in ds.column_names:
        raise DatasetError(f"data.options.text: no column {column!r} in {path} (columns: "
                           f"{', '.join(ds.column_names)})")
    values = ds[column]
    bad = next((i for i, v in enumerate(values) if not isinstance(v, str)), None)
    if bad is not None:
        raise DatasetError(f"data.options.text: column {column!r} of {path} holds "
                           f"{type(values[bad]).__name__} in row {bad}; expected strings")
    return list(values)


def data_files(path: Path) -> list[Path]:
    """The files a dataset is read from (what its cache key covers), the cache left out."""
    if path.is_file():
        return [path]
    return sorted(f for f in path.rglob("*") if f.is_file()
                  and CACHE_DIR not in f.relative_to(path).parts)


def _entry(texts: dict[str, list[str]], column: str) -> str:
    digest = hashlib.sha256(column.encode())
    for split in sorted(texts):
        digest.update(split.encode() + b"\0" + "\0".join(texts[split]).encode() + b"\1")
    return f"huggingface-{digest.hexdigest()[:12]}"


def text_fields(train: Any, test: Any, where: Path, *, text: str,
                labels: tuple[np.ndarray, np.ndarray, int] | None,
                groups: tuple[np.ndarray, np.ndarray, list[str]] | None,
                tokenizer: str | None, max_len: int) -> dict[str, Any]:
    """The fields of the dataset's splits: the rows' ``text`` as token ids with ``labels``
    (train, test, classes), or, without labels, as next-token sequences keeping each row's
    ``groups`` id (see the module doc)."""
    from fedforge.data.tokenized import token_streams, tokenized  # noqa: PLC0415 (extra)

    tokenizer = need_tokenizer(tokenizer, "huggingface")
    if max_len < 2:
        raise DatasetError(f"data.options.max_len: expected >= 2, got {max_len}")
    texts = {"train": _texts(train, text, where), "test": _texts(test, text, where)}
    folder = where if where.is_dir() else where.parent
    files, name = data_files(where), _entry(texts, text)
    out: dict[str, Any] = {
        "name": f"huggingface:{where.name}", "input_shape": (max_len,),
        "train_groups": None, "test_groups": None,
        "group_names": None if groups is None else groups[2]}
    if labels is not None:
        ids, vocab = tokenized(folder, name, files, tokenizer, max_len, texts)
        if groups is not None:
            out.update(train_groups=groups[0], test_groups=groups[1])
        return {**out, "train_x": torch.from_numpy(ids["train"]),
                "train_y": labels_to_tensor(labels[0]), "test_x": torch.from_numpy(ids["test"]),
                "test_y": labels_to_tensor(labels[1]), "num_classes": labels[2],
                "vocab_size": vocab}
    streams, vocab, pad = token_streams(folder, name, files, tokenizer, texts)
    for i, split in enumerate(("train", "test")):
        owners = groups[i] if groups is not None else np.arange(len(texts[split]))
        x, y, g = stream_sequences(*streams[split], owners.tolist(), max_len, pad, None)
        out.update({f"{split}_x": torch.from_numpy(x), f"{split}_y": torch.from_numpy(y)})
        if groups is not None:
            out[f"{split}_groups"] = g
    return {**out, "num_classes": vocab, "vocab_size": vocab, "client_tests": False}
