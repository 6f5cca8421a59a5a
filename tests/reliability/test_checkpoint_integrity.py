"""Checkpoint files as untrusted input: hostile names, corrupt bytes, wrong shapes and
malformed JSON give a one-line CheckpointError naming the file; pruning deletes only
checkpoint-named files inside the folder; tensors come back in the order they were saved."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from fedforge.core.checkpoint import (
    CheckpointError,
    load_checkpoint,
    prune_checkpoints,
    save_checkpoint,
)
from fedforge.core.tree import flatten_dict


def _tensors(scale: float = 1.0) -> dict:
    # insertion order deliberately not alphabetical, at both levels
    return {"params": {"z.weight": torch.full((3, 2), scale), "a.bias": torch.arange(3.0)},
            "clients": {"c": torch.ones(4, 1)},
            "b": torch.zeros(2)}


def _save(directory: Path, round_: int = 1, keep: int = 5) -> Path:
    return save_checkpoint(directory, round_, _tensors(round_), {"wall_s": 0.0}, keep=keep)


def _refused(directory: Path, match: str | None = None, **kw) -> str:
    with pytest.raises(CheckpointError, match=match) as err:
        load_checkpoint(directory, **kw)
    msg = str(err.value)
    assert "\n" not in msg and "Traceback" not in msg
    return msg


@pytest.fixture
def outside(tmp_path) -> Path:
    """A file outside the checkpoint folder that nothing may read, change or delete."""
    path = tmp_path / "outside" / "precious.json"
    path.parent.mkdir()
    path.write_text('{"checkpoint": "x", "tensors": "y"}')
    return path


def _untouched(path: Path) -> None:
    assert path.read_text() == '{"checkpoint": "x", "tensors": "y"}'


def test_key_order_round_trips_nested(tmp_path):
    _save(tmp_path / "ck")
    tensors, meta = load_checkpoint(tmp_path / "ck")
    assert list(tensors) == ["params", "clients", "b"]
    assert list(tensors["params"]) == ["z.weight", "a.bias"]
    assert list(flatten_dict(tensors)) == list(flatten_dict(_tensors())) == meta["keys"]
    for k, v in flatten_dict(_tensors()).items():
        assert torch.equal(flatten_dict(tensors)[k], v)


def test_meta_records_relative_names_and_sha256(tmp_path):
    meta = json.loads(_save(tmp_path / "ck", 7).read_text())
    assert meta["tensors"] == "round_00007.safetensors" and len(meta["sha256"]) == 64
    assert json.loads((tmp_path / "ck/latest.json").read_text()) == {
        "checkpoint": "round_00007.json"}


def test_flipped_data_byte_is_refused(tmp_path):
    _save(tmp_path / "ck")
    path = tmp_path / "ck/round_00001.safetensors"
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x01  # the last byte is tensor data, not header
    path.write_bytes(bytes(data))
    msg = _refused(tmp_path / "ck", "SHA-256")
    assert msg.startswith(str(path))


@pytest.mark.parametrize("fix_sha", [False, True])
def test_truncated_tensor_file_is_refused(tmp_path, fix_sha):
    _save(tmp_path / "ck")
    path = tmp_path / "ck/round_00001.safetensors"
    path.write_bytes(path.read_bytes()[:40])
    if fix_sha:  # the recorded hash matches: safetensors itself must refuse, in one line
        from fedforge.core.checkpoint import file_sha256

        meta_path = tmp_path / "ck/round_00001.json"
        meta = json.loads(meta_path.read_text())
        meta_path.write_text(json.dumps({**meta, "sha256": file_sha256(path)}))
    _refused(tmp_path / "ck", "not a readable safetensors file" if fix_sha else "SHA-256")


def test_tensor_missing_from_file_is_refused(tmp_path):
    _save(tmp_path / "ck")
    meta_path = tmp_path / "ck/round_00001.json"
    meta = json.loads(meta_path.read_text())
    meta_path.write_text(json.dumps({**meta, "keys": [*meta["keys"], "params/extra"]}))
    _refused(tmp_path / "ck", "missing params/extra")


def test_expected_shapes_name_missing_extra_and_wrong_tensor(tmp_path):
    _save(tmp_path / "ck")
    shapes = {k: v.shape for k, v in flatten_dict(_tensors()).items()}
    load_checkpoint(tmp_path / "ck", expected=shapes)  # exact fit: fine
    wrong = {**shapes, "params/z.weight": torch.Size([2, 3])}
    _refused(tmp_path / "ck", r"params/z\.weight has shape \[3, 2\], expected \[2, 3\]",
             expected=wrong)
    missing = {**shapes, "params/new": torch.Size([1])}
    _refused(tmp_path / "ck", "missing params/new", expected=missing)
    extra = {k: v for k, v in shapes.items() if k != "b"}
    _refused(tmp_path / "ck", "unexpected b", expected=extra)


@pytest.mark.parametrize("data", [b"{", b"[]", b"{}", b'{"checkpoint": 3}', b"\xff\xfe",
                                  b'{"checkpoint": null}', b'{"checkpoint": "round_00009.json"}'])
def test_malformed_latest_json_is_refused(tmp_path, data):
    _save(tmp_path / "ck")
    (tmp_path / "ck/latest.json").write_bytes(data)
    msg = _refused(tmp_path / "ck")
    assert "latest.json" in msg or "round_00009.json" in msg


@pytest.mark.parametrize("field,value", [
    ("round", 2), ("round", "1"), ("sha256", "abc"), ("sha256", None), ("keys", "params"),
    ("keys", ["b", "b"]), ("tensors", None), ("tensors", "round_00002.safetensors")])
def test_malformed_checkpoint_json_is_refused(tmp_path, field, value):
    _save(tmp_path / "ck")
    meta_path = tmp_path / "ck/round_00001.json"
    meta = json.loads(meta_path.read_text())
    meta_path.write_text(json.dumps({**meta, field: value}))
    assert _refused(tmp_path / "ck").startswith(str(tmp_path / "ck"))


def _hostile_names(outside: Path) -> list[str]:
    return [str(outside), str(outside.with_suffix(".safetensors")),
            f"../outside/{outside.name}", "../outside/round_00001.json",
            "sub/round_00001.json", "round_00001.json/..", "", ".", "..",
            "round_00001.safetensors\x00.json"]


@pytest.mark.parametrize("where", ["latest", "tensors"])
def test_hostile_names_in_metadata_are_refused(tmp_path, outside, where):
    ck = tmp_path / "ck"
    _save(ck)
    for name in _hostile_names(outside):
        if where == "latest":
            (ck / "latest.json").write_text(json.dumps({"checkpoint": name}))
        else:
            meta = json.loads((ck / "round_00001.json").read_text())
            (ck / "round_00001.json").write_text(json.dumps({**meta, "tensors": name}))
        _refused(ck, "plain file name")
        _untouched(outside)


@pytest.mark.parametrize("name", ["latest.json", "round_00001.json", "round_00001.safetensors"])
def test_symlinks_out_of_the_folder_are_refused(tmp_path, outside, name):
    ck = tmp_path / "ck"
    _save(ck)
    (ck / name).unlink()
    (ck / name).symlink_to(outside)
    _refused(ck, "symbolic link")
    _untouched(outside)


def test_checkpoint_folder_that_is_a_symlink_is_refused(tmp_path, outside):
    _save(tmp_path / "real")
    (tmp_path / "ck").symlink_to(tmp_path / "real")
    _refused(tmp_path / "ck", "symbolic link")
    with pytest.raises(CheckpointError, match="symbolic link"):
        _save(tmp_path / "ck", 2)


def test_planted_checkpoint_cannot_make_pruning_delete_outside(tmp_path, outside):
    ck = tmp_path / "ck"
    _save(ck, 1)
    # the original defect: pruning read "tensors" from an old JSON and deleted that path
    (ck / "round_00001.json").write_text(json.dumps({"round": 1, "tensors": str(outside)}))
    (ck / "round_00000.json").write_text(json.dumps({"tensors": "../outside/precious.json"}))
    (ck / "round_00002.safetensors").symlink_to(outside)  # a link is removed as a link
    for r in (3, 4):
        _save(ck, r, keep=1)
    _untouched(outside)
    assert sorted(os.listdir(ck)) == ["latest.json", "round_00004.json",
                                      "round_00004.safetensors"]


def test_pruning_keeps_the_new_round_when_higher_rounds_exist(tmp_path):
    """Old higher-numbered files (an earlier run, an abandoned rollback) sort last; pruning
    goes by the round being written, so the new checkpoint and latest.json stay valid."""
    ck = tmp_path / "ck"
    for r in (50, 60):
        _save(ck, r)
    foreign = ck / "notes.txt"
    foreign.write_text("mine")
    _save(ck, 1, keep=2)
    _save(ck, 2, keep=2)
    assert sorted(p.name for p in ck.glob("round_*")) == [
        "round_00001.json", "round_00001.safetensors", "round_00002.json",
        "round_00002.safetensors"]
    assert load_checkpoint(ck)[1]["round"] == 2 and foreign.read_text() == "mine"


def test_prune_removes_stale_temporaries_but_nothing_else(tmp_path):
    ck = tmp_path / "ck"
    _save(ck, 1)
    for name in ("round_00001.safetensors.tmp", "round_00001.json.tmp", "round_1.json",
                 "round_00001.jsonx", "keep.safetensors"):
        (ck / name).write_text("x")
    (ck / "round_00000.json").mkdir()  # a folder with a checkpoint name is not a file
    _save(ck, 2, keep=1)
    assert prune_checkpoints(ck, 2, 1) == []
    assert sorted(os.listdir(ck)) == sorted([
        "latest.json", "round_00002.json", "round_00002.safetensors", "round_1.json",
        "round_00001.jsonx", "keep.safetensors", "round_00000.json"])


def test_missing_latest_is_file_not_found(tmp_path):
    (tmp_path / "ck").mkdir()
    with pytest.raises(FileNotFoundError, match="latest.json missing"):
        load_checkpoint(tmp_path / "ck")
