"""Multi-task synchronous runs keep each task's client state in the run's chosen store.

A Sync-ST run of a stateful algorithm (SCAFFOLD's control variates) gives the same events,
metrics and models with the disk store as with the memory store, and a disk-store run
stopped part-way and resumed equals the uninterrupted one bit for bit, its segments in
``clients/task<m>`` of the run folder.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from fedforge.core.checkpoint import latest_checkpoint_meta, load_checkpoint
from fedforge.core.disk_store import DiskClientStore
from fedforge.core.tree import flatten_dict, unflatten_dict
from fedforge.experiment.config import load_config
from fedforge.experiment.runner import run_experiment
from fedforge.study.labels import without_wall_clock

UPDATES = 30
CONFIG = f"""
name = "mt-store"
method = "sync_st"
max_updates = {UPDATES}
[system]
num_clients = 12
available_fraction = 0.5
[sync]
k = 3
clients_per_round = 8
[checkpoint]
every = 5
keep = 2
[eval]
max_test_samples = 200
[[tasks]]
data = {{dataset = "synthetic", partition = "iid", num_clients = 12, options = {{num_clients = 6}}}}
model = {{name = "logreg"}}
algorithm = {{name = "scaffold"}}
client = {{batch_size = 5, local_steps = 2}}
eval_every = 1
[[tasks]]
data = {{dataset = "synthetic", partition = "iid", num_clients = 12, options = {{num_clients = 6}}}}
model = {{name = "logreg"}}
algorithm = {{name = "scaffold"}}
client = {{batch_size = 5, local_steps = 2}}
step_time = 2.0
eval_every = 1
"""


@pytest.fixture(scope="module")
def cfg_path(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("cfg") / "mt.toml"
    path.write_text(CONFIG)
    return path


def _lines(path: Path) -> list[dict]:
    return [without_wall_clock(json.loads(line)) for line in path.read_text().splitlines()]


def _models(run: Path) -> dict[str, torch.Tensor]:
    """The last checkpoint's tensors but the memory store's rows."""
    flat = flatten_dict(load_checkpoint(run / "checkpoints")[0])
    return {k: v for k, v in flat.items() if "/store/" not in k}


def _run(cfg_path: Path, out: Path, store: str, *extra: str, resume: bool = False) -> None:
    cfg = load_config(cfg_path, [f"engine.client_store={store}", *extra])
    run_experiment(cfg, out, resume=resume, progress=False)


def test_disk_equals_memory_and_resumes_bit_for_bit(cfg_path, tmp_path):
    mem, disk, parts = tmp_path / "mem", tmp_path / "disk", tmp_path / "parts"
    _run(cfg_path, mem, "memory")
    _run(cfg_path, disk, "disk")
    metrics = _lines(mem / "metrics.jsonl")
    assert metrics and _lines(disk / "metrics.jsonl") == metrics
    assert _lines(disk / "events.jsonl") == _lines(mem / "events.jsonl")
    a, b = _models(mem), _models(disk)
    assert list(a) == list(b) and all(torch.equal(a[k], b[k]) for k in a)
    # the memory checkpoint holds the rows; the disk one names each task's segments
    assert any("/store/" in k for k in flatten_dict(load_checkpoint(mem / "checkpoints")[0]))
    stores = latest_checkpoint_meta(disk / "checkpoints")[1]["driver"]["stores"]
    assert [s["kind"] for s in stores] == ["disk", "disk"]
    _same_rows(mem, disk / "clients", stores)

    _run(cfg_path, parts, "disk", "max_updates=13")
    _run(cfg_path, parts, "disk", resume=True)
    assert _lines(parts / "metrics.jsonl") == metrics
    assert _lines(parts / "events.jsonl") == _lines(mem / "events.jsonl")
    c = _models(parts)
    assert all(torch.equal(a[k], c[k]) for k in a)
    _same_rows(mem, parts / "clients",
               latest_checkpoint_meta(parts / "checkpoints")[1]["driver"]["stores"])


def _same_rows(mem: Path, folder: Path, stores: list[dict]) -> None:
    """Each task's disk store, rebuilt from the recorded segments, holds the memory run's
    rows (SCAFFOLD's c_i, written for the clients that trained, so not all the template)."""
    flat = flatten_dict(load_checkpoint(mem / "checkpoints")[0])
    for m, rec in enumerate(stores):
        rows = {k.split("/store/", 1)[1]: v for k, v in flat.items()
                if k.startswith(f"task{m}/store/")}
        template = {k: torch.zeros_like(v[0]) for k, v in rows.items()}
        store = DiskClientStore(12, unflatten_dict(template), folder / f"task{m}", root=folder)
        store.restore_record(rec)
        got = flatten_dict(store.state_dict())
        store.close()
        assert rows and any(bool(v.abs().sum() > 0) for v in rows.values())
        assert list(got) == list(rows) and all(torch.equal(got[k], rows[k]) for k in rows)
