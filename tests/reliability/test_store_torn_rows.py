"""The disk client store never checkpoints a torn row, and never loses a checkpoint to a bad one.

A positioned read or write may move fewer bytes than asked (a disk full for a moment, a
signal): the store asks for the rest, so the run equals the untorn one bit for bit, or it
stops with one line naming the file (a disk that stays full). A checkpoint's segment chain
is checked whole (names, order, versions, SHA-256) before anything in the folder is
deleted: a lowered ``store.version`` or a reversed, dropped or repeated entry is refused in
one line naming the checkpoint, and the checkpoint still resumes once its JSON is restored.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from fedforge.core.checkpoint import CheckpointError
from fedforge.core.disk_store import DiskClientStore
from fedforge.experiment.config import load_config
from fedforge.experiment.runner import run_experiment
from fedforge.study.labels import without_wall_clock

ROOT = Path(__file__).resolve().parents[2]
OVERRIDES = ["rounds=3", "eval.every=1", "checkpoint.every=1", "data.options.num_clients=8",
             "server.clients_per_round=3", "client.batch_size=5", "client.local_epochs=null",
             "client.local_steps=2", "eval.per_client=false", "engine.name=vmap",
             "algorithm.name=scaffold", "engine.client_store=disk"]


def _cfg(*extra: str):
    return load_config(ROOT / "examples/quickstart.toml", [*OVERRIDES, *extra])


def _outcome(run: Path) -> tuple[list[dict], dict]:
    """The run's metrics and its last checkpoint's store record (segment names, SHA-256s)."""
    metrics = [without_wall_clock(json.loads(x))
               for x in (run / "metrics.jsonl").read_text().splitlines()]
    meta = json.loads((run / "checkpoints" / "round_00003.json").read_text())
    return metrics, meta["store"]


@pytest.fixture(scope="module")
def untorn(tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("untorn") / "run"
    run_experiment(_cfg(), run, progress=False)
    return run


def _short_once(monkeypatch, name: str, at: int, then_full: bool = False) -> dict:
    """Make call ``at`` of ``os.<name>`` move only part of the row's first leaf (the rest
    of its bytes untouched); ``then_full``: every later call fails as a full disk does."""
    real, calls = getattr(os, name), {"n": 0}

    def short(fd: int, buffers: list, offset: int) -> int:
        calls["n"] += 1
        if then_full and calls["n"] > at:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        if calls["n"] == at:
            first = np.asarray(buffers[0])
            return real(fd, [first[:max(1, first.size // 3)]], offset)
        return real(fd, buffers, offset)

    monkeypatch.setattr(os, name, short)
    return calls


@pytest.mark.parametrize("call", ["pwritev", "preadv"])
def test_a_short_row_transfer_is_finished_and_the_run_equals_the_untorn_one(
        untorn, tmp_path, monkeypatch, call):
    """Case D5: a live row written (or read) in part once, in round 2 of 3."""
    calls = _short_once(monkeypatch, call, at=4)
    run = tmp_path / "run"
    run_experiment(_cfg(), run, progress=False)
    assert calls["n"] > 4  # the short call happened, and the run went on
    assert _outcome(run) == _outcome(untorn)


def test_a_disk_that_stays_full_stops_the_run_naming_the_live_file(tmp_path, monkeypatch):
    _short_once(monkeypatch, "pwritev", at=4, then_full=True)
    run = tmp_path / "run"
    with pytest.raises(OSError) as err:
        run_experiment(_cfg(), run, progress=False)
    msg = str(err.value)
    assert "\n" not in msg and "No space left on device" in msg, msg
    assert str(run / "clients" / "live_00000.rows") in msg, msg
    # the round that tore never reached a checkpoint: the last one is round 1's
    assert json.loads((run / "checkpoints" / "latest.json").read_text()) == {
        "checkpoint": "round_00001.json"}


def test_a_full_disk_while_a_segment_is_written_names_the_segment(tmp_path, monkeypatch):
    real = os.fsync

    def full_for_segments(fd: int) -> None:
        if os.readlink(f"/proc/self/fd/{fd}").endswith(".safetensors.tmp"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real(fd)

    monkeypatch.setattr(os, "fsync", full_for_segments)
    run = tmp_path / "run"
    with pytest.raises(OSError) as err:
        run_experiment(_cfg(), run, progress=False)
    msg = str(err.value)
    assert "\n" not in msg and "No space left on device" in msg, msg
    assert str(run / "clients" / "segment_00001_00001.safetensors.tmp") in msg, msg


def _resume(run: Path) -> None:
    run_experiment(_cfg("rounds=4"), run, resume=True, progress=False)


def _refused(run: Path, match: str) -> None:
    with pytest.raises(CheckpointError) as err:
        _resume(run)
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith(str(run / "checkpoints" / "round_00003.json"))
    assert match in msg, msg


@pytest.fixture
def run(untorn, tmp_path) -> Path:
    copy = tmp_path / "run"
    shutil.copytree(untorn, copy, symlinks=True)
    return copy


def test_a_lowered_store_version_deletes_nothing_and_the_checkpoint_still_resumes(run):
    """Case D11: ``store.version`` 3 -> 2 is refused before the round-3 segment is deleted."""
    path = run / "checkpoints" / "round_00003.json"
    text = path.read_text()
    meta = json.loads(text)
    assert meta["store"]["version"] == 3
    meta["store"]["version"] = 2
    path.write_text(json.dumps(meta))
    before = sorted(p.name for p in (run / "clients").glob("segment_*"))
    assert any(name.endswith("_00003.safetensors") for name in before)
    _refused(run, 'store "version" is 2, but the checkpoint was written at 3')
    assert sorted(p.name for p in (run / "clients").glob("segment_*")) == before
    path.write_text(text)
    _resume(run)  # the restored JSON is the checkpoint it was
    assert json.loads((run / "checkpoints" / "latest.json").read_text()) == {
        "checkpoint": "round_00004.json"}


def test_a_null_store_record_names_the_checkpoint(run):
    path = run / "checkpoints" / "round_00003.json"
    meta = json.loads(path.read_text())
    meta["store"] = None
    path.write_text(json.dumps(meta))
    with pytest.raises(ValueError) as err:
        _resume(run)
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith(f"{run / 'checkpoints'}: checkpoint field 'store'")
    assert "is null" in msg, msg


def test_a_null_stores_record_of_a_multitask_run_names_the_checkpoint(tmp_path):
    """``"stores": null`` would start every task's disk store afresh, without a word."""
    from tests.schedulers.test_multitask_store import CONFIG

    path = tmp_path / "mt.toml"
    path.write_text(CONFIG)
    run = tmp_path / "run"
    run_experiment(load_config(path, ["engine.client_store=disk", "max_updates=10"]), run,
                   progress=False)
    meta_path = run / "checkpoints" / json.loads(
        (run / "checkpoints" / "latest.json").read_text())["checkpoint"]
    meta = json.loads(meta_path.read_text())
    assert [s["kind"] for s in meta["driver"]["stores"]] == ["disk", "disk"]
    meta["driver"]["stores"] = None
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(ValueError) as err:
        run_experiment(load_config(path, ["engine.client_store=disk", "max_updates=15"]), run,
                       resume=True, progress=False)
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith(f"{meta_path}: \"stores\" must be a list"), msg


# ---------------------------------------------------------------- the chain, by hand
N = 12


def _chain(folder: Path) -> tuple[DiskClientStore, dict]:
    """A store whose checkpoint chain has three segments (12, 4 and 1 rows: none merged)."""
    store = DiskClientStore(N, {"c": torch.zeros(3)}, folder)
    g = torch.Generator().manual_seed(0)
    for version, ids in enumerate((range(12), range(4), range(1)), start=1):
        ids = torch.tensor(list(ids))
        store.scatter(ids, {"c": torch.randn(ids.numel(), 3, generator=g)})
        meta = store.commit(version)
    assert [s["rows"] for s in meta["segments"]] == [12, 4, 1]
    return store, meta


@pytest.mark.parametrize("edit", ["reversed", "first dropped", "middle dropped",
                                  "last dropped", "repeated"])
def test_a_chain_out_of_order_is_refused_before_anything_is_deleted(tmp_path, edit):
    folder = tmp_path / "clients"
    store, meta = _chain(folder)
    rows = store.state_dict()
    segs = meta["segments"]
    edited = {"reversed": segs[::-1], "first dropped": segs[1:],
              "middle dropped": [segs[0], segs[2]], "last dropped": segs[:2],
              "repeated": [*segs, segs[2]]}[edit]
    files = {p.name: p.read_bytes() for p in folder.iterdir() if p.name.startswith("segment")}
    where = tmp_path / "round_00003.json"
    with pytest.raises(CheckpointError) as err:
        store.restore({"version": 3, "segments": edited}, where)
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith(f"{where}: "), msg
    assert {p.name: p.read_bytes() for p in folder.iterdir()
            if p.name.startswith("segment")} == files
    store.restore(meta, where)  # the recorded chain still rebuilds the rows
    got = store.state_dict()
    assert all(torch.equal(got[k], rows[k]) for k in rows)
    store.close()


def test_a_chain_after_a_commit_without_changes_has_no_gap(tmp_path):
    """A version where no row changed is covered by the next segment, so every chain the
    store writes passes the check above."""
    store = DiskClientStore(N, {"c": torch.zeros(3)}, tmp_path / "clients")
    store.scatter(torch.arange(12), {"c": torch.ones(12, 3)})
    store.commit(1)
    store.commit(2)  # nothing changed
    store.scatter(torch.tensor([5]), {"c": torch.full((1, 3), 2.0)})
    meta = store.commit(3)
    assert [s["file"] for s in meta["segments"]] == [
        "segment_00001_00001.safetensors", "segment_00002_00003.safetensors"]
    store.restore(meta)
    assert torch.equal(store.state_dict()["c"][5], torch.full((3,), 2.0))
    store.close()
