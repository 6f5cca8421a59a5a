"""A run's checkpoints: whether ``--resume`` can continue, and what an error says about them.

The file format (save, prune, load, verify; :class:`CheckpointError`) is
``fedforge.core.checkpoint``, so lower layers (``model.init_from``) read checkpoints too.
"""

from __future__ import annotations

from pathlib import Path

from fedforge.core.checkpoint import CheckpointError, checkpoint_jsons, verified


def resumable(directory: Path) -> bool:
    """Whether ``--resume`` has a checkpoint to continue: True with ``latest.json``, False in a
    folder without checkpoint files. Checkpoint files without ``latest.json`` (its write
    failed, e.g. on a full disk) are a CheckpointError saying in one line how to resume."""
    directory = Path(directory)
    latest = directory / "latest.json"
    if latest.is_file() or latest.is_symlink():  # a link: loading refuses it in one line
        return True
    if not directory.is_dir() or directory.is_symlink():
        return False
    names = checkpoint_jsons(directory)
    torn = (directory / "latest.json.tmp").exists()
    if not names and not torn:
        return False
    why = "latest.json is missing" + (
        " and latest.json.tmp is an incomplete write (a full disk?)" if torn else "")
    for name in names:
        if verified(directory, directory / name):
            raise CheckpointError(
                f"{directory}: {why}; the newest complete checkpoint is {name} (its tensors "
                f"match their SHA-256): to resume from it, write {{\"checkpoint\": \"{name}\"}} "
                f"to {directory / 'latest.json'} and run --resume again, or start over with "
                "--overwrite")
    raise CheckpointError(f"{directory}: {why} and no complete checkpoint verifies; start over "
                          "with --overwrite")


def last_checkpoint_note(directory: Path) -> str:
    """For error messages: where the last good checkpoint is, or that there is none yet."""
    if (Path(directory) / "latest.json").is_file():
        return f"last good checkpoint in {directory}"
    return "no checkpoint yet"
