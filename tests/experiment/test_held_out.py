"""``eval.held_out``: the one setting for clients that never train, for every dataset.

The held-out clients are excluded by the cohort sampler (not by an empty training set: they
keep their samples), the personalised evaluation fine-tunes and reports them apart, and
out-of-range values are refused in one line naming the field.
"""

from __future__ import annotations

import json

import pytest

from fedforge.experiment.build import Setup, sample_round
from fedforge.experiment.config import validate
from fedforge.experiment.runner import run_experiment

N = 10


def _cfg(**eval_and_more):
    raw = {"rounds": 2, "seed": 3,
           "data": {"dataset": "synthetic", "partition": "iid", "num_clients": N,
                    "options": {"num_clients": 5}},
           "model": {"name": "logreg"}, "algorithm": {"name": "fedavg", "local_lr": 0.1},
           "client": {"batch_size": 4, "local_steps": 2},
           "server": {"clients_per_round": 4}, "engine": {"name": "loop"},
           "eval": {}}
    for section, values in eval_and_more.items():
        raw[section] = {**raw.get(section, {}), **values}
    return validate(raw)


def test_held_out_clients_are_never_drawn_though_they_have_data():
    exp = Setup.from_config(_cfg(eval={"held_out": 3}))
    assert all(len(p) > 0 for p in exp.data.client_indices)  # their data is still theirs
    seen: set[int] = set()
    for t in range(1, 41):
        ids = sample_round(exp, t).client_ids
        assert len(ids) == 4
        seen |= set(ids.tolist())
    assert seen == set(range(N - 3))  # every other client is drawn, none held out
    plain = Setup.from_config(_cfg())
    assert set().union(*(set(sample_round(plain, t).client_ids.tolist()) for t in range(1, 41))) \
        == set(range(N))


def test_personalised_evaluation_finetunes_the_held_out_clients(tmp_path):
    cfg = _cfg(algorithm={"name": "fedavg_ft", "finetune_steps": 1},
               eval={"held_out": 2, "finetune_steps": 3})
    run_experiment(cfg, tmp_path, progress=False)
    last = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()
            ][-1]
    assert {"held_out_personal_accuracy_mean", "held_out_global_accuracy_mean",
            "personal_accuracy_mean"} <= set(last)
    assert not any(k.startswith("unseen_") for k in last)


@pytest.mark.parametrize(("changes", "message"), [
    ({"eval": {"held_out": N}}, r"^eval\.held_out: expected 0 <= n < 10 "),
    ({"eval": {"held_out": 7}}, r"^server\.clients_per_round: 4 is more than the 3 clients "),
    ({"algorithm": {"name": "fedavg_ft", "finetune_steps": 1}, "eval": {"finetune_steps": 2}},
     r"^eval\.finetune_steps: fine-tunes the held-out clients; set eval\.held_out"),
    ({"eval": {"held_out": 2, "finetune_steps": 2}},
     r"^eval\.finetune_steps: needs the personalised evaluation"),
])
def test_out_of_range_values_are_refused_in_one_line(changes, message):
    with pytest.raises(ValueError, match=message) as err:
        Setup.from_config(_cfg(**changes))
    assert "\n" not in str(err.value)


def test_eval_unseen_clients_is_gone():
    with pytest.raises(Exception, match="unseen_clients"):
        _cfg(eval={"unseen_clients": 2})
