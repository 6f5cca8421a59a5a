"""The shared file primitives: what counts as a plain file, exclusive creation, folder sync."""

from __future__ import annotations

import os

import pytest

from fedforge.core.files import create_new, fsync_dir, not_plain


def test_not_plain_names_each_kind(tmp_path):
    plain = tmp_path / "plain"
    plain.write_text("x")
    (tmp_path / "dir").mkdir()
    (tmp_path / "link").symlink_to(plain)
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    os.link(plain, tmp_path / "second")
    (tmp_path / "alone").write_text("y")
    assert not_plain(tmp_path / "absent") is None
    assert not_plain(tmp_path / "alone") is None
    assert not_plain(tmp_path / "link") == "is a symbolic link"
    assert not_plain(tmp_path / "dangling") == "is a symbolic link"
    assert not_plain(tmp_path / "dir") == "is not a regular file"
    assert not_plain(plain) == "has 2 hard links"


def test_create_new_never_reuses_a_name_or_follows_a_link(tmp_path):
    fd = create_new(tmp_path / "new")
    os.write(fd, b"abc")
    os.close(fd)
    assert (tmp_path / "new").read_bytes() == b"abc"
    with pytest.raises(FileExistsError):
        create_new(tmp_path / "new")
    (tmp_path / "trap").symlink_to(tmp_path / "target")
    with pytest.raises(FileExistsError):
        create_new(tmp_path / "trap", os.O_WRONLY)
    assert not (tmp_path / "target").exists()


def test_fsync_dir_tolerates_a_missing_folder(tmp_path):
    fsync_dir(tmp_path)
    fsync_dir(tmp_path / "absent")  # no handle to open: nothing to sync, no error
