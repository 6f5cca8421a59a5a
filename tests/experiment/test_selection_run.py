"""Client samplers in whole runs: the cohorts and what the sampler learnt, recomputed by hand
from the models the rounds started from (SCAFFOLD with Power-of-Choice, FedAvg with Oort on
a clock of two device speeds), and what a sampler refuses when the config loads."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from fedforge.core.checkpoint import load_checkpoint
from fedforge.errors import ConfigError
from fedforge.experiment import drivers
from fedforge.experiment.config import load_config
from fedforge.experiment.runner import Experiment, run_experiment

ROOT = Path(__file__).resolve().parents[2]
N, M, ROUNDS = 8, 3, 3
BASE = [f"rounds={ROUNDS}", f"data.options.num_clients={N}", f"server.clients_per_round={M}",
        "client.batch_size=5", "client.local_epochs=null", "client.local_steps=2",
        "eval.per_client=false", "engine.name=loop"]


@pytest.fixture
def rounds_seen(monkeypatch):
    """Every round's starting model, cohort and sample schedule, as the driver ran them."""
    seen: list[dict] = []
    original = drivers.federated_round

    def spy(setup, params, server_state, draw):
        seen.append({"params": {k: v.clone() for k, v in params.items()},
                     "ids": draw.client_ids.tolist(), "idx": draw.sample_idx, "w": draw.weights})
        return original(setup, params, server_state, draw)

    monkeypatch.setattr(drivers, "federated_round", spy)
    return seen


def _losses(exp, params, indices) -> list[torch.Tensor]:
    """Per-sample cross-entropy of ``params`` on each index set (the test's own forward)."""
    out = []
    for idx in indices:
        logits = torch.func.functional_call(exp.network, params, (exp.data.train_x[idx],))
        out.append(F.cross_entropy(logits.double(), exp.data.train_y[idx], reduction="none"))
    return out


def test_scaffold_with_power_of_choice_trains_the_highest_loss_clients(tmp_path, rounds_seen):
    """d = N: every client is a candidate, so each round's cohort is the M clients with the
    highest mean loss of that round's starting model on their whole data; uniform sampling
    draws other cohorts from the same seed."""
    over = [*BASE, "algorithm.name=scaffold", "server.sampler=power_of_choice",
            f"server.sampler_options.d={N}"]
    cfg = load_config(ROOT / "examples/quickstart.toml", over)
    run_experiment(cfg, tmp_path / "poc", progress=False)
    exp = Experiment.from_config(cfg)
    assert len(rounds_seen) == ROUNDS
    for r in rounds_seen:
        mean = [float(v.mean()) for v in _losses(exp, r["params"], exp.data.client_indices)]
        assert r["ids"] == sorted(np.argsort(mean)[::-1][:M].tolist()), r["ids"]
    poc = [r["ids"] for r in rounds_seen]
    rounds_seen.clear()
    run_experiment(load_config(ROOT / "examples/quickstart.toml",
                               [*BASE, "algorithm.name=scaffold"]), tmp_path / "u",
                   progress=False)
    assert [r["ids"] for r in rounds_seen] != poc


def test_oort_learns_utility_and_duration_from_each_round(tmp_path, rounds_seen):
    """On a straggler clock with constant delays and two speed classes (x1 and x10), after
    the run each client's Oort reward is |B_i| sqrt(mean loss²) of the model of the round it
    last trained in, on the samples it trained on, and its duration the clock's seconds:
    steps x step time x speed."""
    over = [*BASE, "algorithm.name=fedavg", "server.sampler=oort", "sim.stragglers=true",
            "sim.delay=constant", "sim.step_time_s=1.0", "sim.bandwidth_up_mbps=1e9",
            "sim.bandwidth_down_mbps=1e9", "sim.speed_classes=[[0.5, 1.0], [0.5, 10.0]]"]
    cfg = load_config(ROOT / "examples/quickstart.toml", over)
    run_experiment(cfg, tmp_path / "oort", progress=False)
    state = load_checkpoint(tmp_path / "oort" / "checkpoints")[0]["sampler"]
    exp = Experiment.from_config(cfg)
    from fedforge.sim.population import Population

    speed = Population.build(N, [(0.5, 1.0), (0.5, 10.0)], cfg.sim.speed_seed).speed
    last = state["last_round"].tolist()
    assert sorted(set(last) - {0}) == list(range(1, ROUNDS + 1))
    for t, r in enumerate(rounds_seen, start=1):
        visited = [r["idx"][j][r["w"][j] > 0].unique() for j in range(len(r["ids"]))]
        for c, v, loss in zip(r["ids"], visited, _losses(exp, r["params"], visited)):
            if last[c] != t:
                continue
            expected = len(v) * float(loss.square().mean().sqrt())
            assert float(state["reward"][c]) == pytest.approx(expected, rel=1e-6)
            assert float(state["duration"][c]) == pytest.approx(2.0 * speed[c], rel=1e-9)
    assert int(state["count"].sum()) == ROUNDS * M


@pytest.mark.parametrize(("over", "message"), [
    (["privacy.mode=central", "privacy.noise_multiplier=1.0", "server.sampler=oort"],
     r"^server\.sampler: 'oort' picks clients by what they report, which differential"),
    (["server.sampler=fastest"], r"^server\.sampler: unknown sampler 'fastest'"),
    (["server.sampler=power_of_choice", "server.sampler_options.d=2"],
     r"^server\.sampler_options\.d: expected an integer >= server\.clients_per_round"),
])
def test_a_sampler_config_is_checked_when_it_loads(over, message):
    with pytest.raises(ConfigError, match=message) as err:
        load_config(ROOT / "examples/quickstart.toml", [*BASE, *over])
    assert "\n" not in str(err.value)


def test_a_population_run_refuses_a_sampler():
    from fedforge.experiment.config import validate

    raw = {"data": {"dataset": "synthetic_population", "partition": "natural",
                    "num_clients": 40}, "server": {"clients_per_round": 4, "sampler": "oort"},
           "client": {"local_steps": 1}, "eval": {"clients": 10}}
    with pytest.raises(ConfigError, match=r"^server\.sampler: 'oort' keeps a record per "
                                          r"client, and 'synthetic_population' generates"):
        validate(raw)


def test_the_flower_bridge_refuses_a_sampler():
    common = pytest.importorskip("fedforge.flower.common")
    cfg = load_config(ROOT / "examples/quickstart.toml", [*BASE, "server.sampler=oort"])
    with pytest.raises(ConfigError, match=r"^server\.sampler: the Flower bridge samples nodes "
                                          r"uniformly; run 'oort' with `fedforge run`$"):
        common.experiment(cfg)


@pytest.mark.parametrize("sampler", ["power_of_choice", "oort"])
def test_loop_and_vmap_select_the_same_cohorts(tmp_path, rounds_seen, sampler):
    """The engines train to float tolerance, so a sampler reading their losses picks the
    same clients under both, and the runs agree."""
    runs = {}
    for engine in ("loop", "vmap"):
        rounds_seen.clear()
        cfg = load_config(ROOT / "examples/quickstart.toml",
                          [*BASE, "algorithm.name=scaffold", f"server.sampler={sampler}",
                           "rounds=4", f"engine.name={engine}"])
        records = run_experiment(cfg, tmp_path / engine, progress=False)
        runs[engine] = ([r["ids"] for r in rounds_seen], records[-1]["test_accuracy"])
    assert runs["loop"][0] == runs["vmap"][0]
    assert runs["loop"][1] == pytest.approx(runs["vmap"][1], abs=1e-5)
