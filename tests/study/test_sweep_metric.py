"""A sweep on a per-client metric: selection and the final score use the same metric, and
each client's validation data is carved from its own training data, so no test sample is
seen during selection."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from fedforge.cli import app
from fedforge.experiment.config import load_config
from fedforge.experiment.runner import Experiment

REPO = Path(__file__).resolve().parents[2]
QUICK = REPO / "examples" / "quickstart.toml"
TINY = ["rounds=2", "eval.every=1", "client.local_steps=1", "client.local_epochs=null",
        "checkpoint.every=1", "engine.name=loop"]


def _ids(indices) -> set[int]:
    return {int(i) for part in indices for i in part}


@pytest.mark.parametrize("partition", ["natural", "iid"])
def test_selection_sees_no_test_sample(partition):
    common = [*TINY, "algorithm.name=ditto", f"data.partition={partition}",
              *(["data.num_clients=30"] if partition == "iid" else [])]
    final = Experiment.from_config(load_config(QUICK, common))
    trial = Experiment.from_config(load_config(QUICK, [*common, "eval.client_validation=0.2"]))
    tests, val = final.client_tests, trial.client_tests
    assert torch.equal(trial.data.train_x, final.data.train_x)  # the same samples, split anew
    for i in range(final.data.num_clients):
        kept = set(final.data.client_indices[i].tolist())  # the final run's training samples
        trains, checks = set(trial.data.client_indices[i].tolist()), set(val.indices[i].tolist())
        assert trains | checks == kept and not trains & checks and checks
    if tests.x is final.data.train_x:  # test samples carved from the training data
        assert not _ids(tests.indices) & (_ids(val.indices) | _ids(trial.data.client_indices))
    # every metric of a trial, pooled ones too, is measured on the validation samples
    assert val.x is trial.data.train_x
    pooled = torch.cat([torch.as_tensor(v) for v in val.indices])
    assert torch.equal(trial.data.test_x, trial.data.train_x[pooled])
    assert torch.equal(trial.data.test_y, trial.data.train_y[pooled])


def test_refused_without_the_personalised_evaluation():
    with pytest.raises(ValueError, match="eval.client_validation: needs the personalised"):
        Experiment.from_config(load_config(QUICK, [*TINY, "eval.client_validation=0.2"]))


@pytest.mark.skipif(importlib.util.find_spec("optuna") is None, reason="optuna not installed")
def test_the_final_score_is_the_selection_metric(tmp_path):
    space = tmp_path / "space.toml"
    space.write_text("algorithm.lam = [0.1]\n")
    out = tmp_path / "sweep"
    result = CliRunner().invoke(app, ["sweep", str(QUICK), *TINY, "algorithm.name=ditto",
                                      "--space", str(space), "--sampler", "grid", "--jobs",
                                      "1", "--out", str(out)])
    assert result.exit_code == 0, result.output
    table = json.loads((out / "table.json").read_text())
    assert table["metric"] == "personal_accuracy_mean"  # what ditto is judged by
    assert table["selected_on"].startswith("each client's validation split")
    trial = (out / "trials" / "0" / "config.resolved.toml").read_text()
    assert "client_validation = 0.2" in trial and 'dataset = "synthetic"' in trial
    final = [json.loads(x) for x in (out / "best" / "metrics.jsonl").read_text().splitlines()]
    score = table["final_score"]
    assert score["metric"] == "personal_accuracy_mean"
    assert score["value"] == final[-1]["personal_accuracy_mean"] != table["test"]["test_accuracy"]
    assert "personalised model, each client's held-out data" in score["measured_on"]
    assert "on the validation split" not in result.output
