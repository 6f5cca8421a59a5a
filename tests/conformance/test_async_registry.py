"""Conformance of the multi-task drivers over the whole registry.

For every registered algorithm (a new one is covered without editing this file) and each
multi-task driver (the buffered asynchronous server under FedAST and FedBuff, the Sync-ST
synchronous multi-task rounds), exactly one of:

* the driver serves the algorithm, and a run stopped at a random number of updates and
  resumed equals an uninterrupted run bit for bit (events, metrics, last checkpoint);
* the driver does not serve it, and loading the config refuses it in one line naming the
  algorithm and the driver, before anything runs.

The sync-driver counterpart is ``test_registry.py``.
"""

from __future__ import annotations

import json
import random
import zlib
from pathlib import Path

import pytest
import torch

from fedforge.algorithms import ALGORITHMS, build_algorithm
from fedforge.core.checkpoint import load_checkpoint
from fedforge.core.tree import flatten_dict
from fedforge.experiment.config import ConfigError, load_config
from fedforge.experiment.runner import run_experiment
from fedforge.schedulers.serves import driver_serves
from fedforge.study.labels import without_wall_clock

UPDATES, EVERY = 30, 5  # total client updates; a checkpoint every EVERY updates
CONFIG = f"""
name = "async-conformance"
max_updates = {UPDATES}
[system]
num_clients = 12
available_fraction = 0.5
[async]
requests = 4
rb_ratio = 2
variance_window = 2
[sync]
k = 3
clients_per_round = 8
[checkpoint]
every = {EVERY}
keep = 20
[eval]
max_test_samples = 200
[[tasks]]
data = {{dataset = "synthetic", partition = "iid", num_clients = 12, options = {{num_clients = 6}}}}
model = {{name = "logreg"}}
algorithm = {{name = "fedavg"}}
client = {{batch_size = 5, local_steps = 2}}
eval_every = 1
[[tasks]]
data = {{dataset = "synthetic", partition = "iid", num_clients = 12, options = {{num_clients = 6}}}}
model = {{name = "logreg"}}
algorithm = {{name = "fedavg"}}
client = {{batch_size = 5, local_steps = 2}}
step_time = 2.0
eval_every = 1
"""
METHODS = ("fedast", "fedbuff", "sync_st")
# the default suite: FedAvg served by every driver, a server optimizer (FedAdam) under
# FedBuff's staleness weights, a codec (SAFL) served by Sync-ST and refused by FedAST, control
# variates (SCAFFOLD) served by Sync-ST and refused by the asynchronous ones; CI=true runs the
# whole registry
FAST = {*((m, "fedavg") for m in METHODS), ("fedbuff", "fedadam"), ("sync_st", "safl"),
        ("fedast", "safl"), *((m, "scaffold") for m in METHODS)}
NAMES = sorted(ALGORITHMS)
CASES = [pytest.param(n, m, marks=[] if (m, n) in FAST else [pytest.mark.slow], id=f"{n}-{m}")
         for n in NAMES for m in METHODS]


@pytest.fixture(scope="module")
def cfg_path(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("cfg") / "mt.toml"
    path.write_text(CONFIG)
    return path


def _served(name: str, method: str) -> bool:
    return not build_algorithm(name).needs({"w": torch.zeros(2)}) - driver_serves(method)[1]


def _stop(name: str, method: str) -> int:
    """A random update count to stop at (fixed per pair, so a failure reproduces)."""
    return random.Random(zlib.crc32(f"{name}/{method}".encode())).randint(1, UPDATES - 1)


def _lines(path: Path) -> list[dict]:
    return [without_wall_clock(json.loads(line)) for line in path.read_text().splitlines()]


@pytest.mark.parametrize(("name", "method"), CASES)
def test_served_and_resumed_bit_for_bit_or_refused_in_one_line(cfg_path, tmp_path, name,
                                                               method):
    overrides = [f"method={method}", f"tasks.algorithm.name={name}"]
    if not _served(name, method):
        with pytest.raises(ConfigError) as err:
            load_config(cfg_path, overrides)
        message = str(err.value)
        driver = driver_serves(method)[0]
        assert "\n" not in message and message.startswith("tasks[0].algorithm.name: ")
        assert repr(build_algorithm(name).name) in message and f"{method} {driver}" in message
        return
    whole, parts = tmp_path / "whole", tmp_path / "parts"
    run_experiment(load_config(cfg_path, overrides), whole, progress=False)
    stop = _stop(name, method)
    run_experiment(load_config(cfg_path, [*overrides, f"max_updates={stop}"]), parts,
                   progress=False)
    run_experiment(load_config(cfg_path, overrides), parts, resume=True, progress=False)
    assert _lines(parts / "events.jsonl") == _lines(whole / "events.jsonl")
    metrics = _lines(whole / "metrics.jsonl")
    assert metrics and _lines(parts / "metrics.jsonl") == metrics
    a = flatten_dict(load_checkpoint(whole / "checkpoints")[0])
    b = flatten_dict(load_checkpoint(parts / "checkpoints")[0])
    assert list(a) == list(b)
    for key in a:
        assert torch.equal(a[key], b[key]), f"{name}/{method}: {key} differs after a stop at {stop}"


def test_every_pair_is_decided():
    """Both outcomes occur: the suite is not vacuous on either side."""
    outcomes = {_served(n, m) for n in NAMES for m in METHODS}
    assert outcomes == {True, False}
    assert _served("fedavg", "fedast") and not _served("scaffold", "fedbuff")
    assert _served("safl", "sync_st") and not _served("safl", "fedast")


@pytest.mark.parametrize(("name", "refused"), [("fedavg", False), ("fedprox", False),
                                               ("fedadam", True), ("fedavg_server_momentum", True),
                                               ("fedyogi", True)])
def test_fedasync_refuses_a_server_optimizer_its_mixing_would_drop(cfg_path, name, refused):
    overrides = ["method=fedasync", f"tasks.algorithm.name={name}"]
    if not refused:
        assert load_config(cfg_path, overrides).method == "fedasync"
        return
    with pytest.raises(ConfigError) as err:
        load_config(cfg_path, overrides)
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith("tasks[0].algorithm.name:")
    assert f"'{name}'" in msg and "FedAsync" in msg
