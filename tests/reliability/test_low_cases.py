"""Bad input that used to end in a traceback or name the wrong thing: each is now one line
naming the file or the field (a damaged metrics log or checkpoint, a symlink-loop dataset
folder, a YAML key written twice, a run folder whose latest.json write failed)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fedforge.cli import app
from fedforge.core.config_io import parse_yaml
from fedforge.data import DatasetError, load_dataset
from fedforge.experiment.config import ConfigError, load_config
from fedforge.experiment.metrics import MetricsError, MetricsWriter

EXAMPLE = Path(__file__).parents[2] / "examples" / "quickstart.toml"
FAST = ["rounds=2", "checkpoint.every=1", "eval.every=1", "data.options.num_clients=6",
        "data.options.max_samples_per_client=20", "server.clients_per_round=3"]


def _cli(*args: str):
    return CliRunner().invoke(app, [*args, "-q"])


def _one_line_error(result) -> str:
    assert result.exit_code == 2, result.output
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    return lines[0]


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("runs") / "r"
    assert _cli("run", str(EXAMPLE), *FAST, "--out", str(out)).exit_code == 0
    return out


def _copy(run: Path, tmp_path: Path) -> Path:
    import shutil

    return Path(shutil.copytree(run, tmp_path / "r"))


# ----------------------------------------------------------------------------- metrics.jsonl


@pytest.mark.parametrize(("line", "problem"), [
    ("[1, 2]", "line 2 is a JSON list, not an object"),
    ('"round"', "line 2 is a JSON str, not an object"),
    ('{"round": "1", "train_loss": 1.0}', "line 2 has round '1', not an integer"),
    ('{"round": true}', "line 2 has round True, not an integer"),
])
def test_malformed_metrics_line_on_resume_names_file_and_line(tmp_path, line, problem):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"round": 1}\n' + line + '\n{"round": 3}\n')
    with pytest.raises(MetricsError) as info:
        MetricsWriter(path, truncate_after=2)
    assert str(info.value).startswith(f"{path}: {problem}; ") and "\n" not in str(info.value)


def test_async_metrics_line_without_its_key_names_file_and_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"updates": 1}\n{"round": 2}\n')
    with pytest.raises(MetricsError, match=r"line 2 cannot be read back \(KeyError"):
        MetricsWriter(path, keep=lambda r, i: r["updates"] <= 5)


def test_resume_over_a_damaged_metrics_log_is_one_line(finished_run, tmp_path):
    run = _copy(finished_run, tmp_path)
    log = run / "metrics.jsonl"
    log.write_text("[]\n" + log.read_text())
    msg = _one_line_error(_cli("run", str(EXAMPLE), *FAST, "rounds=3", "--out", str(run),
                               "--resume"))
    assert f"{log}: line 1 is a JSON list, not an object" in msg


# ----------------------------------------------------------------------------- checkpoints


@pytest.mark.parametrize("scale", [-0.5, 0])
def test_non_positive_lr_scale_in_a_checkpoint_names_the_checkpoint(finished_run, tmp_path,
                                                                    scale):
    run = _copy(finished_run, tmp_path)
    meta_path = run / "checkpoints" / "round_00002.json"
    meta = json.loads(meta_path.read_text())
    meta["lr_scale"] = scale
    meta_path.write_text(json.dumps(meta))
    msg = _one_line_error(_cli("run", str(EXAMPLE), *FAST, "rounds=3", "--out", str(run),
                               "--resume"))
    assert f"{run / 'checkpoints'}: checkpoint field 'lr_scale' must be a positive" in msg
    assert "algorithm.local_lr" not in msg


def test_unfinished_latest_json_write_resumes_from_the_newest_complete_checkpoint(
        finished_run, tmp_path, caplog):
    """A kill or a full disk while the first latest.json is written leaves checkpoint files,
    latest.json.tmp and no latest.json; a resume used to start over silently, then stopped.
    The newest checkpoint is complete, so the commit is finished and the run goes on."""
    run = _copy(finished_run, tmp_path)
    ckpt = run / "checkpoints"
    (ckpt / "latest.json").unlink()
    (ckpt / "latest.json.tmp").write_text('{"checkp')
    with caplog.at_level("WARNING", logger="fedforge.experiment.checkpoint"):
        assert _cli("run", str(EXAMPLE), *FAST, "rounds=3", "--out", str(run),
                    "--resume").exit_code == 0
    assert "latest.json is missing and latest.json.tmp is an unfinished write; resuming " \
           "from round_00002.json" in caplog.text
    assert [json.loads(ln)["round"] for ln in (run / "metrics.jsonl").open()] == [1, 2, 3]
    assert json.loads((ckpt / "latest.json").read_text()) == {"checkpoint": "round_00003.json"}


MULTITASK = Path(__file__).parents[2] / "examples" / "fedast_cpu_2tasks.toml"
# the example on the generated dataset: the suite passes on a fresh clone, with no datasets
MULTI_FAST = ["tasks.data.dataset=synthetic", "tasks.model.name=logreg", "max_updates=8",
              "system.num_clients=12", "async.requests=2", "async.min_requests=1",
              "async.rb_ratio=2", "tasks.client.local_steps=1", "tasks.eval_every=1",
              "eval.max_test_samples=64", "checkpoint.every=1"]


def test_missing_latest_json_in_a_multitask_run_resumes_from_the_newest_checkpoint(tmp_path):
    """The multi-task runner used to start over silently, like the synchronous one did."""
    run = tmp_path / "m"
    assert _cli("run", str(MULTITASK), *MULTI_FAST, "--out", str(run)).exit_code == 0
    ckpt = run / "checkpoints"
    newest = json.loads((ckpt / "latest.json").read_text())
    (ckpt / "latest.json").unlink()
    result = _cli("run", str(MULTITASK), *MULTI_FAST, "--out", str(run), "--resume")
    assert result.exit_code == 0, result.output
    assert json.loads((ckpt / "latest.json").read_text()) == newest


def test_missing_latest_json_skips_a_checkpoint_whose_tensors_do_not_verify(finished_run,
                                                                            tmp_path, caplog):
    run = _copy(finished_run, tmp_path)
    ckpt = run / "checkpoints"
    (ckpt / "latest.json").unlink()
    tensors = ckpt / "round_00002.safetensors"
    tensors.write_bytes(tensors.read_bytes()[:-4] + b"\0\0\0\0")
    with caplog.at_level("WARNING", logger="fedforge.experiment.checkpoint"):
        assert _cli("run", str(EXAMPLE), *FAST, "rounds=3", "--out", str(run),
                    "--resume").exit_code == 0
    assert "latest.json is missing; resuming from round_00001.json" in caplog.text
    assert [json.loads(ln)["round"] for ln in (run / "metrics.jsonl").open()] == [1, 2, 3]


def test_missing_latest_json_without_a_verified_checkpoint_is_one_line(finished_run, tmp_path):
    run = _copy(finished_run, tmp_path)
    ckpt = run / "checkpoints"
    (ckpt / "latest.json").unlink()
    for tensors in ckpt.glob("*.safetensors"):
        tensors.write_bytes(b"torn")
    msg = _one_line_error(_cli("run", str(EXAMPLE), *FAST, "rounds=3", "--out", str(run),
                               "--resume"))
    assert msg.endswith("latest.json is missing and no complete checkpoint verifies; start "
                        "over with --overwrite")


# ----------------------------------------------------------------------------- data folders


@pytest.mark.parametrize("where", ["root", "dataset"])
def test_symlink_loop_dataset_folder_is_one_line(tmp_path, where):
    if where == "root":
        (tmp_path / "a").symlink_to(tmp_path / "b")
        (tmp_path / "b").symlink_to(tmp_path / "a")
        root, loop = tmp_path / "a", tmp_path / "a" / "mnist"
    else:
        (tmp_path / "mnist").symlink_to(tmp_path / "loop")
        (tmp_path / "loop").symlink_to(tmp_path / "mnist")
        root, loop = tmp_path, tmp_path / "mnist"
    with pytest.raises(DatasetError) as info:
        load_dataset("mnist", root)
    assert str(info.value).startswith(f"{loop}: ") and "\n" not in str(info.value)


# ----------------------------------------------------------------------------- YAML


def test_yaml_duplicate_key_is_refused_like_toml(tmp_path):
    doc = "seed: 0\nrounds: 3\ndata:\n  dataset: synthetic\n  dataset: mnist\n"
    yaml_path = tmp_path / "c.yaml"
    yaml_path.write_text(doc)
    with pytest.raises(ConfigError) as info:
        load_config(yaml_path, [])
    msg = str(info.value)
    assert str(yaml_path) in msg and "duplicate key 'dataset' at line 5" in msg
    toml_path = tmp_path / "c.toml"
    toml_path.write_text('seed = 0\nrounds = 3\n[data]\ndataset = "synthetic"\n'
                         'dataset = "mnist"\n')
    with pytest.raises(ConfigError):
        load_config(toml_path, [])


def test_yaml_merge_keys_may_still_be_overridden():
    data = parse_yaml("base: &b {name: logreg, width: 2}\nmodel:\n  <<: *b\n  name: mlp\n")
    assert data["model"] == {"name": "mlp", "width": 2}
