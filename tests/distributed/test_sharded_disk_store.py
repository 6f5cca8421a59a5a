"""The disk client store sharded by client id over 2 gloo ranks.

By hand: rank r keeps clients r, r+2, ... in its own folder ``clients/rank<r>``; gather,
scatter, the full layout and a checkpoint record (each rank its own segments) are exact. A
2-rank SCAFFOLD run on the disk store, stopped and resumed on 2 ranks, logs what a 2-rank run
on the in-memory store logs and ends with the same model; one process cannot resume it.
"""

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from fedforge.core.checkpoint import CheckpointError, load_checkpoint
from fedforge.engine.distributed import ShardedDiskClientStore, make_client_store
from fedforge.experiment.runner import run_experiment
from fedforge.study.labels import without_wall_clock
from tests.distributed.test_sharded_state import _cfg, _init, _leave, _spawn

N = 7  # odd: the shards differ in length (4 and 3 rows)


def _full() -> torch.Tensor:
    return torch.arange(N * 2, dtype=torch.float32).view(N, 2)


def _store_worker(rank, port, root, path):
    _init(rank, port)
    store = make_client_store(N, {"c": {"w": torch.zeros(2)}}, kind="disk",
                              directory=f"{root}/clients", root=root)
    assert isinstance(store, ShardedDiskClientStore)
    store.load_state_dict({"c/w": _full()})
    store.commit(1)  # every row is committed at version 1
    ids = torch.tensor([0, 3, 4, 6])
    got = store.gather(ids)["c"]["w"]  # every rank sees the whole cohort
    store.scatter(ids, {"c": {"w": -got}})
    record = store.record(2)  # each rank writes only its changed rows
    untouched = store.gather(torch.tensor([1, 5]))["c"]["w"]
    full = store.state_dict()
    if rank == 0:
        save_file({"rows": torch.tensor([store.num_rows()]), "gathered": got,
                   "full": full["c/w"], "untouched": untouched}, path)
        Path(root, "record.json").write_text(json.dumps(record))
    store.close()
    _leave()


def test_sharded_disk_store_by_hand(tmp_path):
    path = tmp_path / "out.safetensors"
    _spawn(_store_worker, str(tmp_path), str(path))
    out = load_file(path)
    assert int(out["rows"]) == 4  # clients 0, 2, 4, 6
    ids = torch.tensor([0, 3, 4, 6])
    assert torch.equal(out["gathered"], _full()[ids])
    want = _full()
    want[ids] = -want[ids]
    assert torch.equal(out["full"], want)  # both ranks' writes
    assert torch.equal(out["untouched"], _full()[[1, 5]])
    record = json.loads((tmp_path / "record.json").read_text())
    assert (record["world"], record["version"]) == (2, 2)
    # version 2 changed clients 0 and 4 on rank 0 (its 4-row segment is <= twice that: one
    # merged segment) and client 3 on rank 1 (its 3 rows are > twice 1: a segment apart)
    assert [[s["rows"] for s in segs] for segs in record["ranks"]] == [[4], [3, 1]]
    for r in (0, 1):
        names = {p.name for p in (tmp_path / "clients" / f"rank{r}").glob("segment_*")}
        assert names >= {s["file"] for s in record["ranks"][r]}  # pruned by the driver


def _run_worker(rank, port, out, *overrides):
    _init(rank, port)
    torch.set_num_threads(1)
    cfg = _cfg("engine.name=distributed", "engine.chunk_size=2", *overrides)
    run_experiment(cfg, out, resume="resume" in out, progress=False)
    _leave()


def _metrics(run):
    return [without_wall_clock(json.loads(x)) for x in (run / "metrics.jsonl").read_text()
            .splitlines()]


@pytest.mark.slow
def test_two_ranks_on_disk_resume_like_two_ranks_in_memory(tmp_path):
    memory, disk = tmp_path / "memory", tmp_path / "disk_resume"
    _spawn(_run_worker, str(memory), "engine.client_store=memory")
    _spawn(_run_worker, str(disk), "engine.client_store=disk", "rounds=1")
    _spawn(_run_worker, str(disk), "engine.client_store=disk")
    assert _metrics(disk) == _metrics(memory)
    (a, _), (b, meta) = load_checkpoint(memory / "checkpoints"), load_checkpoint(
        disk / "checkpoints")
    for k in a["params"]:
        assert torch.equal(a["params"][k], b["params"][k]), k
    assert meta["store"]["world"] == 2 and len(meta["store"]["ranks"]) == 2
    assert (disk / "clients" / "rank1").is_dir()
    with pytest.raises(CheckpointError, match="written by 2 ranks; resume it with as many"):
        run_experiment(_cfg("rounds=3", "engine.client_store=disk"), disk, resume=True,
                       progress=False)
