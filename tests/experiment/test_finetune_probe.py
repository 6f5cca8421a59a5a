"""examples/pfl_finetune_probe.py: re-scoring a finished run after other fine-tuning settings.

With the run's own settings the probe must give exactly the numbers the run recorded at its
last evaluation, and with no steps the global model's; the head-input norm it prints is
checked against the MLP's body computed by hand.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from fedforge.cli import app
from fedforge.core.checkpoint import load_checkpoint
from fedforge.experiment.build import Setup
from fedforge.experiment.config import load_config

ROOT = Path(__file__).resolve().parents[2]
CONFIG = """\
name = "probe"
seed = 0
rounds = 2
[data]
dataset = "synthetic"
partition = "dirichlet"
num_clients = 6
partition_options = {{ alpha = 0.1 }}
client_test_fraction = 0.25
[model]
name = "mlp"
[algorithm]
name = "{algorithm}"
finetune_steps = 3
[client]
batch_size = 10
local_steps = 2
lr = 0.05
[server]
clients_per_round = 6
[eval]
every = 1
[checkpoint]
every = 1
"""


def _module():
    spec = importlib.util.spec_from_file_location(
        "pfl_finetune_probe", ROOT / "examples" / "pfl_finetune_probe.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run(tmp_path: Path, algorithm: str, finetune: bool = True) -> Path:
    config = tmp_path / f"{algorithm}.toml"
    text = CONFIG.format(algorithm=algorithm)
    config.write_text(text if finetune else text.replace("finetune_steps = 3\n", ""))
    out = tmp_path / algorithm
    result = CliRunner().invoke(app, ["run", str(config), "--out", str(out)])
    assert result.exit_code == 0, result.output
    return out


def test_run_settings_give_the_recorded_metrics(tmp_path):
    run = _run(tmp_path, "fedbabu")
    last = json.loads((run / "metrics.jsonl").read_text().splitlines()[-1])
    rows = _module().probe(run, steps=[0, 3], parts=["all", "body"], lrs=[0.05, 0.01])
    by = {(r["part"], r["lr"], r["steps"]): r for r in rows}
    assert len(rows) == 8
    for key in ("mean", "weighted", "p10", "worst"):
        name = f"personal_accuracy_{key}"
        assert by["all", 0.05, 3][name] == last[name]
        assert by["body", 0.01, 0][name] == last[f"global_accuracy_{key}"]
    # a different part or learning rate fine-tunes a different model
    assert by["body", 0.05, 3]["personal_accuracy_mean"] != last["personal_accuracy_mean"]


def test_head_input_norm_is_the_bodys_output_norm(tmp_path):
    run = _run(tmp_path, "fedbabu")
    setup = Setup.from_config(load_config(run / "config.resolved.toml"))
    params = load_checkpoint(run / "checkpoints")[0]["params"]
    got = _module().head_input_norm(setup, params, None, samples=50)
    setup.network.load_state_dict(params)
    with torch.no_grad():
        want = setup.network.net[:4](setup.data.train_x[:50]).norm(dim=1).mean()
    assert got == pytest.approx(float(want), rel=1e-6)


def test_refuses_a_method_with_client_state(tmp_path):
    run = _run(tmp_path, "fedavg_ft")
    with pytest.raises(SystemExit, match="--parts: fedavg_ft"):
        _module().probe(run, steps=[1], parts=["head"], lrs=[0.05])
    run = _run(tmp_path, "ditto", finetune=False)  # Ditto takes no finetune_steps
    with pytest.raises(SystemExit, match="algorithm.name 'ditto' keeps per-client state"):
        _module().probe(run, steps=[1], parts=["all"], lrs=[0.05])
