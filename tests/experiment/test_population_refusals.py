"""Population runs (``synthetic_population``) refuse what needs the whole training set, in
one line naming the field, when the config loads; what they support runs as on a dataset
held in memory (the worker-process engine matches the loop, the cohort's data sent each
round; private Poisson cohorts never
draw a held-out client)."""

from __future__ import annotations

import json

import pytest
import torch

from fedforge.errors import ConfigError
from fedforge.experiment.build import Setup, sample_round
from fedforge.experiment.config import validate
from fedforge.experiment.runner import run_experiment

N, HELD = 60, 20


def _raw(**changes) -> dict:
    raw = {"rounds": 2, "seed": 1,
           "data": {"dataset": "synthetic_population", "partition": "natural",
                    "num_clients": N, "options": {"max_samples_per_client": 60}},
           "model": {"name": "logreg"}, "algorithm": {"name": "fedavg", "local_lr": 0.1},
           "client": {"batch_size": 8, "local_steps": 2}, "server": {"clients_per_round": 5},
           "engine": {"name": "loop"}, "eval": {"clients": 10}}
    for section, values in changes.items():
        raw[section] = {**raw.get(section, {}), **values}
    return raw


@pytest.mark.parametrize(("changes", "field"), [
    ({"attack": {"kind": "label_flip", "fraction": 0.2}}, "attack.kind"),
    ({"algorithm": {"name": "ditto"}}, "eval.personal"),
    ({"eval": {"personal": True}}, "eval.personal"),
])
def test_a_single_task_population_run_refuses(changes, field):
    with pytest.raises(ConfigError) as err:
        validate(_raw(**changes))
    message = str(err.value)
    assert message.startswith(f"{field}: ") and "\n" not in message
    assert "'synthetic_population'" in message


def test_a_multi_task_run_refuses_a_population():
    raw = {"method": "sync_st", "max_updates": 10, "system": {"num_clients": N},
           "tasks": [{"data": {"dataset": "synthetic", "partition": "iid"},
                      "model": {"name": "logreg"}},
                     {"data": {"dataset": "synthetic_population", "partition": "natural"},
                      "model": {"name": "logreg"}}]}
    with pytest.raises(ConfigError, match=r"^tasks\[1\]\.data\.dataset: a multi-task run ") \
            as err:
        validate(raw)
    assert "\n" not in str(err.value)


def test_the_flower_bridge_refuses_a_population():
    common = pytest.importorskip("fedforge.flower.common")
    with pytest.raises(ConfigError, match=r"^data\.dataset: the Flower bridge reads the whole"):
        common.experiment(validate(_raw()))


def test_a_personalised_method_trains_without_its_evaluation(tmp_path):
    run_experiment(validate(_raw(algorithm={"name": "ditto"}, eval={"personal": False})),
                   tmp_path, progress=False)
    assert (tmp_path / "metrics.jsonl").read_text().count("\n") == 2


def _metrics(cfg, out) -> list[dict]:
    run_experiment(cfg, out, progress=False)
    return [{k: v for k, v in json.loads(line).items() if isinstance(v, (int, float))
             and "wall" not in k and "engine" not in k}
            for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_worker_processes_match_the_loop(tmp_path):
    loop = _metrics(validate(_raw(algorithm={"name": "scaffold"})), tmp_path / "loop")
    procs = _metrics(validate(_raw(algorithm={"name": "scaffold"}, engine={"name": "procs"})),
                     tmp_path / "procs")
    assert len(loop) == 2 and [list(r) for r in procs] == [list(r) for r in loop]
    for a, b in zip(procs, loop, strict=True):  # the same cohorts and data; float sums may
        assert a == pytest.approx(b, rel=1e-5)  # differ in the last bits (thread counts)


def test_private_poisson_cohorts_never_draw_held_out_clients():
    cfg = validate(_raw(server={"clients_per_round": 10}, eval={"clients": 10, "held_out": HELD},
                        privacy={"mode": "central", "noise_multiplier": 1.0, "clip": 1.0}))
    exp = Setup.from_config(cfg)
    drawn = torch.cat([sample_round(exp, t).client_ids for t in range(1, 61)])
    assert int(drawn.max()) < N - HELD
    # Poisson at rate q = 10 / (N - HELD) over the clients that train: 60 rounds x 10 expected
    assert abs(len(drawn) - 600) < 4 * (600 * (1 - 10 / (N - HELD))) ** 0.5
