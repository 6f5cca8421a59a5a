"""FedNAR's six backbones: one config switch (``client.nar``) turns NAR on and off for each;
the FedAdam server rule of the FedNAR code versus the textbook rule, against hand numbers."""

import math

import pytest
import torch

from fedforge.algorithms import build_algorithm
from fedforge.experiment.config import ConfigError, apply_overrides, validate
from fedforge.experiment.metrics import evaluated
from fedforge.experiment.runner import run_experiment
from fedforge.server.optimizers import server_adam

F64 = torch.float64
BACKBONES = {  # the note's server rules (FedNAR release scripts)
    "fedavg": {},
    "fedprox": {"mu": 0.001},
    "scaffold": {},
    "fedexp": {"eps": 0.0},
    "fedadam": {"server_lr": 0.1, "adam_rule": "fednar_code",
                "tau": {"schedule": "exponential", "init": 0.01, "gamma": 0.998**2}},
    "fedavgm": {"server_momentum": 0.9},
}
BASE = {
    "seed": 0, "rounds": 2,
    "data": {"dataset": "synthetic", "partition": "natural",
             "options": {"num_clients": 8, "alpha": 1.0, "beta": 1.0}},
    "model": {"name": "logreg"},
    "client": {"batch_size": 10, "local_steps": 3, "max_grad_norm": 1.0, "weight_decay": 0.5,
               "lr": {"schedule": "exponential", "init": 0.05, "gamma": 0.998}},
    "server": {"clients_per_round": 4},
    "eval": {"every": 2, "per_client": False},
    "checkpoint": {"every": 2},
}


def _cfg(name, *over):
    raw = {**BASE, "algorithm": {"name": name, **BACKBONES[name]}}
    return validate(apply_overrides(raw, list(over)))


@pytest.mark.parametrize("name", sorted(BACKBONES))
def test_backbone_runs_with_and_without_nar(name, tmp_path):
    runs = {}
    for nar in ("true", "false"):
        cfg = _cfg(name, f"client.nar={nar}")
        runs[nar] = run_experiment(cfg, tmp_path / nar, progress=False)[-1]
        assert math.isfinite(runs[nar]["test_loss"])
    # the switch reaches the local optimizer: NAR and vanilla differ on the same seed
    assert runs["true"]["test_loss"] != runs["false"]["test_loss"]
    resolved = (tmp_path / "true" / "config.resolved.toml").read_text()
    assert "nar = true" in resolved


def test_client_switch_equals_algorithm_hparam(tmp_path):
    a = run_experiment(_cfg("fedavg", "client.nar=true"), tmp_path / "a", progress=False)
    raw = {**BASE, "algorithm": {"name": "fedavg", "nar": True, "weight_decay": 0.5,
                                 "max_grad_norm": 1.0,
                                 "local_lr": {"kind": "exponential", "init": 0.05,
                                              "gamma": 0.998}},
           "client": {"batch_size": 10, "local_steps": 3}}
    b = run_experiment(validate(raw), tmp_path / "b", progress=False)
    assert [r["test_loss"] for r in evaluated(a)] == [r["test_loss"] for r in evaluated(b)]


def test_client_nar_unsupported_or_duplicated_is_a_named_error():
    raw = {**BASE, "algorithm": {"name": "feddyn"}, "client": {"nar": True}}
    with pytest.raises(ConfigError, match=r"^client.nar: algorithm 'feddyn' does not support"):
        validate(raw)
    raw = {**BASE, "algorithm": {"name": "fedavg", "weight_decay": 0.1}}
    with pytest.raises(ConfigError, match=r"^client.weight_decay: also given as algorithm"):
        validate(raw)
    raw = {**BASE, "algorithm": {"name": "fedavg"}, "client": {"lr": {"kind": "linear"}}}
    with pytest.raises(ConfigError, match=r"local_lr: schedule kind 'linear' unknown"):
        validate(raw)


def test_nar_needs_sgd_family_client_optimizer():
    with pytest.raises(ValueError, match="nar: FedNAR needs an SGD-family"):
        build_algorithm("fedavg", client_optimizer="adam", nar=True)


# ------------------------------------------------------------------ FedAdam: two rules
def _two_rounds(rule, tau):
    opt = server_adam(0.1, 0.9, 0.99, tau, rule=rule)
    params = {"w": torch.zeros(2, dtype=F64)}
    state = opt.init(params)
    out = []
    for g in ([1.0, -2.0], [0.5, 0.5]):  # pseudo-gradients Δ = x - mean x_i
        upd, state = opt.update({"w": torch.tensor(g, dtype=F64)}, state, params)
        out.append(upd["w"].tolist())
    return out


def test_fedadam_textbook_rule_hand_numbers():
    """Reddi et al.: m = .9m + .1Δ, v = .99v + .01Δ², x += -η m / (sqrt(v) + τ).

    Round 1: m = (.1, -.2), v = (.01, .04): -.1 (.1/.11, -.2/.21).
    Round 2: m = (.14, -.13), v = (.0124, .0421).
    """
    r1, r2 = _two_rounds("textbook", 0.01)
    assert r1 == pytest.approx([-0.1 * 0.1 / 0.11, 0.1 * 0.2 / 0.21], rel=1e-12)
    assert r1 == pytest.approx([-0.0909090909, 0.0952380952], rel=1e-9)
    assert r2 == pytest.approx([-0.1 * 0.14 / (math.sqrt(0.0124) + 0.01),
                                0.1 * 0.13 / (math.sqrt(0.0421) + 0.01)], rel=1e-12)


def test_fedadam_fednar_code_rule_hand_numbers():
    """FedNAR code: m = .9m + .1Δ, v = .99v + .01 m² (m, not Δ), x += η (m/.1)/sqrt(v/.01 + ε).

    Round 1: m = (.1, -.2), v = (1e-4, 4e-4): -.1 (1/sqrt(.01 + ε), -2/sqrt(.04 + ε)).
    Round 2: m = (.14, -.13), v = (.000295, .000565): -.1 (1.4/sqrt(.0295 + ε), ...).
    """
    r1, r2 = _two_rounds("fednar_code", 0.01)
    assert r1 == pytest.approx([-0.1 / math.sqrt(0.02), 0.2 / math.sqrt(0.05)], rel=1e-12)
    assert r1 == pytest.approx([-0.7071067812, 0.8944271910], rel=1e-9)
    assert r2 == pytest.approx([-0.14 / math.sqrt(0.0395), 0.13 / math.sqrt(0.0665)], rel=1e-12)
    # decaying ε_t = 0.01 · 0.25^t (code: ε_0 γ^{2t}, γ² = 0.25): ε_1 = .0025, ε_2 = .000625
    r1, r2 = _two_rounds("fednar_code", {"kind": "exponential", "init": 0.01, "gamma": 0.25})
    assert r1 == pytest.approx([-0.1 / math.sqrt(0.0125), 0.2 / math.sqrt(0.0425)], rel=1e-12)
    assert r2 == pytest.approx([-0.14 / math.sqrt(0.030125), 0.13 / math.sqrt(0.057125)],
                               rel=1e-12)


def test_fedadam_rule_is_validated():
    with pytest.raises(ValueError, match="adam_rule: expected 'textbook' or 'fednar_code'"):
        build_algorithm("fedadam", adam_rule="code")
