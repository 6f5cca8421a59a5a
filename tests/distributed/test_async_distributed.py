"""FedAST and Sync-ST on 2 gloo ranks equal the one-process run.

Async: rank 0 simulates and scatters each batch of dispatched jobs; the event log must be
the same event for event and the evaluations equal to float tolerance. Sync: every rank runs
the driver and the DistributedEngine splits each task's cohort.
"""

import json
import os
import socket
from pathlib import Path

import pytest
import torch.distributed as dist
import torch.multiprocessing as mp

from fedforge.experiment import drivers
from fedforge.experiment.config import load_config
from fedforge.experiment.runner import run_experiment
from fedforge.schedulers.scatter import serve_jobs
from tests.experiment.test_async_runner import CONFIG

OVERRIDES = ["max_updates=48", "checkpoint.every=1000"]


def _worker(rank, port, cfg_path, method, out):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE="2", LOCAL_RANK=str(rank))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    cfg = load_config(cfg_path, [*OVERRIDES, f"method={method}", "engine.name=distributed"])

    def serve_and_count(tasks):  # proves rank 1 trained shards (async methods)
        served = serve_jobs(tasks)
        (Path(out) / "served_by_rank1.txt").write_text(str(served))
        return served

    drivers.serve_jobs = serve_and_count
    run_experiment(cfg, out, progress=False)
    dist.barrier()
    dist.destroy_process_group()
    os._exit(0)


def _read(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.parametrize("method", ["fedast", "sync_st"])
def test_two_ranks_equal_one_process(method, tmp_path):
    cfg_path = tmp_path / "mt.toml"
    cfg_path.write_text(CONFIG)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    two = tmp_path / "two"
    mp.start_processes(_worker, args=(port, str(cfg_path), method, str(two)), nprocs=2,
                       start_method="spawn", join=True)
    one = tmp_path / "one"
    run_experiment(load_config(cfg_path, [*OVERRIDES, f"method={method}"]), one,
                   progress=False)
    if method == "fedast":
        assert int((two / "served_by_rank1.txt").read_text()) > 0
    assert _read(two / "events.jsonl") == _read(one / "events.jsonl")
    m2, m1 = _read(two / "metrics.jsonl"), _read(one / "metrics.jsonl")
    assert len(m2) == len(m1) > 0
    for a, b in zip(m2, m1):
        assert (a["task"], a["round"], a["updates"]) == (b["task"], b["round"], b["updates"])
        assert a["test_loss"] == pytest.approx(b["test_loss"], rel=1e-5)
        assert a["train_loss"] == pytest.approx(b["train_loss"], rel=1e-5)
        assert a["test_accuracy"] == pytest.approx(b["test_accuracy"], abs=1e-6)
