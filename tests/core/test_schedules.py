"""Schedules: values at chosen rounds against hand numbers, config syntax, errors, and that a
resumed run continues every schedule (client and server side) where it stopped."""

import math

import pytest
import torch
from safetensors.torch import load_file

from fedforge.core.schedules import (
    Constant,
    Cosine,
    Exponential,
    Step,
    Warmup,
    as_schedule,
    value_at,
    values,
)
from fedforge.experiment.config import apply_overrides, validate
from fedforge.experiment.runner import run_experiment
from fedforge.study.labels import without_wall_clock


def test_constant():
    s = as_schedule(0.3)
    assert isinstance(s, Constant) and s.is_constant
    assert values(s, [1, 7, 1000]) == [0.3, 0.3, 0.3]
    assert value_at(s, None) == 0.3  # a constant needs no round


def test_exponential_is_fednar_code_lr():
    # code: l_t = 0.01 * 0.998**(t+1), t = 0, 1, ... (0-based) == ours at 1-based round t+1
    s = as_schedule({"schedule": "exponential", "init": 0.01, "gamma": 0.998})
    assert isinstance(s, Exponential)
    got = values(s, [1, 2, 10, 500])
    want = [0.00998, 0.0099600400, 0.01 * 0.998**10, 0.01 * 0.998**500]
    assert got == pytest.approx(want, rel=1e-12)
    assert got[3] == pytest.approx(0.0036751, rel=1e-4)  # 0.998^500 = 0.36751


def test_cosine():
    s = as_schedule({"kind": "cosine", "init": 0.1, "rounds": 100, "final": 0.02})
    # final + (init - final)(1 + cos(pi t / T)) / 2
    assert values(s, [0, 25, 50, 100, 150]) == pytest.approx(
        [0.1, 0.02 + 0.08 * (1 + math.sqrt(0.5)) / 2, 0.06, 0.02, 0.02], abs=1e-12)


def test_step_every_and_milestones():
    every = as_schedule({"kind": "step", "init": 1.0, "factor": 0.5, "every": 10})
    assert values(every, [1, 9, 10, 25, 30]) == [1.0, 1.0, 0.5, 0.25, 0.125]
    miles = as_schedule({"kind": "step", "init": 0.1, "factor": 0.1, "milestones": [5, 8]})
    assert values(miles, [4, 5, 7, 8, 100]) == pytest.approx([0.1, 0.01, 0.01, 0.001, 0.001])


def test_warmup_then_schedule():
    s = as_schedule({"kind": "warmup", "init": 0.2, "rounds": 4,
                     "then": {"kind": "exponential", "init": 0.2, "gamma": 0.5}})
    assert isinstance(s, Warmup)
    # 0.2 t / 4 for t < 4, then 0.2 * 0.5**t
    assert values(s, [1, 2, 3, 4, 5]) == pytest.approx([0.05, 0.1, 0.15, 0.2 / 16, 0.2 / 32])
    plain = as_schedule({"kind": "warmup", "init": 0.2, "rounds": 4})
    assert values(plain, [2, 4, 9]) == pytest.approx([0.1, 0.2, 0.2])


def test_callable_and_tensor_rounds():
    s = as_schedule(lambda t: 1.0 / (1.0 + t))
    assert values(s, [0, 1, 3]) == pytest.approx([1.0, 0.5, 0.25])
    # schedules take the round as a tensor (what the engine broadcasts), also batched
    t = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64)
    assert Exponential(2.0, 0.5)(t).tolist() == [1.0, 0.5, 0.25]
    assert Step(1.0, 0.1, milestones=(2,))(t).tolist() == pytest.approx([1.0, 0.1, 0.1])
    assert Cosine(1.0, 2)(t).tolist() == pytest.approx([0.5, 0.0, 0.0])


@pytest.mark.parametrize("spec, msg", [
    ({"kind": "linear"}, "schedule kind 'linear' unknown"),
    ({"schedule": "exponential", "init": 0.1}, "bad options"),
    ({"kind": "step", "init": 1.0, "factor": 0.1}, "exactly one of 'every' and 'milestones'"),
    ({"kind": "exponential", "schedule": "exponential", "init": 1, "gamma": 1}, "not both"),
    (True, "expected a number or a schedule"),
    ("fast", "expected a number, a schedule dict or a callable"),
])
def test_bad_schedule_names_the_field(spec, msg):
    with pytest.raises(ValueError, match=msg) as err:
        as_schedule(spec, "local_lr")
    assert str(err.value).startswith("local_lr:")


# ------------------------------------------------------------------ resume keeps the position
BASE = {
    "seed": 1, "rounds": 6,
    "data": {"dataset": "synthetic", "partition": "natural",
             "options": {"num_clients": 10, "alpha": 0.5, "beta": 0.5}},
    "model": {"name": "logreg"},
    "algorithm": {"name": "fedadam", "adam_rule": "fednar_code",
                  "server_lr": {"schedule": "step", "init": 0.05, "factor": 0.5, "every": 2},
                  "tau": {"schedule": "exponential", "init": 0.01, "gamma": 0.5}},
    "client": {"batch_size": 8, "local_steps": 3, "nar": True, "max_grad_norm": 0.5,
               "lr": {"schedule": "exponential", "init": 0.2, "gamma": 0.7},
               "weight_decay": {"schedule": "cosine", "init": 0.1, "rounds": 6}},
    "server": {"clients_per_round": 4},
    "eval": {"every": 2},
    "checkpoint": {"every": 2},
}


def _cfg(*over):
    return validate(apply_overrides(BASE, list(over)))


def test_resume_keeps_schedule_position(tmp_path):
    full = run_experiment(_cfg(), tmp_path / "full", progress=False)
    run_experiment(_cfg("rounds=4"), tmp_path / "r", progress=False)  # "crash" after round 4
    resumed = run_experiment(_cfg(), tmp_path / "r", resume=True, progress=False)
    assert [without_wall_clock(r) for r in resumed] == [without_wall_clock(r) for r in full]
    a = load_file(str(tmp_path / "full" / "checkpoints" / "round_00006.safetensors"))
    b = load_file(str(tmp_path / "r" / "checkpoints" / "round_00006.safetensors"))
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=0)
    assert float(a["server/opt/count"]) == 6.0  # the server's schedule clock is checkpointed
    # the position matters: restarting the schedules at round 1 after round 4 gives other numbers
    const = run_experiment(_cfg("client.lr=0.2", "client.weight_decay=0.1"), tmp_path / "c",
                           progress=False)
    assert const[-1]["test_loss"] != full[-1]["test_loss"]
