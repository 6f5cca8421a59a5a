"""Multi-task runs end to end on the embedded synthetic data: determinism, resume, errors."""

import json

import pytest
from typer.testing import CliRunner

from fedforge.cli import app
from fedforge.experiment.config import ConfigError, load_config, validate
from fedforge.experiment.runner import run_experiment
from fedforge.study.compare import gain
from fedforge.study.labels import without_wall_clock

CONFIG = """
name = "t"
method = "fedast"
max_updates = 120
[system]
num_clients = 40
available_fraction = 0.5
[async]
requests = 8
rb_ratio = 4
variance_window = 4
[sync]
k = 4
clients_per_round = 12
[checkpoint]
every = 50
[[tasks]]
data = {dataset = "synthetic", partition = "natural", num_clients = 30}
model = {name = "logreg"}
algorithm = {name = "fedavg", local_lr = 0.1, server_lr = 0.5}
client = {batch_size = 10, local_steps = 3}
step_time = 0.2
eval_every = 2
target = 0.5
[[tasks]]
data = {dataset = "synthetic", partition = "iid", num_clients = 40}
model = {name = "logreg"}
algorithm = {name = "fedavg", local_lr = 0.1, server_lr = 0.5}
client = {batch_size = 10, local_steps = 3}
step_time = 0.5
eval_every = 2
"""


@pytest.fixture
def cfg_path(tmp_path):
    p = tmp_path / "mt.toml"
    p.write_text(CONFIG)
    return p


def _read(d, name):
    return [json.loads(x) for x in (d / name).read_text().splitlines()]


def _nowall(recs):
    return [without_wall_clock(r) for r in recs]


@pytest.mark.parametrize("method", ["fedast", "sync_st"])
def test_same_seed_same_log_and_resume_continues(cfg_path, tmp_path, method):
    full = load_config(cfg_path, [f"method={method}"])
    run_experiment(full, tmp_path / "a", progress=False)
    run_experiment(full, tmp_path / "b", progress=False)
    assert _read(tmp_path / "a", "events.jsonl") == _read(tmp_path / "b", "events.jsonl")
    # interrupted at 60 updates (checkpoint at 50), then resumed to 120
    half = load_config(cfg_path, [f"method={method}", "max_updates=60"])
    run_experiment(half, tmp_path / "c", progress=False)
    run_experiment(full, tmp_path / "c", resume=True, progress=False)
    assert _read(tmp_path / "a", "events.jsonl") == _read(tmp_path / "c", "events.jsonl")
    assert _nowall(_read(tmp_path / "a", "metrics.jsonl")) == _nowall(
        _read(tmp_path / "c", "metrics.jsonl"))
    recs = _read(tmp_path / "a", "metrics.jsonl")
    assert {"task", "sim_time_s", "round", "updates", "test_accuracy"} <= set(recs[0])
    assert {r["task"] for r in recs} == {"synthetic-logreg"}
    assert [r["sim_time_s"] for r in recs] == sorted(r["sim_time_s"] for r in recs)


def test_config_errors_name_the_task_field(cfg_path):
    with pytest.raises(ConfigError, match=r"^tasks\[1\]\.model\.name: unknown model 'nope'"):
        load_config(cfg_path, ["tasks.1.model.name=nope"])
    with pytest.raises(ConfigError, match=r"^tasks\[0\]\.step_time"):
        load_config(cfg_path, ["tasks[0].step_time=-1"])
    with pytest.raises(ConfigError, match=r"^tasks\[0\]\.algorithm\.local_lr"):
        load_config(cfg_path, ["tasks.0.algorithm.local_lr=0"])
    with pytest.raises(ConfigError, match="^method: unknown method"):
        load_config(cfg_path, ["method=fedfoo"])
    with pytest.raises(ConfigError, match=r"^tasks\[0\]\.algorithm\.name: 'scaffold' needs "
                                          r"per-client state.*the fedast asynchronous driver"):
        load_config(cfg_path, ["tasks.0.algorithm.name=scaffold"])


def test_one_schema_refuses_the_other_kinds_sections(cfg_path, tmp_path):
    """A [[tasks]] run refuses single-task sections and the other way round, in one line."""
    with pytest.raises(ConfigError, match=r"^algorithm: a multi-task run \(\[\[tasks\]\]\) "
                                          r"does not read it; set it per task"):
        load_config(cfg_path, ["algorithm.local_lr=0.3"])
    with pytest.raises(ConfigError, match=r"^rounds: a multi-task run .* drop it$"):
        load_config(cfg_path, ["rounds=3"])
    with pytest.raises(ConfigError, match=r"^eval\.every: a multi-task run does not read it"):
        load_config(cfg_path, ["eval.every=3"])
    single = tmp_path / "single.toml"
    single.write_text('rounds = 2\n[async]\nrequests = 3\n')
    with pytest.raises(ConfigError, match=r"^async: only a multi-task run reads it"):
        load_config(single)
    with pytest.raises(ConfigError, match=r"^max_updates: only a multi-task run reads it"):
        validate({"max_updates": 5})
    assert not validate({}).multitask and validate({"tasks": [{}]}).multitask


def test_resolved_config_loads_back_as_the_same_run(cfg_path, tmp_path):
    """One config.resolved.toml writer: the multi-task file has the method, each task's
    resolved algorithm and the checkpoint period, and loads back as the same config."""
    run_experiment(load_config(cfg_path, ["max_updates=10"]), tmp_path / "r", progress=False)
    resolved = tmp_path / "r" / "config.resolved.toml"
    text = resolved.read_text()
    assert 'method = "fedast"' in text and "rounds" not in text and "[server]" not in text
    again = load_config(resolved)
    assert again.tasks[0].algorithm.hparams["server_lr"] == 0.5
    assert again.tasks[0].algorithm.hparams["weight_decay"] == 0.0  # a default, written out
    assert again.checkpoint.every == 50 and again.max_updates == 10


def test_cli_run_and_compare_multitask(cfg_path, tmp_path):
    runner = CliRunner()
    res = runner.invoke(app, ["run", str(cfg_path), "max_updates=30", "--out",
                              str(tmp_path / "r"), "-q"])
    assert res.exit_code == 0, res.output
    assert json.loads((tmp_path / "r" / "summary.json").read_text())["updates"] == 30
    res = runner.invoke(app, ["compare", str(cfg_path), "-a", "fedast,sync_st",
                              "max_updates=30", "--out", str(tmp_path / "cmp"), "-q"])
    assert res.exit_code == 0, res.output
    assert (tmp_path / "cmp" / "accuracy.png").is_file()
    res = runner.invoke(app, ["run", str(cfg_path), "tasks.0.model.name=nope"])
    assert res.exit_code == 2 and "tasks[0].model.name" in res.output


def test_gain():
    assert gain(1033.0, 619.0) == pytest.approx(0.4008, abs=1e-4)
    assert gain(None, 5.0) is None and gain(5.0, None) is None
