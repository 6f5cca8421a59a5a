"""Conformance over the whole registry: every algorithm x every driver that claims to serve it.

For each registered algorithm (a new one is covered without editing this file):

* a run stopped at a random round and resumed equals an uninterrupted run bit for bit
  (metrics and final checkpoint), also with random attacks and with straggler rounds;
* rollback after an injected NaN completes;
* the state survives a checkpoint round trip in the model's parameter order;
* the asynchronous driver either serves it or refuses it at build time with one line naming
  the algorithm and the driver.

Loop == vmap for every algorithm is ``tests/engine/test_parity.py``.
"""

from __future__ import annotations

import json
import random
import zlib
from pathlib import Path

import pytest
import torch

from fedforge.algorithms import ALGORITHMS, build_algorithm
from fedforge.core.tree import flatten_dict
from fedforge.engine.base import ChunkedEngine
from fedforge.engine.jobs import ASYNC_SERVES, check_async_support
from fedforge.experiment.checkpoint import load_checkpoint
from fedforge.experiment.config import load_config
from fedforge.experiment.runner import Experiment, restore_or_init, run_experiment

ROOT = Path(__file__).resolve().parents[2]
ROUNDS = 4
BASE = [
    f"rounds={ROUNDS}", "eval.every=1", "checkpoint.every=1", "checkpoint.keep=10",
    "data.options.num_clients=8", "server.clients_per_round=3", "client.batch_size=5",
    "client.local_epochs=null", "client.local_steps=2", "eval.per_client=false",
]
VARIANTS = {
    "plain": [],
    "random_attack": ["attack.kind=random", "attack.fraction=0.34", "server.aggregator=median"],
    "stragglers": ["sim.stragglers=true", "sim.straggler_k=2"],
}
# the default suite checks a stateless, a control-variate, a tracking, a server-stage and two
# codec algorithms; CI=true runs the whole registry
FAST = {"fedavg", "scaffold", "fadamgc", "fedexp", "safl", "fetchsgd"}
NAMES = sorted(ALGORITHMS)


def _params(name: str, variant: str):
    marks = [] if (name in FAST and variant == "plain") else [pytest.mark.slow]
    return pytest.param(name, variant, marks=marks, id=f"{name}-{variant}")


def _by_name(names):
    return [pytest.param(n, marks=[] if n in FAST else [pytest.mark.slow]) for n in names]


def _cfg(name: str, *extra: str):
    return load_config(ROOT / "examples/quickstart.toml",
                       [*BASE, f"algorithm.name={name}", *extra])


def _stop_round(name: str) -> int:
    return random.Random(zlib.crc32(name.encode())).randint(1, ROUNDS - 1)


def _no_wall(records: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in ("wall_s", "prep_s")} for r in records]


def _final_tensors(run: Path) -> dict:
    tensors, _ = load_checkpoint(run / "checkpoints")
    return flatten_dict(tensors)


def _metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


# attackers and stragglers change who is aggregated: every algorithm runs plain; the variants
# run for a stateless, two stateful (control variates, tracking) and a codec algorithm
VARIANT_CASES = [(n, "plain") for n in NAMES] + [
    (n, v) for n in ("fedavg", "scaffold", "fadamgc", "topk_ef") for v in VARIANTS if v != "plain"]


@pytest.mark.parametrize(("name", "variant"), [_params(n, v) for n, v in VARIANT_CASES])
def test_resume_equals_uninterrupted_bit_for_bit(tmp_path, name, variant):
    extra = VARIANTS[variant]
    if variant == "random_attack" and "codec" in build_algorithm(name).needs(
            {"w": torch.zeros(1)}):
        extra = ["attack.kind=random", "attack.fraction=0.34"]  # messages are not deltas
    whole, parts = tmp_path / "whole", tmp_path / "parts"
    run_experiment(_cfg(name, *extra), whole, progress=False)
    stop = _stop_round(name)
    run_experiment(_cfg(name, *extra, f"rounds={stop}"), parts, progress=False)
    run_experiment(_cfg(name, *extra), parts, resume=True, progress=False)
    assert _no_wall(_metrics(parts)) == _no_wall(_metrics(whole))
    a, b = _final_tensors(whole), _final_tensors(parts)
    assert list(a) == list(b)
    for key in a:
        assert torch.equal(a[key], b[key]), f"{name}: {key} differs after resume at {stop}"


@pytest.mark.parametrize("name", _by_name(NAMES))
def test_checkpoint_round_trip_keeps_parameter_order(tmp_path, name):
    run = tmp_path / "run"
    run_experiment(_cfg(name, "rounds=2"), run, progress=False)
    exp = Experiment.from_config(_cfg(name))
    params = exp.initial_params()
    store = _store(exp, params)
    loaded, server, store, meta = restore_or_init(exp, run / "checkpoints", store)
    assert meta["round"] == 2
    assert list(loaded) == list(params)  # the model's order, not the file's
    fresh = exp.algorithm.server_init(params)
    assert list(flatten_dict(server)) == list(flatten_dict(fresh))
    assert list(flatten_dict(store.state)) == list(
        flatten_dict(_store(exp, params).state))
    saved = _final_tensors(run)
    for key, value in flatten_dict(server).items():
        assert torch.equal(value, saved[f"server/{key}"])


def _store(exp, params):
    from fedforge.core.store import ClientStore

    return ClientStore(exp.data.num_clients, exp.algorithm.client_init(params), exp.device)


@pytest.fixture
def nan_once(monkeypatch):
    """Round 3's first cohort run sends a NaN in its first aggregated tensor (once)."""
    original = ChunkedEngine.run_cohort
    fired = []

    def run_cohort(self, algorithm, loss_fn, x_all, y_all, inputs):
        out = original(self, algorithm, loss_fn, x_all, y_all, inputs)
        if int(inputs.broadcast["round"]) == 3 and not fired:
            fired.append(1)
            key = next(iter(out.mean_delta))
            bad = out.mean_delta[key].clone()
            bad.view(-1)[0] = float("nan")
            out = out._replace(mean_delta={**out.mean_delta, key: bad})
        return out

    monkeypatch.setattr(ChunkedEngine, "run_cohort", run_cohort)
    return fired


@pytest.mark.parametrize("name", _by_name(NAMES))
def test_rollback_after_injected_nan(tmp_path, name, nan_once):
    run = tmp_path / "run"
    records = run_experiment(_cfg(name, "divergence=rollback"), run, progress=False)
    assert nan_once == [1]
    assert [r["round"] for r in records] == list(range(1, ROUNDS + 1))
    events = (run / "divergence.jsonl").read_text()
    assert "rollback to round 2" in events


@pytest.mark.parametrize("name", NAMES)
def test_async_driver_serves_or_refuses_at_build_time(name):
    algorithm = build_algorithm(name)
    needs = algorithm.needs({"w": torch.zeros(2)})
    unserved = needs - ASYNC_SERVES
    if not unserved:
        check_async_support(algorithm, {"w": torch.zeros(2)}, "tasks[0].algorithm.name")
        return
    with pytest.raises(ValueError) as err:
        check_async_support(algorithm, {"w": torch.zeros(2)}, "tasks[0].algorithm.name")
    message = str(err.value)
    assert "\n" not in message and name in message and "asynchronous" in message
