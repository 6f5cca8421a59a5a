"""Decoded datasets are cached beside their files (fedforge.data.cache), on a tiny CIFAR-10
in its real format: a second load reads the cache, a changed source file is decoded again,
links are refused and a read-only folder falls back to decoding."""

from __future__ import annotations

import io
import lzma

import numpy as np
import pytest
import torch

from fedforge.data import cache as cache_mod
from fedforge.data import images
from fedforge.data.cache import CACHE_DIR, cache_path
from fedforge.data.loaders import load_dataset


def _cifar(root, n: int = 4, seed: int = 0):
    """A CIFAR-10 folder in the encoded format; returns its folder and the decoded images."""
    rng = np.random.default_rng(seed)
    folder = root / "cifar10"
    folder.mkdir(exist_ok=True)
    encoded = rng.integers(0, 256, (n, 3, 32, 32), dtype=np.uint8)
    for split in ("train", "test"):
        buf = io.BytesIO()
        np.save(buf, encoded)
        (folder / f"{split}_images.npy.xz").write_bytes(lzma.compress(buf.getvalue()))
        np.save(folder / f"{split}_labels.npy", np.arange(n, dtype=np.uint8) % 10)
    return folder, images.decode_cifar_planes(encoded)


@pytest.fixture
def decodes(monkeypatch):
    """How many times a CIFAR split was decoded from its xz file."""
    calls = []
    real = images._decode_cifar_split
    monkeypatch.setattr(images, "_decode_cifar_split",
                        lambda folder, split: calls.append(split) or real(folder, split))
    monkeypatch.delenv(cache_mod.ENV_VAR, raising=False)
    monkeypatch.setattr(cache_mod, "_DECODED", {})
    monkeypatch.setattr(cache_mod, "_KEPT", 0)  # the folder's cache alone (the memory's: below)
    return calls


@pytest.fixture
def kept(monkeypatch):
    """The process keeps the decoded datasets it loaded (as in a compare)."""
    monkeypatch.setattr(cache_mod, "_KEPT", 4)


def test_second_load_reads_the_cache_and_gives_the_same_tensors(tmp_path, decodes):
    folder, decoded = _cifar(tmp_path)
    first = load_dataset("cifar10", tmp_path)
    assert decodes == ["train", "test"]
    assert (folder / CACHE_DIR / "cifar10-train.npz").is_file()
    second = load_dataset("cifar10", tmp_path, normalize=False)  # options share the cache
    assert decodes == ["train", "test"]
    assert torch.equal(second.train_x, torch.from_numpy(decoded).float() / 255)
    assert torch.equal(first.train_y, second.train_y)
    assert not [p for p in (folder / CACHE_DIR).iterdir() if p.suffix == ".tmp"]


def test_a_changed_source_file_is_decoded_again(tmp_path, decodes):
    folder, _ = _cifar(tmp_path, seed=0)
    load_dataset("cifar10", tmp_path)
    _, new = _cifar(tmp_path, seed=1)  # same names, same sizes, other bytes
    got = load_dataset("cifar10", tmp_path, normalize=False)
    assert decodes == ["train", "test", "train", "test"]
    assert torch.equal(got.train_x, torch.from_numpy(new).float() / 255)


def test_a_cache_with_another_key_is_not_read(tmp_path, decodes):
    folder, decoded = _cifar(tmp_path)
    load_dataset("cifar10", tmp_path)
    path = cache_path(folder, "cifar10-train")
    np.savez(path, __source_sha256__=np.array("0" * 64), x=np.zeros_like(decoded),
             y=np.zeros(4, np.uint8))
    got = load_dataset("cifar10", tmp_path, normalize=False)
    assert decodes == ["train", "test", "train"]  # the test split's cache still holds
    assert torch.equal(got.train_x, torch.from_numpy(decoded).float() / 255)


def test_a_damaged_cache_falls_back_to_decoding(tmp_path, decodes):
    folder, decoded = _cifar(tmp_path)
    load_dataset("cifar10", tmp_path)
    cache_path(folder, "cifar10-train").write_bytes(b"PK\x03\x04 not a zip")
    got = load_dataset("cifar10", tmp_path, normalize=False)
    assert torch.equal(got.train_x, torch.from_numpy(decoded).float() / 255)


def test_a_linked_cache_is_neither_read_nor_written(tmp_path, decodes):
    folder, _ = _cifar(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (folder / CACHE_DIR).symlink_to(elsewhere, target_is_directory=True)
    load_dataset("cifar10", tmp_path)
    load_dataset("cifar10", tmp_path)
    assert decodes == ["train", "test"] * 2
    assert list(elsewhere.iterdir()) == []


def test_a_read_only_data_root_decodes_every_time(tmp_path, decodes, monkeypatch):
    folder, decoded = _cifar(tmp_path)

    def read_only(*args, **kwargs):  # what a read-only mount answers, for root as well
        raise OSError(30, "Read-only file system")

    monkeypatch.setattr(cache_mod.Path, "mkdir", read_only)
    monkeypatch.setattr(cache_mod.tempfile, "mkstemp", read_only)
    load_dataset("cifar10", tmp_path)
    got = load_dataset("cifar10", tmp_path, normalize=False)
    assert decodes == ["train", "test"] * 2
    assert torch.equal(got.train_x, torch.from_numpy(decoded).float() / 255)
    assert not (folder / CACHE_DIR).exists()


def test_a_folder_marked_read_only_is_not_written_even_by_root(tmp_path, decodes):
    folder, _ = _cifar(tmp_path)
    folder.chmod(0o555)
    try:
        load_dataset("cifar10", tmp_path)
        assert not (folder / CACHE_DIR).exists()
    finally:
        folder.chmod(0o755)


def test_a_failed_write_leaves_no_file_and_the_load_goes_on(tmp_path, decodes, monkeypatch):
    folder, decoded = _cifar(tmp_path)

    def full_disk(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(cache_mod.os, "replace", full_disk)
    got = load_dataset("cifar10", tmp_path, normalize=False)
    assert torch.equal(got.train_x, torch.from_numpy(decoded).float() / 255)
    assert list((folder / CACHE_DIR).iterdir()) == []


def test_the_cache_can_be_turned_off(tmp_path, decodes, monkeypatch):
    folder, _ = _cifar(tmp_path)
    monkeypatch.setenv(cache_mod.ENV_VAR, "0")
    load_dataset("cifar10", tmp_path)
    assert not (folder / CACHE_DIR).exists()


def test_a_read_only_data_root_is_decoded_once_per_process(tmp_path, decodes, kept,
                                                            monkeypatch):
    folder, decoded = _cifar(tmp_path)
    folder.chmod(0o555)  # a compare's runs over a read-only data root
    try:
        first = load_dataset("cifar10", tmp_path, normalize=False)
        first.train_x.mul_(0)  # what a caller does with its tensors is its own
        second = load_dataset("cifar10", tmp_path, normalize=False)
    finally:
        folder.chmod(0o755)
    assert decodes == ["train", "test"]
    assert torch.equal(second.train_x, torch.from_numpy(decoded).float() / 255)
    assert not (folder / CACHE_DIR).exists()


def test_the_process_keeps_few_datasets_and_rereads_changed_files(tmp_path, decodes, kept):
    folder, _ = _cifar(tmp_path, seed=0)
    load_dataset("cifar10", tmp_path)
    _, new = _cifar(tmp_path, seed=1)  # other bytes: another key, decoded afresh
    got = load_dataset("cifar10", tmp_path, normalize=False)
    assert decodes == ["train", "test"] * 2
    assert torch.equal(got.train_x, torch.from_numpy(new).float() / 255)
    assert len(cache_mod._DECODED) == 4
    _cifar(tmp_path, seed=2)
    load_dataset("cifar10", tmp_path)
    assert len(cache_mod._DECODED) == 4  # the oldest forgotten


def test_turning_the_cache_off_also_keeps_nothing_in_memory(tmp_path, decodes, kept,
                                                            monkeypatch):
    _cifar(tmp_path)
    monkeypatch.setenv(cache_mod.ENV_VAR, "0")
    load_dataset("cifar10", tmp_path)
    load_dataset("cifar10", tmp_path)
    assert decodes == ["train", "test"] * 2
