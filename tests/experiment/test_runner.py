"""Runs end to end on the embedded dataset: determinism, resume, outputs, config errors."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from fedforge.experiment.config import ConfigError, apply_overrides, load_config, validate
from fedforge.experiment.runner import run_experiment
from fedforge.study.labels import without_wall_clock

QUICKSTART = Path(__file__).resolve().parents[2] / "examples" / "quickstart.toml"

BASE = {
    "seed": 3,
    "rounds": 6,
    "data": {"dataset": "synthetic", "partition": "natural",
             "options": {"num_clients": 12, "alpha": 0.5, "beta": 0.5}},
    "model": {"name": "logreg"},
    "algorithm": {"name": "scaffold", "local_lr": 0.05},
    "client": {"batch_size": 8, "local_steps": 3},
    "server": {"clients_per_round": 4},
    "eval": {"every": 2},
    "checkpoint": {"every": 2},
}


def _cfg(**over):
    return validate(apply_overrides(BASE, [f"{k}={v}" for k, v in over.items()]))


def _strip(records):
    return [without_wall_clock(r) for r in records]


def test_outputs_and_same_seed_same_metrics(tmp_path):
    a = run_experiment(_cfg(), tmp_path / "a", progress=False)
    b = run_experiment(_cfg(), tmp_path / "b", progress=False)
    assert _strip(a) == _strip(b)
    assert [r["round"] for r in a] == [1, 2, 3, 4, 5, 6]
    assert [r["round"] for r in a if "test_accuracy" in r] == [2, 4, 6]
    lines = (tmp_path / "a" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x) for x in lines] == a
    for key in ("round", "test_accuracy", "test_loss", "train_loss", "wall_s"):
        assert key in a[-1]
    assert (tmp_path / "a" / "config.resolved.toml").is_file()
    c = run_experiment(_cfg(seed=4), tmp_path / "c", progress=False)
    assert _strip(c) != _strip(a)


@pytest.mark.parametrize("algorithm", ["scaffold", "fedadam"])
def test_resume_matches_uninterrupted_run(tmp_path, algorithm):
    full = run_experiment(_cfg(**{"algorithm.name": algorithm}), tmp_path / "full", progress=False)
    # "crash" after round 4: run only 4 rounds, then resume the same directory to round 6
    run_experiment(_cfg(**{"algorithm.name": algorithm, "rounds": 4}), tmp_path / "r",
                   progress=False)
    resumed = run_experiment(_cfg(**{"algorithm.name": algorithm}), tmp_path / "r", resume=True,
                             progress=False)
    assert _strip(resumed) == _strip(full)
    ck_full = load_file(str(tmp_path / "full" / "checkpoints" / "round_00006.safetensors"))
    ck_res = load_file(str(tmp_path / "r" / "checkpoints" / "round_00006.safetensors"))
    assert ck_full.keys() == ck_res.keys()
    for k in ck_full:
        torch.testing.assert_close(ck_full[k], ck_res[k], rtol=0, atol=0)


def test_checkpoint_holds_server_and_client_state(tmp_path):
    run_experiment(_cfg(), tmp_path / "a", progress=False)
    tensors = load_file(str(tmp_path / "a" / "checkpoints" / "round_00006.safetensors"))
    assert any(k.startswith("params/") for k in tensors)
    assert any(k.startswith("server/parts/scaffold/c/") for k in tensors)
    assert tensors["clients/scaffold/c/linear.weight"].shape[0] == 12


@pytest.mark.parametrize("algorithm,copies,scalars",
                         [("fedavg", 0, 0), ("scaffold", 1, 0), ("fadamgc", 2, 1)])
def test_metrics_report_client_state_bytes(tmp_path, algorithm, copies, scalars):
    """c_i is one model copy per client, FAdamGC's y_i and v_i two (plus its tracking
    counter), FedAvg none."""
    rec = run_experiment(_cfg(**{"algorithm.name": algorithm, "rounds": 2}), tmp_path / "a",
                         progress=False)[-1]
    model_bytes = 4 * (60 * 10 + 10)  # logreg on Synthetic: 60 features, 10 classes, fp32
    assert rec["client_state_bytes_per_client"] == copies * model_bytes + 4 * scalars


@pytest.mark.parametrize(
    "override,field",
    [
        ("algorithm.name=nope", "algorithm.name"),
        ("algorithm.local_lr=-0.1", "algorithm.local_lr"),
        ("algorithm.bogus=1", "algorithm.bogus"),
        ("data.root=/does/not/exist", "data.root"),
        ("data.dataset=imagenet", "data.dataset"),
        ("model.name=vgg", "model.name"),
        ("client.batch_size=0", "client.batch_size"),
        ("rounds=zero", "rounds"),
        ("engine.name=gpu", "engine.name"),
        ("server.aggregation=median", "server.aggregation"),
    ],
)
def test_bad_config_error_names_the_field(override, field):
    with pytest.raises(ConfigError) as err:
        validate(apply_overrides(BASE, [override]))
    assert str(err.value).startswith(field), str(err.value)
    assert "\n" not in str(err.value)


def test_steps_and_epochs_are_exclusive():
    with pytest.raises(ConfigError, match="local_steps"):
        validate(apply_overrides(BASE, ["client.local_epochs=1"]))


def test_toml_and_yaml_files_load(tmp_path):
    (tmp_path / "c.yaml").write_text("rounds: 3\nalgorithm:\n  name: fedprox\n  mu: 0.1\n")
    cfg = load_config(tmp_path / "c.yaml", ["client.batch_size=4"])
    assert cfg.rounds == 3 and cfg.algorithm.hparams == {"mu": 0.1} and cfg.client.batch_size == 4
    (tmp_path / "bad.toml").write_text("rounds = [")
    with pytest.raises(ConfigError, match="bad.toml"):
        load_config(tmp_path / "bad.toml")


def test_cli_bad_config_one_line_no_traceback(tmp_path):
    cfg = tmp_path / "c.toml"
    cfg.write_text('[algorithm]\nname = "fedavg"\nlocal_lr = -1\n')
    proc = subprocess.run(
        [sys.executable, "-m", "fedforge", "run", str(cfg), "--out", str(tmp_path / "o")],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr
    assert "algorithm.local_lr" in proc.stderr


def test_cli_run_quickstart_prints_accuracy(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "fedforge", "run", str(QUICKSTART), "rounds=5", "-q",
         "--out", str(tmp_path / "q")],
        capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert "test_accuracy=" in proc.stdout
