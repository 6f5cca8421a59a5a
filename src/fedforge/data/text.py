"""Text datasets: LEAF Shakespeare (next character, natural by role) and SST-2 (sentiment).

Both become int64 token tensors ``[N, T]`` so the same batching/gathering code serves images
and text.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
import torch

from fedforge.data.base import (
    DatasetError,
    DatasetSplits,
    find_dataset_dir,
    labels_to_tensor,
    read_gzip_text,
)

# ----------------------------------------------------------------------------- Shakespeare

# LEAF's fixed 80-symbol character set (newline, space, punctuation, digits, letters, "}").
LEAF_CHARS = "\n !\"&'(),-.0123456789:;>?ABCDEFGHIJKLMNOPQRSTUVWXYZ[]abcdefghijklmnopqrstuvwxyz}"
UNK_CHAR = len(LEAF_CHARS)  # reserved index for any character outside LEAF_CHARS
SHAKESPEARE_VOCAB_SIZE = len(LEAF_CHARS) + 1

_CHAR_TABLE = np.full(256, UNK_CHAR, dtype=np.uint8)
_CHAR_TABLE[[ord(c) for c in LEAF_CHARS]] = np.arange(len(LEAF_CHARS), dtype=np.uint8)


def encode_chars(text: str) -> np.ndarray:
    """Map characters to LEAF indices (uint8); anything unknown -> ``UNK_CHAR``."""
    codes = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
    out = _CHAR_TABLE[np.minimum(codes, 255)]
    out[codes > 255] = UNK_CHAR
    return out


def decode_chars(tokens: Iterable[int]) -> str:
    """Inverse of :func:`encode_chars` (unknown -> "?"), for inspecting samples."""
    return "".join(LEAF_CHARS[t] if 0 <= t < len(LEAF_CHARS) else "?" for t in tokens)


def _read_roles(path: Path) -> dict[str, list[str]]:
    what = "JSON {role: [snippet, ...]}"
    try:
        data = json.loads(read_gzip_text(path, what))
    except json.JSONDecodeError as e:
        raise DatasetError(f"{path}: invalid JSON, expected {what} ({e})") from e
    ok = isinstance(data, dict) and all(
        isinstance(v, list) and all(isinstance(s, str) for s in v) for v in data.values()
    )
    if not ok:
        raise DatasetError(f"{path}: unexpected JSON layout, expected {what}")
    return data


def window_starts(num_windows: int, stride: int, cap: int | None) -> np.ndarray:
    """Window start offsets: every ``stride``-th, thinned to ``cap`` evenly spaced ones."""
    starts = np.arange(0, max(num_windows, 0), stride, dtype=np.int64)
    if cap is not None and len(starts) > cap:
        starts = starts[np.arange(cap, dtype=np.int64) * len(starts) // cap]
    return starts


def _role_windows(
    roles: dict[str, list[str]], ids: dict[str, int], seq_len: int, stride: int, cap: int | None
) -> tuple[np.ndarray, np.ndarray]:
    texts, starts, groups, offset = [], [], [], 0
    for role in sorted(roles):
        text = encode_chars(" ".join(roles[role]))
        s = window_starts(len(text) - seq_len, stride, cap)
        texts.append(text)
        starts.append(s + offset)
        groups.append(np.full(len(s), ids[role], dtype=np.int64))
        offset += len(text)
    codes = np.concatenate(texts) if texts else np.zeros(0, np.uint8)
    s = np.concatenate(starts) if starts else np.zeros(0, np.int64)
    windows = codes[s[:, None] + np.arange(seq_len + 1)]
    return windows.astype(np.int64), np.concatenate(groups) if groups else s


def load_shakespeare(
    root: str | Path,
    seq_len: int = 80,
    max_samples_per_client: int | None = 200,
    max_test_samples_per_client: int | None = 50,
    stride: int = 1,
) -> DatasetSplits:
    """LEAF Shakespeare: each role's snippets joined by spaces; ``seq_len`` chars -> next char.

    The full window set (every start offset) has 2.3M train samples, too many for CPU runs, so
    each role keeps at most ``max_samples_per_client`` train windows (and
    ``max_test_samples_per_client`` test windows), evenly spaced over its text; ``None`` keeps
    all. ``stride`` > 1 takes every stride-th window before the cap. Roles shorter than
    ``seq_len + 1`` characters have no windows. Client ids index the sorted role names.
    """
    if seq_len < 1 or stride < 1:
        raise ValueError(f"seq_len and stride must be >= 1, got {seq_len}, {stride}")
    for cap in (max_samples_per_client, max_test_samples_per_client):
        if cap is not None and cap < 1:
            raise ValueError(f"per-client sample caps must be None or >= 1, got {cap}")
    folder = find_dataset_dir(root, "shakespeare", "shakespeare_train.json.gz")
    train = _read_roles(folder / "shakespeare_train.json.gz")
    test = _read_roles(folder / "shakespeare_test.json.gz")
    names = sorted(set(train) | set(test))
    ids = {r: i for i, r in enumerate(names)}
    tr, tr_g = _role_windows(train, ids, seq_len, stride, max_samples_per_client)
    te, te_g = _role_windows(test, ids, seq_len, stride, max_test_samples_per_client)
    return DatasetSplits(
        name="shakespeare",
        train_x=torch.from_numpy(np.ascontiguousarray(tr[:, :seq_len])),
        train_y=torch.from_numpy(np.ascontiguousarray(tr[:, seq_len])),
        test_x=torch.from_numpy(np.ascontiguousarray(te[:, :seq_len])),
        test_y=torch.from_numpy(np.ascontiguousarray(te[:, seq_len])),
        num_classes=SHAKESPEARE_VOCAB_SIZE,
        input_shape=(seq_len,),
        train_groups=tr_g,
        test_groups=te_g,
        vocab_size=SHAKESPEARE_VOCAB_SIZE,
        group_names=names,
    )


# ----------------------------------------------------------------------------- SST-2

PAD, UNK = 0, 1
_TOKEN_RE = re.compile(r"\w+|'\w+|[^\w\s]")


def tokenize(text: str) -> list[str]:
    """Lower-case; split into words, apostrophe suffixes ("'s") and single punctuation marks."""
    return _TOKEN_RE.findall(text.lower())


def build_vocab(token_lists: Iterable[Sequence[str]], vocab_size: int) -> dict[str, int]:
    """Most frequent words (ties by word) -> ids 2.., leaving 0 = pad and 1 = unknown."""
    if vocab_size < 3:
        raise ValueError(f"vocab_size must be >= 3 (pad, unk, one word), got {vocab_size}")
    counts = Counter(t for toks in token_lists for t in toks)
    words = sorted(counts, key=lambda w: (-counts[w], w))[: vocab_size - 2]
    return {w: i + 2 for i, w in enumerate(words)}


def encode_tokens(
    token_lists: Sequence[Sequence[str]], vocab: dict[str, int], max_len: int
) -> np.ndarray:
    """int64 ``[N, max_len]``: ids truncated to ``max_len`` and right-padded with ``PAD``."""
    out = np.full((len(token_lists), max_len), PAD, dtype=np.int64)
    for i, toks in enumerate(token_lists):
        ids = [vocab.get(t, UNK) for t in toks[:max_len]]
        out[i, : len(ids)] = ids
    return out


def read_sst2_tsv(path: Path) -> tuple[list[str], np.ndarray]:
    """A labelled GLUE SST-2 file: header ``sentence<TAB>label``, labels 0/1."""
    what = "a TSV with header 'sentence<TAB>label'"
    lines = read_gzip_text(path, what).split("\n")
    if lines[0].rstrip("\r").split("\t") != ["sentence", "label"]:
        raise DatasetError(f"{path}: header {lines[0][:60]!r}, expected {what}")
    texts, labels = [], []
    for n, line in enumerate(lines[1:], start=2):
        if not line:
            continue
        parts = line.rstrip("\r").split("\t")
        if len(parts) != 2 or parts[1] not in ("0", "1"):
            raise DatasetError(f"{path}:{n}: expected 'sentence<TAB>0|1', got {line[:60]!r}")
        texts.append(parts[0])
        labels.append(int(parts[1]))
    if not texts:
        raise DatasetError(f"{path}: no rows, expected {what} followed by labelled sentences")
    return texts, np.asarray(labels, dtype=np.int64)


def load_sst2(root: str | Path, vocab_size: int = 10000, max_len: int = 64,
              tokenizer: str | None = None) -> DatasetSplits:
    """GLUE SST-2: train.tsv for training, the labelled dev.tsv as the test split.

    The vocabulary (``vocab_size`` ids including pad=0 and unk=1) is built from train only;
    ``tokenizer`` (a local model folder or .gguf file): that model's own tokenizer instead,
    its ids cached in the data root (:mod:`fedforge.data.tokenized`).
    """
    if max_len < 1:
        raise ValueError(f"max_len must be >= 1, got {max_len}")
    folder = find_dataset_dir(root, "sst2", "train.tsv.gz")
    tr_text, tr_y = read_sst2_tsv(folder / "train.tsv.gz")
    te_text, te_y = read_sst2_tsv(folder / "dev.tsv.gz")
    if tokenizer is not None:
        from fedforge.data.tokenized import tokenized  # noqa: PLC0415 (optional extra)

        ids, vocab = tokenized(folder, "sst2", [folder / "train.tsv.gz", folder / "dev.tsv.gz"],
                               tokenizer, max_len, {"train": tr_text, "test": te_text})
        return DatasetSplits(
            name="sst2", train_x=torch.from_numpy(ids["train"]), train_y=labels_to_tensor(tr_y),
            test_x=torch.from_numpy(ids["test"]), test_y=labels_to_tensor(te_y), num_classes=2,
            input_shape=(max_len,), train_groups=None, test_groups=None, vocab_size=vocab)
    tr_tok = [tokenize(t) for t in tr_text]
    te_tok = [tokenize(t) for t in te_text]
    vocab = build_vocab(tr_tok, vocab_size)
    return DatasetSplits(
        name="sst2",
        train_x=torch.from_numpy(encode_tokens(tr_tok, vocab, max_len)),
        train_y=labels_to_tensor(tr_y),
        test_x=torch.from_numpy(encode_tokens(te_tok, vocab, max_len)),
        test_y=labels_to_tensor(te_y),
        num_classes=2,
        input_shape=(max_len,),
        train_groups=None,
        test_groups=None,
        vocab_size=len(vocab) + 2,
    )
