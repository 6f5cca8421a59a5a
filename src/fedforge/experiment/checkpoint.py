"""A run's checkpoints: whether ``--resume`` can continue, and what an error says about them.

The file format (save, prune, load, verify; :class:`CheckpointError`) is
``fedforge.core.checkpoint``, so lower layers (``model.init_from``) read checkpoints too.
"""

from __future__ import annotations

import logging
from pathlib import Path

from fedforge.core.checkpoint import (
    CheckpointError,
    checkpoint_jsons,
    commit_latest,
    verified,
)

logger = logging.getLogger(__name__)


def resumable(directory: Path) -> bool:
    """Whether ``--resume`` has a checkpoint to continue: True with ``latest.json``, False in a
    folder without checkpoint files.

    Checkpoint files without ``latest.json`` are a commit that did not finish: a kill or a
    full disk while the first ``latest.json`` was written. The newest checkpoint whose tensors
    match their SHA-256 is complete (its JSON is written atomically after its tensors), so
    the commit is finished here, naming it, and the run resumes from it; a warning says so.
    Without one that verifies it is a CheckpointError."""
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
    why = "latest.json is missing" + (" and latest.json.tmp is an unfinished write" if torn
                                      else "")
    for name in names:
        if verified(directory, directory / name):
            commit_latest(directory, name)
            logger.warning("%s: %s; resuming from %s, the newest checkpoint whose tensors match "
                           "their SHA-256", directory, why, name)
            return True
    raise CheckpointError(f"{directory}: {why} and no complete checkpoint verifies; start over "
                          "with --overwrite")


def last_checkpoint_note(directory: Path) -> str:
    """For error messages: where the last good checkpoint is, or that there is none yet."""
    if (Path(directory) / "latest.json").is_file():
        return f"last good checkpoint in {directory}"
    return "no checkpoint yet"
