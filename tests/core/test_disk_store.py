"""The disk client store against the in-memory one, by hand: rows, slots, budget, segments.

Every check has a value where a wrong store differs: random rows of several dtypes (a
float written as another dtype, a row written to a neighbour's slot, a client read before
its first write as anything but the template would all fail), slot counts, open-file
counts under a tiny cache budget, and the rows a restore must bring back or drop.
"""

from __future__ import annotations

import pytest
import torch

from fedforge.core.disk_store import DiskClientStore
from fedforge.core.store import (
    ClientStore,
    StateStore,
    choose_store,
    record_kind,
    template_nbytes,
)
from fedforge.core.tree import flatten_dict

N = 12


def _template() -> dict:
    return {"scaffold": {"c": {"w": torch.arange(6.0).reshape(2, 3), "b": torch.tensor(-1.5)}},
            "none": {},
            "ef": {"r": torch.ones(4, dtype=torch.float64),
                   "half": torch.full((3,), 0.25, dtype=torch.bfloat16)},
            "count": torch.tensor(7, dtype=torch.int32), "on": torch.tensor(True)}


def _values(ids: torch.Tensor, g: torch.Generator) -> dict:
    c = ids.numel()
    return {"scaffold": {"c": {"w": torch.randn(c, 2, 3, generator=g),
                               "b": torch.randn(c, generator=g)}},
            "none": {},
            "ef": {"r": torch.randn(c, 4, generator=g, dtype=torch.float64),
                   "half": torch.randn(c, 3, generator=g).to(torch.bfloat16)},
            "count": torch.randint(0, 100, (c,), generator=g, dtype=torch.int32),
            "on": torch.rand(c, generator=g) > 0.5}


def _equal(a: dict, b: dict) -> bool:
    fa, fb = flatten_dict(a), flatten_dict(b)
    return list(fa) == list(fb) and all(
        fa[k].dtype == fb[k].dtype and torch.equal(fa[k], fb[k]) for k in fa)


def _play(stores, rounds: int, seed: int = 0, cohort: int = 4) -> None:
    g = torch.Generator().manual_seed(seed)
    for _ in range(rounds):
        ids = torch.randperm(N, generator=g)[:cohort]
        got = [s.gather(ids) for s in stores]
        assert all(_equal(got[0], x) for x in got[1:])
        values = _values(ids, g)
        for s in stores:
            s.scatter(ids, values)


def test_disk_store_is_a_state_store_and_matches_memory_bit_for_bit(tmp_path):
    memory = ClientStore(N, _template())
    disk = DiskClientStore(N, _template(), tmp_path / "clients")
    assert isinstance(disk, StateStore) and isinstance(memory, StateStore)
    assert disk.nbytes_per_client() == memory.nbytes_per_client() == 24 + 4 + 32 + 6 + 4 + 1
    _play([memory, disk], rounds=6)
    assert _equal(memory.state_dict(), disk.state_dict())
    assert _equal(memory.state, disk.state)
    everyone = torch.arange(N)
    assert _equal(memory.gather(everyone), disk.gather(everyone))
    assert list(disk.gather(everyone)) == list(_template())  # the nesting, empty tables too
    disk.close()


def test_unwritten_clients_read_as_the_template_and_cost_no_row(tmp_path):
    disk = DiskClientStore(N, _template(), tmp_path / "clients")
    assert disk.allocated() == 0 and not list((tmp_path / "clients").iterdir())
    g = torch.Generator().manual_seed(3)
    disk.scatter(torch.tensor([5, 2]), _values(torch.tensor([5, 2]), g))
    assert disk.allocated() == 2
    assert disk.has_rows(torch.arange(N)).tolist() == [i in (2, 5) for i in range(N)]
    row = disk.gather(torch.tensor([0, 11]))
    for key, value in flatten_dict(_template()).items():
        assert torch.equal(flatten_dict(row)[key], value.expand(2, *value.shape)), key
    # rewriting a client reuses its slot
    disk.scatter(torch.tensor([2]), _values(torch.tensor([2]), g))
    assert disk.allocated() == 2
    disk.close()


def test_a_stateless_algorithm_writes_nothing(tmp_path):
    disk = DiskClientStore(N, {"fedavg": {}}, tmp_path / "clients")
    disk.scatter(torch.tensor([1, 2]), {"fedavg": {}})
    assert disk.empty and disk.gather(torch.tensor([1])) == {"fedavg": {}}
    assert disk.commit(3) == {"version": 3, "segments": []}
    assert not (tmp_path / "clients").exists()


def test_open_files_stay_within_the_cache_budget(tmp_path):
    # 64 KiB rows, a 1 MiB budget: files of 4 rows, at most 4 of them open at once
    template = {"x": torch.zeros(16384)}
    disk = DiskClientStore(400, template, tmp_path / "clients", cache_mb=1)
    assert (disk.rows_per_file, disk.max_open) == (4, 4)
    g = torch.Generator().manual_seed(0)
    memory = ClientStore(400, template)
    for _ in range(5):
        ids = torch.randperm(400, generator=g)[:20]
        values = {"x": torch.randn(20, 16384, generator=g)}
        disk.scatter(ids, values)
        memory.scatter(ids, values)
        assert len(disk._open) <= 4
    ids = torch.randperm(400, generator=g)[:50]
    assert _equal(disk.gather(ids), memory.gather(ids))
    assert len(disk._open) <= 4
    assert disk.state == {}  # 400 x 64 KiB is over the budget: no whole-population view
    assert len(list((tmp_path / "clients").glob("live_*.rows"))) == -(-disk.allocated() // 4)
    disk.close()


def test_both_stores_checkpoint_and_restore_through_the_protocol(tmp_path):
    """The checkpoint half: the memory store's rows are the checkpoint's tensors and it
    records nothing; the disk store keeps no tensors and records its segments. Either
    restores the checkpointed rows over later writes, and ``None`` is the initial state."""
    stores = [ClientStore(N, _template()), DiskClientStore(N, _template(), tmp_path / "c")]
    _play(stores, rounds=3)
    at1 = {k: v.clone() for k, v in stores[0].state_dict().items()}
    saved = []
    for s in stores:
        tensors, record = s.checkpoint(1)
        saved.append(({k: v.clone() for k, v in tensors.items()}, record))
        assert record_kind(record) == s.kind
    assert saved[0][1] is None and saved[1][0] == {} and saved[1][1]["version"] == 1
    _play(stores, rounds=2, seed=1)
    fresh = ClientStore(N, _template()).state_dict()
    for s, (tensors, record) in zip(stores, saved, strict=True):
        s.restore_checkpoint(tensors, record, tmp_path / "round_00001.json", version=1)
        assert _equal(s.state_dict(), at1)
        s.restore_checkpoint(None)
        assert _equal(s.state_dict(), fresh)
        assert s.collect([record]) == []
        s.close()


def test_commit_writes_only_changed_rows_and_restore_drops_later_writes(tmp_path):
    folder = tmp_path / "clients"
    disk = DiskClientStore(N, _template(), folder)
    g = torch.Generator().manual_seed(1)
    first = torch.tensor([0, 1, 2, 3])
    disk.scatter(first, _values(first, g))
    meta1 = disk.commit(1)
    assert [s["rows"] for s in meta1["segments"]] == [4]
    at1 = disk.state_dict()
    disk.scatter(torch.tensor([9]), _values(torch.tensor([9]), g))
    meta2 = disk.commit(2)
    # 1 new row is kept apart from the 4 (merged only while the older holds <= twice as many)
    assert [(s["file"], s["rows"]) for s in meta2["segments"]] == [
        ("segment_00001_00001.safetensors", 4), ("segment_00002_00002.safetensors", 1)]
    disk.scatter(torch.tensor([9, 3]), _values(torch.tensor([9, 3]), g))
    meta3 = disk.commit(3)  # 2 rows: merged with the 1-row segment, then the 4-row one
    assert [(s["file"], s["rows"]) for s in meta3["segments"]] == [
        ("segment_00001_00003.safetensors", 5)]
    at3 = disk.state_dict()
    disk.scatter(torch.tensor([5]), _values(torch.tensor([5]), g))  # after the checkpoint
    disk.close()

    again = DiskClientStore(N, _template(), folder)
    again.restore(meta3)
    assert _equal(again.state_dict(), at3) and again.allocated() == 5
    again.restore(meta1)  # an older checkpoint: later segments are deleted
    assert _equal(again.state_dict(), at1)
    assert sorted(p.name for p in folder.glob("segment_*")) == ["segment_00001_00001.safetensors"]
    again.restore(None)
    assert again.allocated() == 0 and not list(folder.glob("segment_*"))
    again.close()


def test_collect_keeps_the_segments_of_kept_checkpoints(tmp_path):
    folder = tmp_path / "clients"
    disk = DiskClientStore(N, _template(), folder)
    g = torch.Generator().manual_seed(2)
    metas = []
    for v, ids in enumerate(([0, 1, 2, 3], [4], [5, 6]), start=1):
        ids = torch.tensor(ids)
        disk.scatter(ids, _values(ids, g))
        metas.append(disk.commit(v))
    names = lambda m: {s["file"] for s in m["segments"]}  # noqa: E731
    record = {"kind": "disk", "version": 2, "world": 1, "ranks": [metas[1]["segments"]]}
    assert disk.collect([record]) == []  # checkpoints 2 and 3 kept: nothing to delete
    deleted = disk.collect([])  # only the last one kept
    assert {p.name for p in deleted} == names(metas[1]) - names(metas[2])
    assert {p.name for p in folder.glob("segment_*")} == names(metas[2])
    disk.close()


@pytest.mark.parametrize(("setting", "per_client", "expected"), [
    ("auto", 25, "memory"),  # 10 x 25 = 250 bytes: exactly a quarter of 1000
    ("auto", 26, "disk"),  # 260 bytes: over it
    ("auto", 0, "memory"),  # no state at all
    ("memory", 10**9, "memory"),
    ("disk", 1, "disk"),
])
def test_auto_picks_memory_up_to_a_quarter_of_the_available_memory(setting, per_client,
                                                                    expected):
    assert choose_store(setting, 10, per_client, available=1000)[0] == expected


def test_unknown_setting_is_one_line():
    with pytest.raises(ValueError, match=r"^engine\.client_store: expected .*'tape'$"):
        choose_store("tape", 1, 1)


def test_template_nbytes_counts_every_leaf():
    assert template_nbytes(_template()) == 24 + 4 + 32 + 6 + 4 + 1
    assert template_nbytes({"a": {}}) == 0
