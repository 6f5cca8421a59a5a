"""The disk client store over the whole registry: the same run as the in-memory store, bit for bit.

For every registered algorithm (a new one is covered without editing this file), on a tiny
problem: a run with ``engine.client_store = "disk"``, stopped after a round and resumed,
logs the metrics of an uninterrupted in-memory run and ends with the same parameters, server
state and every client's state; clients never sampled read as the algorithm's initial state.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from fedforge.algorithms import ALGORITHMS, build_algorithm
from fedforge.core.checkpoint import load_checkpoint
from fedforge.core.disk_store import DiskClientStore
from fedforge.core.tree import flatten_dict
from fedforge.experiment.config import load_config
from fedforge.experiment.runner import Experiment, run_experiment
from fedforge.study.labels import without_wall_clock

ROOT = Path(__file__).resolve().parents[2]
ROUNDS, CLIENTS = 3, 8
BASE = [
    f"rounds={ROUNDS}", "eval.every=1", "checkpoint.every=1", "checkpoint.keep=2",
    f"data.options.num_clients={CLIENTS}", "server.clients_per_round=2", "client.batch_size=5",
    "client.local_epochs=null", "client.local_steps=2", "eval.per_client=false",
    "engine.name=vmap",
]


def _cfg(name: str, *extra: str):
    full = ("full_participation" in build_algorithm(name).requires)
    return load_config(ROOT / "examples/quickstart.toml",
                       [*BASE, *([f"server.clients_per_round={CLIENTS}"] if full else []),
                        f"algorithm.name={name}", *extra])


def _metrics(run: Path) -> list[dict]:
    return [without_wall_clock(json.loads(line))
            for line in (run / "metrics.jsonl").read_text().splitlines()]


# the default suite: a stateless, a control-variate, a tracking and a personalised algorithm;
# CI=true runs the whole registry
FAST = {"fedavg", "scaffold", "fadamgc", "ditto"}


@pytest.mark.parametrize("name", [pytest.param(n, marks=[] if n in FAST else [pytest.mark.slow])
                                  for n in sorted(ALGORITHMS)])
def test_disk_store_resumed_equals_memory_store(tmp_path, name):
    memory, disk = tmp_path / "memory", tmp_path / "disk"
    run_experiment(_cfg(name, "engine.client_store=memory"), memory, progress=False)
    run_experiment(_cfg(name, "engine.client_store=disk", "rounds=1"), disk, progress=False)
    run_experiment(_cfg(name, "engine.client_store=auto"), disk, resume=True, progress=False)
    assert _metrics(disk) == _metrics(memory)
    a, meta_a = load_checkpoint(memory / "checkpoints")
    b, meta_b = load_checkpoint(disk / "checkpoints")
    clients = flatten_dict(a.pop("clients", {}))
    assert "clients" not in b and "store" not in meta_a
    a, b = flatten_dict(a), flatten_dict(b)
    assert list(a) == list(b)
    for key in a:
        assert torch.equal(a[key], b[key]), f"{name}: {key} differs"
    # every client's state, rebuilt from the disk checkpoint's segments
    exp = Experiment.from_config(_cfg(name))
    template = exp.algorithm.client_init(exp.initial_params())
    store = DiskClientStore(CLIENTS, template, disk / "clients", root=disk)
    store.restore_record(meta_b["store"])
    assert meta_b["store"]["version"] == ROUNDS
    rows = store.state_dict()
    assert list(rows) == list(clients)
    for key, value in clients.items():
        assert torch.equal(rows[key], value), f"{name}: client state {key} differs"
    # 2 clients a round for 3 rounds: at most 6 of the 8 have rows, the rest read as the
    # template (MARINA trains every client every round: all 8)
    if not store.empty:
        per_round = exp.cfg.server.clients_per_round
        assert 0 < store.allocated() <= min(per_round * ROUNDS, CLIENTS)
        untouched = torch.nonzero(~store.has_rows(torch.arange(CLIENTS))).flatten().tolist()
        assert len(untouched) == CLIENTS - store.allocated()
        for cid in untouched:
            got = flatten_dict(store.gather(torch.tensor([cid])))
            for key, value in flatten_dict(template).items():
                assert torch.equal(got[key][0], value), f"{name}: untouched {cid} {key}"
    store.close()
