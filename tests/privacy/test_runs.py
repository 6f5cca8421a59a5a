"""Private runs end to end: refusals at config time, engine parity, float64, the ε budget."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

pytest.importorskip("dp_accounting", reason="needs the privacy extra (dp-accounting)")

from fedforge.core.store import ClientStore  # noqa: E402
from fedforge.engine.local import classification_loss  # noqa: E402
from fedforge.engine.round import RoundSetup, federated_round  # noqa: E402
from fedforge.experiment.build import sample_round  # noqa: E402
from fedforge.experiment.config import ConfigError, EngineConfig, load_config  # noqa: E402
from fedforge.experiment.runner import Experiment, run_experiment  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
BASE = ["data.options.num_clients=12", "server.clients_per_round=4", "client.batch_size=8"]


def _cfg(*overrides: str):
    return load_config(ROOT / "examples/quickstart.toml", [*BASE, *overrides])


@pytest.mark.parametrize(("overrides", "message"), [
    (["algorithm.name=scaffold", "privacy.mode=central"],
     "privacy.mode: 'central' is ill-defined for algorithm 'scaffold'"),
    (["algorithm.name=feddyn", "privacy.mode=local"],
     "privacy.mode: 'local' is ill-defined for algorithm 'feddyn'"),
    (["algorithm.name=topk_ef", "privacy.mode=central"], "'topk_ef': it needs an uplink codec"),
    (["algorithm.name=fedptr_s", "privacy.mode=sample"], "ill-defined for algorithm 'fedptr_s'"),
    (["server.aggregator=median", "privacy.mode=central"], "server.aggregator: 'median'"),
    (["divergence=rollback", "privacy.mode=sample"], "divergence: 'rollback'"),
    (["divergence=skip_client", "privacy.mode=central"], "divergence: 'skip_client'"),
    (["client.local_epochs=null", "client.local_steps=3", "privacy.mode=sample"],
     "privacy.mode: 'sample' needs client.local_epochs"),
])
def test_refused_at_config_time_in_one_line(overrides, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")) as err:
        _cfg(*overrides, "privacy.noise_multiplier=1.0")
    assert "\n" not in str(err.value)


def test_missing_noise_and_target_is_refused():
    with pytest.raises(ConfigError, match="^privacy: set noise_multiplier or target_epsilon"):
        _cfg("privacy.mode=central")


def test_scaffold_runs_with_sample_level_dp():
    # DP-SGD privatises every gradient, so control variates are post-processing
    cfg = _cfg("algorithm.name=scaffold", "privacy.mode=sample", "privacy.noise_multiplier=1.0")
    assert cfg.privacy.mode == "sample"


def _metrics(run_dir: Path) -> list[dict]:
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _two_rounds(cfg, engine_name: str):
    """Two private rounds with one engine -> (params, server state, last cohort)."""
    from fedforge.engine import build_engine

    exp = Experiment.from_config(cfg)
    engine = build_engine(EngineConfig(name=engine_name), allow_processes=False)
    loss_fn = classification_loss(exp.network)
    params = exp.initial_params()
    state = exp.algorithm.server_init(params)
    store = ClientStore(exp.data.num_clients, exp.algorithm.client_init(params))
    for t in (1, 2):
        setup = RoundSetup(exp.algorithm, engine, loss_fn, store, exp.data.train_x,
                           exp.data.train_y)
        params, state, cohort = federated_round(setup, params, state, sample_round(exp, t))
    return params, state, cohort


@pytest.mark.parametrize("mode", ["central", "local", "sample"])
def test_loop_and_vmap_engines_agree(mode):
    """The engines share the pure local round, so the noise (keyed per client) is the same
    and the models agree to float tolerance; without the privacy hook they would not move
    identically to a non-private run (checked: the models differ from one)."""
    extra = ["privacy.adaptive=true", "privacy.count_noise=2.0"] if mode == "central" else []
    cfg = _cfg(f"privacy.mode={mode}", "privacy.noise_multiplier=0.8", "privacy.clip=0.5",
               *extra)
    loop, loop_state, loop_cohort = _two_rounds(cfg, "loop")
    vmap, vmap_state, vmap_cohort = _two_rounds(cfg, "vmap")
    for k in loop:
        torch.testing.assert_close(loop[k], vmap[k], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(loop_state["privacy"]["clip"], vmap_state["privacy"]["clip"])
    torch.testing.assert_close(loop_cohort.metrics.loss, vmap_cohort.metrics.loss,
                               rtol=1e-5, atol=1e-6)
    plain, _, _ = _two_rounds(_cfg("privacy.mode=off"), "loop")
    assert any(not torch.allclose(loop[k], plain[k], atol=1e-4) for k in loop)


def test_target_epsilon_stops_the_run_within_budget(tmp_path):
    cfg = _cfg("rounds=40", "eval.every=5", "privacy.mode=central",
               "privacy.noise_multiplier=0.7", "privacy.target_epsilon=8.0")
    run_experiment(cfg, tmp_path / "run", progress=False)
    records = _metrics(tmp_path / "run")
    from fedforge.privacy.algorithm import resolve

    mech = resolve(cfg.privacy, 40, 4, 12, None)
    last = mech.last_round(40)
    assert 0 < last < 40
    assert records[-1]["round"] == last
    assert records[-1]["dp_epsilon"] <= 8.0 < mech.epsilon(last + 1)


def test_target_epsilon_alone_chooses_sigma():
    cfg = _cfg("rounds=20", "privacy.mode=central", "privacy.target_epsilon=4.0")
    exp = Experiment.from_config(cfg)
    mech = exp.algorithm.privacy
    assert mech.epsilon(20) <= 4.0 < mech.epsilon(21)  # calibrated for exactly 20 rounds


def test_poisson_cohorts_vary_and_keep_rate_q():
    exp = Experiment.from_config(_cfg("privacy.mode=central", "privacy.noise_multiplier=1.0"))
    sizes = [sample_round(exp, t).size for t in range(1, 301)]
    assert len(set(sizes)) > 3  # the cohort size varies
    assert sum(sizes) / len(sizes) == pytest.approx(4.0, rel=0.1)  # q N = 4 / 12 · 12


@pytest.fixture
def float64_default():
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(old)


@pytest.mark.parametrize("mode", ["central", "local", "sample"])
def test_float64_runs_stay_float64(float64_default, mode):
    extra = ["privacy.adaptive=true", "privacy.count_noise=2.0"] if mode == "central" else []
    exp = Experiment.from_config(_cfg(f"privacy.mode={mode}", "privacy.noise_multiplier=1.0",
                                      *extra))
    loss_fn = classification_loss(exp.network)
    params = exp.initial_params()
    state = exp.algorithm.server_init(params)
    store = ClientStore(exp.data.num_clients, exp.algorithm.client_init(params))
    for t in (1, 2):
        setup = RoundSetup(exp.algorithm, exp.engine, loss_fn, store, exp.data.train_x,
                           exp.data.train_y)
        params, state, cohort = federated_round(setup, params, state, sample_round(exp, t))
    assert {v.dtype for v in params.values()} == {torch.float64}
    assert state["privacy"]["clip"].dtype == torch.float64
    assert {v.dtype for v in cohort.mean_delta.values()} == {torch.float64}


def test_an_empty_poisson_cohort_still_releases_noise():
    """q N = 1 of 12 clients: round 6 of seed 0 draws nobody. Central DP still adds the noise
    (the model moves) and the accountant counts the round."""
    exp = Experiment.from_config(_cfg("server.clients_per_round=1", "privacy.mode=central",
                                      "privacy.noise_multiplier=1.0"))
    draw = sample_round(exp, 6)
    assert draw.size == 0
    loss_fn = classification_loss(exp.network)
    params = exp.initial_params()
    state = exp.algorithm.server_init(params)
    store = ClientStore(exp.data.num_clients, exp.algorithm.client_init(params))
    setup = RoundSetup(exp.algorithm, exp.engine, loss_fn, store, exp.data.train_x,
                       exp.data.train_y)
    new, state, cohort = federated_round(setup, params, state, draw)
    moved = torch.cat([(new[k] - params[k]).flatten() for k in params])
    assert float(moved.std()) == pytest.approx(1.0 * 1.0 / 1.0, rel=0.2)  # σC/(qN), qN = 1
    assert int(state["privacy"]["rounds"]) == 1 and cohort.metrics.steps.numel() == 0
