"""Attack simulation and attacked rounds with hand numbers (quadratic clients).

One FedAvg step with lr 1 and a = 1 moves client i to b_i, so its delta is ``w0 - b_i``.
With w0 = 0 and b = 1..5 (first coordinate; second is 0): deltas = [-1, -2, -3, -4, -5].
Clients 3 and 4 are attackers flipping and scaling by 10: sent = [-1, -2, -3, 40, 50].
Server step x = w0 - aggregate(sent); the honest clients alone would give x = 2.

* mean: (-6 + 90) / 5 = 16.8 -> x = -16.8
* median of sorted [-3, -2, -1, 40, 50]: -1 -> x = 1
* trimmed mean, beta 0.2 (one cut per side, fewer than the two attackers): mean of
  [-2, -1, 40] = 37/3 -> x = -37/3; beta 0.4 (two per side): [-1] -> x = 1
* Krum, f = 1 (2 nearest): scores -1: 1+4, -2: 1+1, -3: 1+4, 40: 100+1681, 50: ... -> -2, x = 2
* Multi-Krum, f = 1, m = 3: mean of -2, -1, -3 -> x = 2
* norm clip at 2: [-1, -2, -2, 2, 2] -> mean -0.2 -> x = 0.2
"""

import pytest
import torch

from fedforge.algorithms import build_algorithm
from fedforge.engine import LoopEngine, VmapEngine
from fedforge.experiment.config import apply_overrides, validate
from fedforge.experiment.runner import Experiment, run_experiment
from fedforge.robust import (
    Attack,
    RobustRound,
    attacker_ids,
    build_aggregator,
    flip_labels,
    poison_updates,
)
from tests.quadratic import run_rounds

ROWS = [[1.0, float(b), 0.0] for b in range(1, 6)]


def _robust(agg, options, kind="sign_flip", scale=10.0):
    return RobustRound(build_aggregator(agg, **options), Attack(kind, 0.4, scale),
                       torch.tensor([3, 4]))


@pytest.mark.parametrize("engine", [LoopEngine, lambda: VmapEngine(chunk_size=2)])
@pytest.mark.parametrize("agg,options,expected", [
    ("mean", {}, -16.8), ("median", {}, 1.0), ("trimmed_mean", {"beta": 0.2}, -37 / 3),
    ("trimmed_mean", {"beta": 0.4}, 1.0), ("krum", {"f": 1}, 2.0),
    ("multi_krum", {"f": 1, "m": 3}, 2.0), ("norm_clip", {"max_norm": 2.0}, 0.2),
])
def test_attacked_round_hand_numbers(engine, agg, options, expected):
    robust = _robust(agg, options)
    eng = engine()
    eng.keep_deltas = True
    params, *_ = run_rounds(build_algorithm("fedavg", local_lr=1.0), ROWS, [0.0, 0.0],
                            engine=eng, robust=robust)
    torch.testing.assert_close(params["w"], torch.tensor([expected, 0.0], dtype=torch.float64))


def test_median_stays_near_the_honest_mean_under_attack():
    torch.manual_seed(0)
    honest = torch.tensor([1.0, -2.0, 0.5]) + 0.05 * torch.randn(16, 3)  # [16, 3]
    is_att = torch.zeros(16, dtype=torch.bool)
    is_att[:4] = True  # 25% attackers, sign flipped and boosted
    sent = poison_updates(Attack("sign_flip", 0.25, 20.0), {"w": honest}, is_att,
                          torch.Generator())["w"]
    w = torch.full((16,), 1 / 16)
    honest_mean = honest[~is_att].mean(0)
    med = build_aggregator("median").aggregate({"w": sent}, w)[0]["w"]
    mean = build_aggregator("mean").aggregate({"w": sent}, w)[0]["w"]
    assert (med - honest_mean).norm() < 0.2 * honest_mean.norm()
    assert (mean - honest_mean).norm() > 3 * honest_mean.norm()


def test_poison_kinds():
    d = {"w": torch.tensor([[1.0, 2.0], [3.0, 4.0]])}
    att = torch.tensor([False, True])
    g = torch.Generator().manual_seed(0)
    assert poison_updates(Attack("sign_flip", 0.5, 2.0), d, att, g)["w"].tolist() == [
        [1.0, 2.0], [-6.0, -8.0]]
    assert poison_updates(Attack("scale", 0.5, 3.0), d, att, g)["w"].tolist() == [
        [1.0, 2.0], [9.0, 12.0]]
    r1 = poison_updates(Attack("random", 0.5, noise_std=0.1), d,
                        att, torch.Generator().manual_seed(5))["w"]
    r2 = poison_updates(Attack("random", 0.5, noise_std=0.1), d,
                        att, torch.Generator().manual_seed(5))["w"]
    assert torch.equal(r1, r2) and r1[0].tolist() == [1.0, 2.0] and r1[1].abs().max() < 1.0
    assert poison_updates(Attack("label_flip", 0.5), d, att, g) is d  # data attack: no-op here


def test_attacker_ids_fixed_fraction_and_label_flip():
    ids = attacker_ids(50, 0.2, seed=3)
    assert ids.numel() == 10 and torch.equal(ids, attacker_ids(50, 0.2, seed=3))
    assert not torch.equal(ids, attacker_ids(50, 0.2, seed=4))
    y = torch.tensor([0, 1, 2, 9, 5, 3])
    flipped = flip_labels(y, [torch.tensor([0, 1]), torch.tensor([2, 3]), torch.tensor([4, 5])],
                          torch.tensor([1]), num_classes=10)
    assert flipped.tolist() == [0, 1, 7, 0, 5, 3] and y.tolist() == [0, 1, 2, 9, 5, 3]


def test_attack_config_errors_name_the_field():
    with pytest.raises(ValueError, match="attack.kind"):
        Attack("backdoor", 0.1)
    with pytest.raises(ValueError, match="attack.fraction"):
        Attack("sign_flip", 1.0)


BASE = {
    "seed": 2, "rounds": 3,
    "data": {"dataset": "synthetic", "partition": "natural",
             "options": {"num_clients": 10, "alpha": 0.5, "beta": 0.5}},
    "model": {"name": "logreg"},
    "algorithm": {"name": "fedavg", "local_lr": 0.05},
    "client": {"batch_size": 8, "local_steps": 2},
    "server": {"clients_per_round": 5},
    "eval": {"every": 3, "per_client": False},
}


def test_config_wires_attack_and_aggregator(tmp_path):
    over = ["server.aggregator=median", "attack.kind=label_flip", "attack.fraction=0.3"]
    cfg = validate(apply_overrides(BASE, over))
    exp = Experiment.from_config(cfg)
    honest = Experiment.from_config(validate(BASE))
    assert exp.engine.keep_deltas and honest.robust is None
    attackers = exp.robust.attackers.tolist()
    assert len(attackers) == 3
    for c in range(10):
        idx = exp.data.client_indices[c]
        same = torch.equal(exp.data.train_y[idx], honest.data.train_y[idx])
        assert same == (c not in attackers)
    a = run_experiment(cfg, tmp_path / "a", progress=False)
    b = run_experiment(cfg, tmp_path / "b", progress=False)
    assert a[-1]["test_accuracy"] == b[-1]["test_accuracy"]  # deterministic


def test_attackers_are_independent_of_round_sampling():
    """Regression: the attacker draw once shared its seed with round 11's cohort draw."""
    from fedforge.experiment.build import round_generator

    for seed in range(3):
        att = attacker_ids(50, 0.2, seed)
        for t in range(1, 200):
            cohort = torch.randperm(50, generator=round_generator(seed, t))[:10].sort().values
            assert not torch.equal(cohort, att), (seed, t)
