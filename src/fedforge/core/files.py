"""The few file primitives every writer of a run folder shares.

A run folder may hold links planted by someone else; the checkpoint files, the disk client
store and the run folder's own writer all refuse to write through them, and all make a
rename survive a power cut by syncing its folder. Each rule lives here once.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
"""``os.open`` flag that refuses a symbolic link as the last part of a path (0 where the
platform has none)."""


def not_plain(path: Path) -> str | None:
    """Why ``path`` may not be written through or read as one's own (None: absent, or a
    regular file with one link). ``lstat``: a link, dangling or not, is refused as a link."""
    try:
        st = path.lstat()
    except FileNotFoundError:
        return None
    if stat.S_ISLNK(st.st_mode):
        return "is a symbolic link"
    if not stat.S_ISREG(st.st_mode):
        return "is not a regular file"
    if st.st_nlink > 1:
        return f"has {st.st_nlink} hard links"
    return None


def create_new(path: Path, flags: int = os.O_RDWR) -> int:
    """A new file at ``path`` -> its descriptor; never an existing name, never through a
    link (FileExistsError if anything stands there, a dangling link included)."""
    return os.open(path, flags | os.O_CREAT | os.O_EXCL | NOFOLLOW, 0o666)


def fsync_dir(directory: Path) -> None:
    """Sync ``directory`` so the renames and creations in it survive a power cut; a no-op
    where the platform has no directory handles."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
