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

from fedforge.data.base import DatasetError, DatasetSplits, labels_to_tensor
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


def text_splits(train: Any, test: Any, where: Path, *, text: str, label: str,
                partition_by: str | None, tokenizer: str | None, max_len: int
                ) -> DatasetSplits:
    """The rows' ``text`` as token ids with the ``label`` column's classes, or, with
    ``label = ""``, as next-token sequences (see the module doc)."""
    from fedforge.data.huggingface import (  # noqa: PLC0415 (its own loader calls here)
        HuggingFaceSplits,
        _groups,
        _labels,
    )
    from fedforge.data.tokenized import token_streams, tokenized  # noqa: PLC0415 (extra)

    tokenizer = need_tokenizer(tokenizer, "huggingface")
    if max_len < 2:
        raise DatasetError(f"data.options.max_len: expected >= 2, got {max_len}")
    texts = {"train": _texts(train, text, where), "test": _texts(test, text, where)}
    folder = where if where.is_dir() else where.parent
    files, name = data_files(where), _entry(texts, text)
    groups = _groups(train, test, partition_by, where) if partition_by else None
    common = {"name": f"huggingface:{where.name}", "input_shape": (max_len,),
              "group_names": None if groups is None else groups[2]}
    if label:
        ids, vocab = tokenized(folder, name, files, tokenizer, max_len, texts)
        ytr, yte, num_classes = _labels(train, test, label, where)
        return HuggingFaceSplits(
            train_x=torch.from_numpy(ids["train"]), train_y=labels_to_tensor(ytr),
            test_x=torch.from_numpy(ids["test"]), test_y=labels_to_tensor(yte),
            num_classes=num_classes, train_groups=None if groups is None else groups[0],
            test_groups=None if groups is None else groups[1], vocab_size=vocab, **common)
    streams, vocab, pad = token_streams(folder, name, files, tokenizer, texts)
    out = []
    for i, split in enumerate(("train", "test")):
        rows = len(texts[split])
        owners = groups[i] if groups is not None else np.arange(rows, dtype=np.int64)
        out.append(stream_sequences(*streams[split], owners.tolist(), max_len, pad, None))
    (trx, tr_y, trg), (tex, te_y, teg) = out
    return HuggingFaceSplits(
        train_x=torch.from_numpy(trx), train_y=torch.from_numpy(tr_y),
        test_x=torch.from_numpy(tex), test_y=torch.from_numpy(te_y), num_classes=vocab,
        train_groups=trg if groups is not None else None,
        test_groups=teg if groups is not None else None, vocab_size=vocab,
        client_tests=False, **common)
