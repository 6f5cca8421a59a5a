"""NaN/Inf detection and the three divergence policies, on the embedded dataset.

Faults are injected two ways: poisoned training samples (a NaN feature: the client's loss,
gradients and update all go NaN) and a hook on the engine that makes one client's update of
one parameter NaN (a bad client update whose loss is finite).
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch

from fedforge.engine.base import ChunkedEngine
from fedforge.engine.draw import RoundDraw
from fedforge.engine.round import RoundSetup, federated_round
from fedforge.experiment.build import resolve_config, sample_round
from fedforge.experiment.config import apply_overrides, dump_config, validate
from fedforge.experiment.runner import Experiment, run_experiment
from fedforge.robust.divergence import DivergenceError
from fedforge.study.labels import without_wall_clock

BASE = {
    "seed": 1,
    "rounds": 6,
    "data": {"dataset": "synthetic", "partition": "natural",
             "options": {"num_clients": 8, "alpha": 0.5, "beta": 0.5}},
    "model": {"name": "logreg"},
    "algorithm": {"name": "fedavg", "local_lr": 0.05},
    "client": {"batch_size": 8, "local_steps": 3},
    "server": {"clients_per_round": 4, "aggregation": "uniform"},  # hand checks: 1/S
    "eval": {"every": 1, "per_client": False},
    "checkpoint": {"every": 1, "keep": 10},
}
POISONED = 6  # client whose samples have a NaN pixel


def _cfg(*over: str):
    return validate(apply_overrides(BASE, list(over)))


def _first_round_with(client: int) -> int:
    exp = Experiment.from_config(_cfg())
    return next(t for t in range(1, 50) if client in sample_round(exp, t).client_ids.tolist())


@pytest.fixture
def poisoned_sample(monkeypatch):
    """Every Experiment built in the test has a NaN pixel in each of client POISONED's samples."""
    original = Experiment.from_config.__func__

    def build(cls, cfg, *args, **kwargs):
        exp = original(cls, cfg, *args, **kwargs)
        exp.data.train_x[exp.data.client_indices[POISONED], 0] = float("nan")
        return exp

    monkeypatch.setattr(Experiment, "from_config", classmethod(build))


def _records(path):
    return [json.loads(x) for x in path.read_text().splitlines()]


def test_stop_names_round_client_and_parameter(tmp_path, poisoned_sample):
    bad_round = _first_round_with(POISONED)
    assert 1 < bad_round <= BASE["rounds"]
    with pytest.raises(DivergenceError) as err:
        run_experiment(_cfg(), tmp_path / "run", progress=False)
    msg = str(err.value)
    assert f"round {bad_round}" in msg and f"client {POISONED}: loss=nan" in msg
    assert "'linear.weight'" in msg and "last good checkpoint" in msg and "\n" not in msg
    # the last good state survives: checkpoint and metrics stop at the round before
    latest = json.loads((tmp_path / "run/checkpoints/latest.json").read_text())
    assert latest["checkpoint"] == f"round_{bad_round - 1:05d}.json"
    assert [r["round"] for r in _records(tmp_path / "run/metrics.jsonl")] == list(
        range(1, bad_round))
    event = _records(tmp_path / "run/divergence.jsonl")[0]
    assert event["round"] == bad_round and event["action"] == "stop"


def test_skip_client_drops_it_with_renormalised_weights(tmp_path, poisoned_sample):
    """The skipped round equals the same round run without the client, weights renormalised."""
    bad_round = _first_round_with(POISONED)
    hist = run_experiment(_cfg("divergence=skip_client"), tmp_path / "run", progress=False)
    assert [r["round"] for r in hist] == list(range(1, BASE["rounds"] + 1))
    assert all(torch.isfinite(torch.tensor(r["test_loss"])) for r in hist)
    events = _records(tmp_path / "run/divergence.jsonl")
    assert events[0] == {"round": bad_round, "policy": "skip_client", "skipped": [POISONED]}

    # hand check of one skipped round: renormalised mean over the other clients
    exp = Experiment.from_config(_cfg())
    from fedforge.core.store import ClientStore
    from fedforge.engine import classification_loss
    loss_fn = classification_loss(exp.network)
    params = exp.initial_params()
    store = ClientStore(exp.data.num_clients, {}, "cpu")
    draw = sample_round(exp, bad_round)
    setup = RoundSetup(exp.algorithm, exp.engine, loss_fn, store, exp.data.train_x,
                       exp.data.train_y)
    res = federated_round(replace(setup, divergence="skip_client"), params,
                          exp.algorithm.server_init(params), draw)
    ids = draw.client_ids
    keep = ids != POISONED
    exp.engine.keep_deltas = True
    ref = federated_round(setup, params, exp.algorithm.server_init(params),
                          RoundDraw(ids[keep], draw.sample_idx[keep], draw.weights[keep],
                                    info=draw.info, round=bad_round))
    assert int(keep.sum()) == len(ids) - 1
    for k in params:
        torch.testing.assert_close(res.params[k], ref.params[k], rtol=0, atol=0)
        # FedAvg: x - (1/3) sum of the three good deltas
        manual = params[k] - ref.cohort.deltas[k].mean(0)
        torch.testing.assert_close(res.params[k], manual, rtol=1e-6, atol=1e-7)


def test_skip_client_with_every_client_bad_stops(tmp_path, monkeypatch):
    original = Experiment.from_config.__func__

    def build(cls, cfg, *args, **kwargs):
        exp = original(cls, cfg, *args, **kwargs)
        exp.data.train_x[:] = float("inf")
        return exp

    monkeypatch.setattr(Experiment, "from_config", classmethod(build))
    with pytest.raises(DivergenceError, match="round 1"):
        run_experiment(_cfg("divergence=skip_client"), tmp_path / "run", progress=False)


@pytest.fixture
def nan_update_once(monkeypatch):
    """The first time round 4 runs, client 0 of the cohort sends a NaN 'linear.bias' update."""
    original = ChunkedEngine.run_cohort
    fired = []

    def run_cohort(self, algorithm, loss_fn, x_all, y_all, inputs):
        out = original(self, algorithm, loss_fn, x_all, y_all, inputs)
        if int(inputs.broadcast["round"]) == 4 and not fired:
            fired.append(1)
            bias = out.mean_delta["linear.bias"].clone()
            bias[0] = float("nan")
            out = out._replace(mean_delta={**out.mean_delta, "linear.bias": bias})
            if out.deltas is not None:
                stacked = out.deltas["linear.bias"].clone()
                stacked[0, 0] = float("nan")
                out = out._replace(deltas={**out.deltas, "linear.bias": stacked})
            else:  # the re-run used to locate the fault must see it too
                fired.clear()
        return out

    monkeypatch.setattr(ChunkedEngine, "run_cohort", run_cohort)
    return fired


def test_nan_update_is_located_to_client_and_parameter(tmp_path, nan_update_once):
    with pytest.raises(DivergenceError) as err:
        run_experiment(_cfg(), tmp_path / "run", progress=False)
    exp = Experiment.from_config(_cfg())
    first = int(sample_round(exp, 4).client_ids[0])
    assert err.value.round == 4
    assert err.value.faults == [(first, "update of 'linear.bias' (1 NaN, 0 Inf)")]


def test_rollback_reloads_last_good_and_lowers_lr(tmp_path, nan_update_once):
    hist = run_experiment(_cfg("divergence=rollback", "checkpoint.every=2"), tmp_path / "run",
                          progress=False)
    assert [r["round"] for r in hist] == list(range(1, 7))
    (event,) = _records(tmp_path / "run/divergence.jsonl")
    assert event["round"] == 4 and event["action"] == "rollback to round 2"
    assert event["lr_scale"] == 0.5
    meta = json.loads((tmp_path / "run/checkpoints/round_00006.json").read_text())
    assert meta["lr_scale"] == 0.5 and meta["rollbacks"] == 1
    # reference: rounds 1-2 at lr 0.05, then a resumed run at lr 0.025 for rounds 3-6
    ref_dir = tmp_path / "ref"
    run_experiment(_cfg("rounds=2", "checkpoint.every=2"), ref_dir, progress=False)
    # a resume refuses a changed learning rate: the saved config must say it was changed
    dump_config(resolve_config(_cfg("checkpoint.every=2", "algorithm.local_lr=0.025")),
                ref_dir / "config.resolved.toml")
    ref = run_experiment(_cfg("checkpoint.every=2", "algorithm.local_lr=0.025"), ref_dir,
                         resume=True, progress=False)
    assert [without_wall_clock(r) for r in hist] == [without_wall_clock(r) for r in ref]


def test_rollback_gives_up_after_max_rollbacks(tmp_path, poisoned_sample):
    with pytest.raises(DivergenceError, match="2 rollbacks"):
        run_experiment(_cfg("divergence=rollback", "max_rollbacks=2"), tmp_path / "run",
                       progress=False)
    actions = [e["action"] for e in _records(tmp_path / "run/divergence.jsonl")]
    assert actions[-1] == "stop" and len(actions) == 3


def test_rollback_needs_numeric_lr():
    from fedforge.experiment.config import ConfigError
    with pytest.raises(ConfigError, match="^divergence: rollback"):
        _cfg("divergence=rollback",
             "algorithm.local_lr={kind: cosine, init: 0.1, final: 0.01, rounds: 6}")
