"""Per-client state sharded by client id over 2 gloo ranks.

The store test checks the layout by hand (rank r holds clients r, r+2, ...); the run test
checks that a 2-rank SCAFFOLD run (state in every client) writes the same checkpoint as one
process, and that checkpoints resume across world sizes both ways (2 ranks -> 1 process and
1 process -> 2 ranks) to the same model and client states, and that an unfinished first commit
of ``latest.json`` is finished by the writing rank alone.
"""

import json
import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from safetensors.torch import load_file, save_file

from fedforge.core.checkpoint import load_checkpoint
from fedforge.core.tree import flatten_dict
from fedforge.engine.distributed import ShardedClientStore
from fedforge.experiment.config import load_config
from fedforge.experiment.runner import run_experiment
from fedforge.study.labels import without_wall_clock

N = 7  # odd: the shards differ in length (4 and 3 rows)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _spawn(fn, *args) -> None:
    mp.start_processes(fn, args=(_free_port(), *args), nprocs=2, start_method="spawn", join=True)


def _init(rank: int, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE="2", LOCAL_RANK=str(rank))
    dist.init_process_group("gloo", rank=rank, world_size=2)


def _leave() -> None:
    dist.barrier()  # leave together (see test_distributed.py)
    dist.destroy_process_group()
    os._exit(0)


def _full() -> torch.Tensor:
    return torch.arange(N * 2, dtype=torch.float32).view(N, 2)


def _store_worker(rank, port, path):
    _init(rank, port)
    store = ShardedClientStore(N, {"c": {"w": torch.zeros(2)}})
    store.load_state_dict({"c/w": _full()})
    ids = torch.tensor([0, 3, 4, 6])
    got = store.gather(ids)["c"]["w"]  # every rank sees the whole cohort
    store.scatter(ids, {"c": {"w": -got}})
    full = store.state_dict()
    if rank == 0:
        save_file({"rows": torch.tensor([store.num_rows()]), "gathered": got,
                   "full": full["c/w"], "shard": store.state["c"]["w"]}, path)
    _leave()


def test_sharded_store_layout_gather_scatter(tmp_path):
    path = tmp_path / "store.safetensors"
    _spawn(_store_worker, str(path))
    out = load_file(path)
    assert int(out["rows"]) == 4  # clients 0, 2, 4, 6
    ids = torch.tensor([0, 3, 4, 6])
    torch.testing.assert_close(out["gathered"], _full()[ids], rtol=0, atol=0)
    want = _full()
    want[ids] = -want[ids]
    torch.testing.assert_close(out["full"], want, rtol=0, atol=0)  # both ranks' writes
    torch.testing.assert_close(out["shard"], want[0::2], rtol=0, atol=0)


OVERRIDES = ["algorithm.name=scaffold", "rounds=2", "checkpoint.every=1", "eval.every=1",
             "server.clients_per_round=7", "data.options.num_clients=11",
             "client.local_steps=5", "client.local_epochs=null"]


def _cfg(*extra: str):
    return load_config("examples/quickstart.toml", [*OVERRIDES, *extra])


def _run_worker(rank, port, out, *overrides):
    _init(rank, port)
    torch.set_num_threads(1)
    cfg = _cfg("engine.name=distributed", "engine.chunk_size=2", *overrides)
    run_experiment(cfg, out, resume="rounds=3" in overrides, progress=False)
    _leave()


def _assert_same(run_a, run_b):
    ta, tb = (load_checkpoint(run / "checkpoints")[0] for run in (run_a, run_b))
    for part in ("params", "clients"):
        a, b = flatten_dict(ta[part]), flatten_dict(tb[part])
        assert a.keys() == b.keys() and a, part
        for k in b:
            torch.testing.assert_close(a[k], b[k], rtol=1e-5, atol=1e-6, msg=f"{part}/{k}")


def test_two_ranks_shard_state_and_checkpoint_like_one_process(tmp_path):
    two, one = tmp_path / "two", tmp_path / "one"
    _spawn(_run_worker, str(two))
    run_experiment(_cfg("engine.chunk_size=2"), one, progress=False)
    assert load_checkpoint(two / "checkpoints")[1]["round"] == 2
    assert not (two / "rank1" / "checkpoints").exists()  # rank 0 alone writes checkpoints
    _assert_same(two, one)  # parameters and every client's c_i
    # checkpoints keep the one-process layout: resume across world sizes, both ways
    run_experiment(_cfg("rounds=3", "engine.chunk_size=2"), two, resume=True, progress=False)
    _spawn(_run_worker, str(one), "rounds=3")
    assert load_checkpoint(one / "checkpoints")[1]["round"] == 3
    _assert_same(two, one)


def _resume_worker(rank, port, out):
    """Resume on 2 ranks; rank 1 must not write the shared folder's ``latest.json``."""
    import fedforge.experiment.checkpoint as checkpoints

    def refuse(*_args):
        raise AssertionError("rank 1 wrote latest.json")

    _init(rank, port)
    torch.set_num_threads(1)
    if rank == 1:
        checkpoints.commit_latest = refuse
    run_experiment(_cfg("engine.name=distributed", "engine.chunk_size=2", "rounds=3"), out,
                   resume=True, progress=False)
    _leave()


@pytest.mark.slow
def test_two_ranks_finish_an_unfinished_first_commit_once(tmp_path):
    """A kill while the first ``latest.json`` was written: rank 0 alone finishes the commit
    (the ranks share its folder), and the resumed run logs what an uninterrupted one does."""
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    _spawn(_run_worker, str(whole), "rounds=3")  # resume=True on an empty folder: a new run
    _spawn(_run_worker, str(cut), "rounds=2")
    (cut / "checkpoints" / "latest.json").unlink()
    (cut / "checkpoints" / "latest.json.tmp").write_text('{"torn": ')
    _spawn(_resume_worker, str(cut))
    assert load_checkpoint(cut / "checkpoints")[1]["round"] == 3
    _assert_same(cut, whole)
    metrics = [[without_wall_clock(json.loads(x)) for x in (run / "metrics.jsonl")
                .read_text().splitlines()] for run in (cut, whole)]
    assert metrics[0] == metrics[1]
