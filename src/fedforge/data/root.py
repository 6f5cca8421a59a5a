"""Where dataset files are looked for: one resolution order for every entry point.

1. ``--data-root`` on the command line (:func:`use_data_root`),
2. ``data.root`` in the config (the ``root`` argument of ``load_dataset``),
3. ``$FEDFORGE_DATA``,
4. the default: ``./data`` in the folder fedforge runs from.

The command-line option wins over the config so that a shipped example runs unchanged on any
machine; the variable loses to an explicit ``data.root`` because a config that names a folder
means it. The chosen folder holds one folder per dataset (``mnist/``, ``cifar10/`` ...).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import NamedTuple

ENV_VAR = "FEDFORGE_DATA"
DEFAULT_ROOTS: tuple[Path, ...] = (Path("data"),)
"""Tried in order when nothing else names a root; the first that exists is used."""

_cli_root: Path | None = None


class DataRoot(NamedTuple):
    path: Path
    source: str  # "--data-root", "data.root", "$FEDFORGE_DATA" or "default"


def use_data_root(path: str | Path | None) -> None:
    """Set (or with ``None`` clear) the command line's ``--data-root`` for this process."""
    global _cli_root
    _cli_root = None if path is None else Path(path).expanduser()


def use_data_root_option(path: str | Path) -> None:
    """:func:`use_data_root` for the ``--data-root`` option: a folder that does not exist
    is a ``ValueError`` naming the option, before any dataset is looked for."""
    if not Path(path).expanduser().is_dir():
        raise ValueError(f"--data-root: directory {str(path)!r} does not exist")
    use_data_root(path)


def resolve_data_root(configured: str | Path | None = None) -> DataRoot:
    """The folder datasets are read from, and which setting chose it (for error messages)."""
    if _cli_root is not None:
        return DataRoot(_cli_root, "--data-root")
    if configured is not None:
        return DataRoot(Path(configured).expanduser(), "data.root")
    env = os.environ.get(ENV_VAR)
    if env:
        return DataRoot(Path(env).expanduser(), f"${ENV_VAR}")
    for candidate in DEFAULT_ROOTS:
        if candidate.is_dir():
            return DataRoot(candidate, "default")
    return DataRoot(DEFAULT_ROOTS[0], "default")


def resolved(path: Path) -> Path:
    """``path.resolve()``, with a symlink loop as a one-line DatasetError naming the path."""
    try:
        return path.resolve()
    except (RuntimeError, OSError) as exc:  # RuntimeError: Python < 3.13's symlink loop
        from fedforge.data.base import DatasetError  # noqa: PLC0415 (base imports torch)

        raise DatasetError(f"{path}: cannot be resolved, a symbolic link loop? ({exc})"
                           ) from None


def describe_root(root: DataRoot) -> str:
    """``/abs/path (from $FEDFORGE_DATA)``: the folder as the user can check it."""
    return f"{resolved(root.path)} (from {root.source})"
