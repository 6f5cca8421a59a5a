"""Checkpoints: tensors in safetensors, everything else in JSON; written atomically.

``checkpoints/round_00010.safetensors`` + ``round_00010.json`` (the JSON is written last and
names its tensor file, so a JSON that exists marks a complete checkpoint), and
``checkpoints/latest.json`` names the newest complete one. Nothing is unpickled on load.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from fedforge.core.tree import flatten_dict, unflatten_dict


def _atomic_write_text(path: Path, text: str) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:  # e.g. platforms without directory handles
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def save_checkpoint(
    directory: Path, round_: int, tensors: dict, meta: dict, keep: int = 2
) -> Path:
    """Save ``tensors`` (nested dict of tensors) and ``meta`` (JSON-able) for ``round_``."""
    directory.mkdir(parents=True, exist_ok=True)
    stem = f"round_{round_:05d}"
    flat = {k: v.detach().contiguous().cpu() for k, v in flatten_dict(tensors).items()}
    tmp = directory / f"{stem}.safetensors.tmp"
    save_file(flat, str(tmp))
    os.replace(tmp, directory / f"{stem}.safetensors")
    meta = {**meta, "round": round_, "tensors": f"{stem}.safetensors"}
    _atomic_write_text(directory / f"{stem}.json", json.dumps(meta, indent=1))
    _atomic_write_text(directory / "latest.json", json.dumps({"checkpoint": f"{stem}.json"}))
    _fsync_dir(directory)  # the renames themselves survive a power cut, not only a kill
    old = sorted(directory.glob("round_*.json"))[:-keep]
    for j in old:
        (directory / json.loads(j.read_text())["tensors"]).unlink(missing_ok=True)
        j.unlink(missing_ok=True)
    return directory / f"{stem}.json"


def load_checkpoint(directory: Path, device: torch.device | str = "cpu") -> tuple[dict, dict]:
    """-> (tensors as a nested dict, meta). Raises FileNotFoundError naming the directory."""
    latest = directory / "latest.json"
    if not latest.is_file():
        raise FileNotFoundError(f"{directory}: no complete checkpoint (latest.json missing)")
    meta_path = directory / json.loads(latest.read_text())["checkpoint"]
    meta = json.loads(meta_path.read_text())
    flat = load_file(str(directory / meta["tensors"]), device=str(device))
    # fresh allocator-aligned storage (safetensors' buffers are only 8-byte aligned): BLAS
    # kernels may round differently on differently aligned inputs, and a resumed run must
    # compute exactly what an uninterrupted one does
    flat = {k: v.clone() for k, v in flat.items()}
    return unflatten_dict(flat), meta
