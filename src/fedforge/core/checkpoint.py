"""The checkpoint format: tensors in safetensors, everything else in JSON; written atomically.

``checkpoints/round_00010.safetensors`` + ``round_00010.json`` (the JSON is written last and
names its tensor file, so a JSON that exists marks a complete checkpoint), and
``checkpoints/latest.json`` names the newest complete one. Nothing is unpickled on load.

A checkpoint folder may come from anywhere (a copied run, a shared disk), so its JSON files
are untrusted input: every file name they hold must be a plain ``round_NNNNN.*`` name of a
regular file inside the folder, the tensor file must match the SHA-256 recorded next to it,
and pruning derives the names it deletes from the naming pattern, never from a file's content.
Every failure is a one-line :class:`CheckpointError` naming the file.

This module is the format only (write, prune, read, verify); what a run does with its
checkpoints (when to resume, what an error message says about them) is
``fedforge.experiment.checkpoint``'s.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from fedforge.core.files import create_new, fsync_dir
from fedforge.core.tree import flatten_dict, unflatten_dict

_META_NAME = re.compile(r"round_(\d{5,})\.json")
_TENSOR_NAME = re.compile(r"round_(\d{5,})\.safetensors")
# every file a checkpoint write can leave behind (a kill may leave the ``.tmp`` ones)
_PRUNABLE = re.compile(r"round_(\d{5,})\.(?:json|safetensors)(?:\.tmp)?")
_SHA256 = re.compile(r"[0-9a-f]{64}")
_EXAMPLES = {_META_NAME: "round_00010.json", _TENSOR_NAME: "round_00010.safetensors"}


class CheckpointError(ValueError):
    """A checkpoint that cannot be trusted or read; the message starts with the file."""


def _atomic_write_text(path: Path, text: str) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.unlink(missing_ok=True)  # never write through a link left at the temporary name
    with os.fdopen(create_new(tmp, os.O_WRONLY), "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def file_sha256(path: Path) -> str:
    """Hex SHA-256 of a file, read in 1 MiB blocks (checkpoints can be large)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def _check_folder(directory: Path) -> Path:
    """The folder itself must be a real directory, not a link to somewhere else."""
    if directory.is_symlink():
        raise CheckpointError(f"{directory}: is a symbolic link; a run keeps its checkpoints "
                              "in a real folder inside the run folder")
    return directory.resolve()


def resolve_in(directory: Path, name: object, pattern: re.Pattern, field: str,
               source: Path) -> Path:
    """``directory / name`` when ``name`` (read from ``source``'s ``field``) is a plain file
    name matching ``pattern`` of a regular file inside ``directory``; else CheckpointError."""
    if not isinstance(name, str) or not pattern.fullmatch(name):
        like = _EXAMPLES.get(pattern, "latest.json")
        raise CheckpointError(f"{source}: {field} must be a plain file name like {like!r} "
                              f"in the same folder, got {name!r}")
    path = directory / name
    if path.is_symlink():
        raise CheckpointError(f"{path}: is a symbolic link (named by {source} {field}); "
                              "refusing to follow it")
    if not path.is_file():
        raise CheckpointError(f"{path}: missing or not a regular file (named by {source} "
                              f"{field})")
    if path.resolve().parent != _check_folder(directory):
        raise CheckpointError(f"{path}: resolves outside {directory}; refusing it")
    return path


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{path}: unreadable JSON ({exc})") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data


def save_checkpoint(
    directory: Path, round_: int, tensors: dict, meta: dict, keep: int = 2
) -> Path:
    """Save ``tensors`` (nested dict of tensors) and ``meta`` (JSON-able) for ``round_``.

    The JSON records the tensor file's SHA-256 and the flattened key order (safetensors sorts
    keys; the order decides flattening and noise order downstream, so a resumed run needs it).
    Then prunes to the ``keep`` newest rounds ``<= round_``; rounds after ``round_`` belong to
    an abandoned history (a rollback, an overwritten run) and are removed too."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    _check_folder(directory)
    stem = f"round_{round_:05d}"
    flat = {k: v.detach().contiguous().cpu() for k, v in flatten_dict(tensors).items()}
    tmp = directory / f"{stem}.safetensors.tmp"
    tmp.unlink(missing_ok=True)
    save_file(flat, str(tmp))
    sha = file_sha256(tmp)
    os.replace(tmp, directory / f"{stem}.safetensors")
    meta = {**meta, "round": round_, "tensors": f"{stem}.safetensors", "sha256": sha,
            "keys": list(flat)}
    _atomic_write_text(directory / f"{stem}.json", json.dumps(meta, indent=1))
    commit_latest(directory, f"{stem}.json")
    prune_checkpoints(directory, round_, keep)
    return directory / f"{stem}.json"


def commit_latest(directory: Path, name: str) -> None:
    """Point ``latest.json`` at the checkpoint JSON ``name``: the commit of a checkpoint."""
    _atomic_write_text(directory / "latest.json", json.dumps({"checkpoint": name}))
    fsync_dir(directory)  # the renames themselves survive a power cut, not only a kill


def prune_checkpoints(directory: Path, current: int, keep: int) -> list[Path]:
    """Delete checkpoint files of rounds other than the ``keep`` newest rounds ``<= current``
    (``current`` itself is always kept) -> the deleted paths.

    Only names matching ``round_NNNNN.{json,safetensors}[.tmp]`` directly inside
    ``directory`` are candidates; a link is removed as a link (its target is untouched); no
    file's content is read, so a planted JSON cannot point the deletion anywhere else."""
    rounds: dict[int, list[Path]] = {}
    for entry in os.scandir(directory):
        m = _PRUNABLE.fullmatch(entry.name)
        if m and (entry.is_symlink() or entry.is_file(follow_symlinks=False)):
            rounds.setdefault(int(m.group(1)), []).append(directory / entry.name)
    kept = sorted((r for r in rounds if r <= current), reverse=True)[:max(keep, 1)]
    deleted = []
    for r, paths in rounds.items():
        if r == current or r in kept:
            continue
        for p in sorted(paths, key=lambda p: p.suffix == ".json", reverse=True):
            p.unlink(missing_ok=True)  # the JSON first: a partial prune leaves no checkpoint
            deleted.append(p)
    return deleted


def latest_checkpoint_meta(directory: Path) -> tuple[Path, dict]:
    """-> (path of the newest checkpoint JSON, its validated content), reading nothing
    outside ``directory``. FileNotFoundError when there is no ``latest.json``."""
    directory = Path(directory)
    latest = directory / "latest.json"
    if not latest.exists() and not latest.is_symlink():
        raise FileNotFoundError(f"{directory}: no complete checkpoint (latest.json missing)")
    _check_folder(directory)
    latest = resolve_in(directory, "latest.json", re.compile(r"latest\.json"), "name",
                        directory)
    meta_path = resolve_in(directory, _read_json(latest).get("checkpoint"), _META_NAME,
                           '"checkpoint"', latest)
    return meta_path, checked_meta(directory, meta_path)


def checked_meta(directory: Path, meta_path: Path) -> dict:
    """The validated content of the checkpoint JSON ``meta_path`` inside ``directory``."""
    meta = _read_json(meta_path)
    round_ = meta.get("round")
    if type(round_) is not int or round_ != int(_META_NAME.fullmatch(meta_path.name).group(1)):
        raise CheckpointError(f"{meta_path}: \"round\" must be the file's round number, got "
                              f"{round_!r}")
    resolve_in(directory, meta.get("tensors"), _TENSOR_NAME, '"tensors"', meta_path)
    if not isinstance(meta.get("sha256"), str) or not _SHA256.fullmatch(meta["sha256"]):
        raise CheckpointError(f"{meta_path}: \"sha256\" must be 64 hex digits, got "
                              f"{meta.get('sha256')!r}")
    keys = meta.get("keys")
    if (not isinstance(keys, list) or not all(isinstance(k, str) for k in keys)
            or len(set(keys)) != len(keys)):
        raise CheckpointError(f"{meta_path}: \"keys\" must be a list of distinct tensor names")
    return meta


def checkpoint_jsons(directory: Path) -> list[str]:
    """The names of the checkpoint JSON files directly in ``directory``, newest round first
    (complete or not: :func:`verified` says which ones hold)."""
    rounds = sorted(((int(m.group(1)), m.group(0)) for e in os.scandir(directory)
                     if (m := _META_NAME.fullmatch(e.name))), reverse=True)
    return [name for _, name in rounds]


def verified(directory: Path, meta_path: Path) -> bool:
    """Whether ``meta_path`` is a valid checkpoint JSON whose tensor file matches its hash."""
    try:
        meta = checked_meta(directory, meta_path)
        return file_sha256(directory / meta["tensors"]) == meta["sha256"]
    except (CheckpointError, OSError):
        return False


def load_checkpoint(
    directory: Path, device: torch.device | str = "cpu",
    expected: dict[str, torch.Size] | None = None,
) -> tuple[dict, dict]:
    """-> (tensors as a nested dict in the saved key order, meta).

    ``expected`` (flattened key -> shape, e.g. ``{"params/linear.weight": torch.Size([10,
    60])}``) checks that the file holds exactly these tensors with these shapes. Raises
    FileNotFoundError naming the directory when there is no checkpoint, and
    :class:`CheckpointError` (one line naming the file) for anything else wrong."""
    meta_path, meta = latest_checkpoint_meta(directory)
    path = Path(directory) / meta["tensors"]
    try:
        sha = file_sha256(path)
    except OSError as exc:
        raise CheckpointError(f"{path}: unreadable ({exc.strerror or exc})") from None
    if sha != meta["sha256"]:
        raise CheckpointError(f"{path}: SHA-256 {sha[:12]}... does not match {meta_path.name} "
                              f"({meta['sha256'][:12]}...); the file is corrupt or was changed")
    try:
        flat = load_file(str(path), device=str(device))
    except Exception as exc:  # safetensors raises its own error type for malformed files
        raise CheckpointError(f"{path}: not a readable safetensors file "
                              f"({str(exc).splitlines()[0] if str(exc) else type(exc).__name__})"
                              ) from None
    keys = meta["keys"]
    if set(keys) != set(flat):
        raise CheckpointError(f"{path}: tensors {_diff(keys, flat)} (against {meta_path.name} "
                              "\"keys\")")
    if expected is not None:
        check_shapes(path, {k: flat[k].shape for k in keys}, expected)
    # fresh allocator-aligned storage (safetensors' buffers are only 8-byte aligned): BLAS
    # kernels may round differently on differently aligned inputs, and a resumed run must
    # compute exactly what an uninterrupted one does
    ordered = {k: flat[k].clone() for k in keys}
    return unflatten_dict(ordered), meta


def check_shapes(path: Path, found: dict[str, torch.Size],
                 expected: dict[str, torch.Size]) -> None:
    """CheckpointError naming the missing, extra and wrongly shaped tensors (one line)."""
    problems = []
    missing = [k for k in expected if k not in found]
    extra = [k for k in found if k not in expected]
    if missing:
        problems.append("missing " + _names(missing))
    if extra:
        problems.append("unexpected " + _names(extra))
    for k in expected:
        if k in found and tuple(found[k]) != tuple(expected[k]):
            problems.append(f"{k} has shape {list(found[k])}, expected {list(expected[k])}")
    if problems:
        raise CheckpointError(f"{path}: does not fit the run: {'; '.join(problems[:6])}"
                              + (f"; and {len(problems) - 6} more" if len(problems) > 6 else ""))


def _diff(keys: list[str], flat: dict) -> str:
    missing = [k for k in keys if k not in flat]
    extra = sorted(k for k in flat if k not in set(keys))
    parts = ([f"missing {_names(missing)}"] if missing else []) + (
        [f"unrecorded {_names(extra)}"] if extra else [])
    return "; ".join(parts)


def _names(keys: list[str], limit: int = 4) -> str:
    shown = ", ".join(keys[:limit])
    return shown + (f" (+{len(keys) - limit} more)" if len(keys) > limit else "")
