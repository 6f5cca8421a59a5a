"""The object API: ``Experiment.from_config(cfg, dir)``, ``run``, ``history``, ``model()``,
``save``, ``Experiment.load``; a run split over calls and a reload equals one ``run_experiment``."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from fedforge.core.checkpoint import load_checkpoint
from fedforge.experiment.config import load_config
from fedforge.experiment.runner import Experiment, run_experiment
from fedforge.study.plots import read_metrics

REPO = Path(__file__).resolve().parents[2]
QUICK = REPO / "examples" / "quickstart.toml"
SHORT = ["rounds=3", "eval.every=1", "client.local_steps=2", "client.local_epochs=null",
         "checkpoint.every=10"]


def _equal(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_run_history_model_save_load_and_resume(tmp_path):
    cfg = load_config(QUICK, SHORT)
    exp = Experiment.from_config(cfg, tmp_path / "a")
    assert exp.history == [] and exp.rounds_done == 0
    assert _equal(dict(exp.model().state_dict()), exp.initial_params())  # before any round

    recs = exp.run(2)
    assert [r["round"] for r in recs] == [1, 2] and exp.history == recs
    assert exp.rounds_done == 2
    model = exp.model()
    assert isinstance(model, torch.nn.Module) and model is not exp.network
    tensors, meta = load_checkpoint(tmp_path / "a" / "checkpoints")
    assert meta["round"] == 2
    assert _equal(dict(model.state_dict()), tensors["params"])  # the checkpoint's params
    # the model is the evaluated one: FedAvg evaluates the global params as they are
    with torch.no_grad():
        pred = model(exp.data.test_x).argmax(-1)
    n = len(exp.data.test_y)  # the record holds a float32 mean: compare counts
    assert int((pred == exp.data.test_y).sum()) == round(recs[-1]["test_accuracy"] * n)

    saved = exp.save()
    assert saved == tmp_path / "a" / "model.safetensors"
    assert _equal(load_file(saved), tensors["params"])

    again = Experiment.load(tmp_path / "a")
    assert again.rounds_done == 2 and again.history == recs
    assert _equal(dict(again.model().state_dict()), tensors["params"])
    assert again.cfg.rounds == 3  # the folder keeps the planned rounds, not run(2)'s
    assert [r["round"] for r in again.run(1)] == [3]
    assert again.run() == []  # run() goes to cfg.rounds: nothing left

    # one uninterrupted run of 3 rounds draws the same rounds: the same final model
    full = run_experiment(cfg, tmp_path / "b", progress=False)
    final, _ = load_checkpoint(tmp_path / "b" / "checkpoints")
    assert _equal(dict(again.model().state_dict()), final["params"])
    assert again.history[-1]["test_accuracy"] == full[-1]["test_accuracy"]
    assert read_metrics(tmp_path / "a" / "metrics.jsonl") == again.history


def test_run_n_then_run_continues_to_the_configs_rounds(tmp_path):
    """``run(n)`` does not rewrite the config: a later ``run()`` still ends at cfg.rounds."""
    exp = Experiment.from_config(load_config(QUICK, SHORT), tmp_path / "a")
    assert [r["round"] for r in exp.run(2)] == [1, 2]
    assert exp.cfg.rounds == 3
    assert [r["round"] for r in exp.run()] == [3]
    assert exp.run() == []


def test_object_api_errors_name_what_is_missing(tmp_path):
    exp = Experiment.from_config(load_config(QUICK, SHORT))
    with pytest.raises(ValueError, match="out_dir"):
        exp.run(1)
    with pytest.raises(FileNotFoundError, match="config.resolved.toml"):
        Experiment.load(tmp_path)
    with pytest.raises(ValueError, match="rounds: expected at least 1"):
        Experiment.from_config(load_config(QUICK, SHORT), tmp_path / "c").run(0)
