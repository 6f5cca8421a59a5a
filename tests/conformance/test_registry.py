"""Conformance over the whole registry: every algorithm x every driver that claims to serve it.

For each registered algorithm (a new one is covered without editing this file):

* a run stopped at a random round and resumed equals an uninterrupted run bit for bit
  (metrics and final checkpoint), also with random attacks and with straggler rounds;
* rollback after an injected NaN completes;
* the state survives a checkpoint round trip in the model's parameter order;
* an algorithm that needs every client every round refuses a sampled cohort in one line.

The multi-task drivers (FedAST, FedBuff, Sync-ST) are ``test_async_registry.py``.

Loop == vmap for every algorithm is ``tests/engine/test_parity.py``.

The suite's model has no LoRA adapters, so FLoRA runs here as FedAvg; its LoRA rounds (resume
bit for bit, loop = vmap, bytes) need a pretrained model and are
``tests/models/test_flora_lora.py``.
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
from fedforge.engine.base import ChunkedEngine
from fedforge.experiment.config import ConfigError, load_config
from fedforge.experiment.drivers import RoundsDriver, RunFolder, read_checkpoint
from fedforge.experiment.runner import Experiment, run_experiment
from fedforge.study.labels import without_wall_clock

ROOT = Path(__file__).resolve().parents[2]
ROUNDS, CLIENTS = 4, 8
BASE = [
    f"rounds={ROUNDS}", "eval.every=1", "checkpoint.every=1", "checkpoint.keep=10",
    f"data.options.num_clients={CLIENTS}", "server.clients_per_round=3", "client.batch_size=5",
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
                       [*BASE, *_participation(name), f"algorithm.name={name}", *extra])


def _participation(name: str) -> list[str]:
    """Every client every round for an algorithm whose maths needs it (MARINA)."""
    return [] if "full_participation" not in build_algorithm(name).requires else [
        f"server.clients_per_round={CLIENTS}"]


def _stop_round(name: str) -> int:
    return random.Random(zlib.crc32(name.encode())).randint(1, ROUNDS - 1)


def _no_wall(records: list[dict]) -> list[dict]:
    return [without_wall_clock(r) for r in records]


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
    driver = RoundsDriver(exp, RunFolder(run, run / "checkpoints"), verbose=False)
    driver.load_state_dict(*read_checkpoint(driver))
    driver.start()
    loaded, server, store = driver.params, driver.server_state, driver.store
    assert driver.state.round == 2
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


@pytest.mark.parametrize("name", _by_name(NAMES))
def test_sampled_cohort_is_refused_or_served(tmp_path, name):
    """A full-participation algorithm refuses a sampled cohort in one line naming it and the
    driver: when the config is loaded if it gives the client count, else when the run is
    built (natural partitions count clients from the data); every other algorithm loads."""
    sampled = [*BASE, "data.partition=iid", f"data.num_clients={CLIENTS}",
               f"algorithm.name={name}"]
    if "full_participation" not in build_algorithm(name).requires:
        assert load_config(ROOT / "examples/quickstart.toml", sampled).server.clients_per_round == 3
        return
    expected = (rf"^server\.clients_per_round: {name!r} needs every client in every round, "
                rf"which synchronous rounds of 3 of {CLIENTS} clients cannot serve; "
                rf"set server\.clients_per_round = {CLIENTS}$")
    with pytest.raises(ConfigError, match=expected):
        load_config(ROOT / "examples/quickstart.toml", sampled)
    natural = load_config(ROOT / "examples/quickstart.toml", [*BASE, f"algorithm.name={name}"])
    with pytest.raises(ValueError, match=expected):
        run_experiment(natural, tmp_path / "run", progress=False)
    with pytest.raises(ConfigError, match=rf"^sim\.straggler_k: {name!r} needs every client"):
        _cfg(name, "sim.stragglers=true", "sim.straggler_k=2")
