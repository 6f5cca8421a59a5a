"""The trackers (TensorBoard, MLflow, W&B) write only inside the run folder.

A config (or a sweep's space) cannot choose where MLflow writes; a local MLflow store named on
the command line must lie inside the run folder; a link planted for a tracker's folder or for
MLflow's database is refused in one line; a tracking server that does not answer is one line,
at once; nothing lands under ``$HOME`` or the current folder, and no telemetry is sent; a
round re-run after a kill is not logged twice.
"""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

import fedforge
from fedforge.cli import app

REPO = Path(__file__).resolve().parents[2]
QUICK = str(REPO / "examples" / "quickstart.toml")
FAST = ["rounds=1", "eval.every=1", "checkpoint.every=1", "eval.per_client=false",
        "data.options.num_clients=6", "data.options.max_samples_per_client=20",
        "server.clients_per_round=3"]
URI_ENV = "FEDFORGE_MLFLOW_URI"  # the documented name (fedforge.experiment.tracking.URI_ENV)
OUTSIDE = b"outside the run folder: must keep these bytes\n"

needs_mlflow = pytest.mark.skipif(importlib.util.find_spec("mlflow") is None,
                                  reason="mlflow is not installed (pip install 'fedforge[mlflow]')")
needs_wandb = pytest.mark.skipif(importlib.util.find_spec("wandb") is None,
                                 reason="wandb is not installed (pip install 'fedforge[wandb]')")
needs_tensorboard = pytest.mark.skipif(importlib.util.find_spec("tensorboard") is None,
                                       reason="tensorboard is not installed")


@pytest.fixture(autouse=True)
def _no_uri(monkeypatch):
    """No tracking URI from the shell, and none left behind by --mlflow-uri (the CLI puts it
    in the environment for its worker processes)."""
    monkeypatch.setenv(URI_ENV, "")  # empty: the default; restored after the test
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("WANDB_MODE", "offline")


def _run(out: Path, *args: str):
    return CliRunner().invoke(app, ["run", QUICK, *FAST, *args, "-q", "--out", str(out)])


def _one_line_error(result) -> str:
    assert result.exit_code == 2, result.output
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    return lines[0]


# ------------------------------------------------------------------ where the URI comes from

@needs_mlflow
def test_a_config_cannot_choose_the_mlflow_uri(tmp_path):
    """T1: ``logging.mlflow_uri`` in a config used to create the database wherever it said."""
    outside = tmp_path / "outside.db"
    msg = _one_line_error(_run(tmp_path / "run", "logging.mlflow=true",
                               f"logging.mlflow_uri=sqlite:///{outside}"))
    assert msg.startswith("error: logging.mlflow_uri: a config does not choose where results")
    assert "--mlflow-uri" in msg and "FEDFORGE_MLFLOW_URI" in msg
    assert not outside.exists()


@needs_mlflow
def test_a_sweep_space_cannot_choose_the_mlflow_uri(tmp_path):
    """T1 from a sweep: the space's values are config values, refused before any trial."""
    outside = tmp_path / "outside.db"
    space = tmp_path / "space.toml"
    space.write_text(f'"logging.mlflow_uri" = ["sqlite:///{outside}"]\n')
    result = CliRunner().invoke(app, [
        "sweep", QUICK, *FAST, "logging.mlflow=true", "--space", str(space), "--sampler",
        "grid", "--jobs", "1", "--no-final", "--out", str(tmp_path / "sweep")])
    assert "logging.mlflow_uri: a config does not choose where results" in _one_line_error(
        result)
    assert not outside.exists()


@needs_mlflow
@pytest.mark.parametrize("scheme", ["sqlite:///", "file://", ""])
def test_a_local_mlflow_store_outside_the_run_folder_is_refused(tmp_path, scheme):
    """T2: aimed at an existing SQLite file, MLflow added its tables to it."""
    victim = tmp_path / "victim.db"
    with sqlite3.connect(victim) as db:
        db.execute("create table mine (x)")
    before = victim.read_bytes()
    msg = _one_line_error(_run(tmp_path / "run", "logging.mlflow=true",
                               "--mlflow-uri", f"{scheme}{victim}"))
    assert "is outside the run folder" in msg
    assert victim.read_bytes() == before


@needs_mlflow
def test_the_environment_names_the_uri_and_is_checked_the_same_way(tmp_path, monkeypatch):
    victim = tmp_path / "victim.db"
    victim.write_bytes(OUTSIDE)
    monkeypatch.setenv(URI_ENV, f"sqlite:///{victim}")
    assert "is outside the run folder" in _one_line_error(
        _run(tmp_path / "run", "logging.mlflow=true"))
    assert victim.read_bytes() == OUTSIDE


def _tracker_settings() -> dict[str, str]:
    return {k: v for k, v in os.environ.items()
            if k.startswith(("MLFLOW_", "WANDB_")) or k == "DO_NOT_TRACK"}


@needs_mlflow
def test_a_store_inside_the_run_folder_is_used_and_the_environment_is_restored(
        tmp_path, monkeypatch):
    """The trackers' settings (telemetry off, retries, caches) are set only while a tracker
    is called: the rest of the process sees its own environment."""
    run = tmp_path / "run"
    monkeypatch.setenv(URI_ENV, f"sqlite:///{run / 'mlruns' / 'mine.db'}")
    before = _tracker_settings()
    result = _run(run, "logging.mlflow=true")
    assert result.exit_code == 0, result.output
    assert (run / "mlruns" / "mine.db").is_file() and not (run / "mlruns" / "mlflow.db").exists()
    assert _tracker_settings() == before


# ------------------------------------------------------------------ links planted in the run folder

def _plant(run: Path, name: str, kind: str, outside: Path) -> None:
    """``run/name`` as a link to ``outside`` (a folder, or a file with bytes of its own)."""
    (run / name).parent.mkdir(parents=True, exist_ok=True)
    if kind == "hardlink":
        outside.write_bytes(OUTSIDE)
        os.link(outside, run / name)
        return
    if kind == "file":
        outside.write_bytes(OUTSIDE)
    else:
        outside.mkdir()
    (run / name).symlink_to(outside, target_is_directory=kind == "folder")


@pytest.mark.parametrize(("switch", "name", "kind"), [
    pytest.param("mlflow", "mlruns", "folder", marks=needs_mlflow, id="T3-mlruns"),
    pytest.param("mlflow", "mlruns/mlflow.db", "file", marks=needs_mlflow, id="T4-mlflow.db"),
    pytest.param("mlflow", "mlruns/mlflow.db", "hardlink", marks=needs_mlflow,
                 id="T4-mlflow.db-hardlink"),
    pytest.param("mlflow", "mlruns/mlflow.db-journal", "file", marks=needs_mlflow,
                 id="T4-journal"),
    pytest.param("tensorboard", "tensorboard", "folder", marks=needs_tensorboard,
                 id="T5-tensorboard"),
    pytest.param("wandb", "wandb", "folder", marks=needs_wandb, id="T6-wandb"),
])
def test_a_planted_link_for_a_tracker_is_refused(tmp_path, switch, name, kind):
    """T3–T6: each tracker used to write through a link planted for its folder or file."""
    run, outside = tmp_path / "run", tmp_path / "outside"
    run.mkdir()
    _plant(run, name, kind, outside)
    msg = _one_line_error(_run(run, f"logging.{switch}=true"))
    assert str(run / name) in msg and ("link" in msg or "leads outside" in msg), msg
    if kind == "folder":
        assert list(outside.iterdir()) == []
    else:
        assert outside.read_bytes() == OUTSIDE


# ------------------------------------------------------------------ a server that does not answer

def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@needs_mlflow
def test_a_tracking_server_that_does_not_answer_is_one_line_at_once(tmp_path):
    """T10: MLflow retried for minutes, then five tracebacks. The port is closed, so each
    try is refused at once: the test ends within a second or two with bounded retries."""
    uri = f"http://127.0.0.1:{_closed_port()}"
    msg = _one_line_error(_run(tmp_path / "run", "logging.mlflow=true", "--mlflow-uri", uri))
    assert msg.startswith(f"error: logging.mlflow: cannot use the tracking store {uri}: ")
    assert "Connection refused" in msg
    assert not (tmp_path / "run" / "mlruns").exists()


@needs_mlflow
def test_a_tracking_server_lost_mid_run_is_one_line(tmp_path, monkeypatch):
    """A server that stops answering after round 1: one line naming the round, not
    MLflow's traceback (and closing the run there fails too, which must not hide it)."""
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    real = MlflowClient.log_batch

    def gone(*args, **kwargs):
        raise MlflowException("API request to http://tracker/api failed with exception "
                              "HTTPConnectionPool(host='tracker'): Max retries exceeded "
                              "(Caused by NewConnectionError(\"[Errno 111] Connection "
                              "refused\"))")

    def lost_at_round_2(self, run_id, metrics=(), **kwargs):
        if any(m.step == 2 for m in metrics):
            gone()
        return real(self, run_id, metrics, **kwargs)

    monkeypatch.setattr(MlflowClient, "log_batch", lost_at_round_2)
    monkeypatch.setattr(MlflowClient, "set_terminated", gone)
    msg = _one_line_error(_run(tmp_path / "run", "rounds=2", "logging.mlflow=true"))
    assert msg.startswith("error: logging.mlflow: cannot log round 2 to sqlite:///"), msg
    assert msg.endswith(": [Errno 111] Connection refused"), msg


# ------------------------------------------------------------------ nothing under $HOME

@needs_mlflow
@needs_wandb
def test_nothing_is_written_under_home_or_the_current_folder(tmp_path):
    """W&B wrote its logs under ~/.cache/wandb and MLflow its telemetry id under
    ~/.config/mlflow (with telemetry on). A fresh process, as a user starts it: no pytest
    marker (MLflow turns telemetry off under pytest) and no tracker settings from the shell."""
    home, cwd = tmp_path / "home", tmp_path / "cwd"
    home.mkdir()
    cwd.mkdir()
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("WANDB_", "MLFLOW_", "XDG_", "PYTEST_", "FEDFORGE_MLFLOW"))
           and k != "DO_NOT_TRACK"}
    src = str(Path(fedforge.__file__).resolve().parents[1])  # the fedforge under test
    env |= {"HOME": str(home), "PYTHONPATH": os.pathsep.join(
        [src, *filter(None, [os.environ.get("PYTHONPATH")])])}
    done = subprocess.run(
        [sys.executable, "-m", "fedforge", "run", QUICK, *FAST, "logging.mlflow=true",
         "logging.wandb=true", "-q", "--out", str(tmp_path / "run")],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert sorted(str(p.relative_to(home)) for p in home.rglob("*")) == []
    assert list(cwd.iterdir()) == []
    assert (tmp_path / "run" / "mlruns" / "mlflow.db").is_file()
    assert list((tmp_path / "run" / "wandb").glob("offline-run-*"))


# ------------------------------------------------------------------ a round re-run after a kill

@needs_mlflow
def test_a_round_re_run_after_a_kill_is_logged_once(tmp_path):
    """A kill after round 2 was logged but before its checkpoint: the resume runs round 2
    again; MLflow used to hold two points at step 2."""
    from mlflow.tracking import MlflowClient

    run = tmp_path / "run"
    assert _run(run, "rounds=2", "logging.mlflow=true").exit_code == 0
    ckpt = run / "checkpoints"
    for path in ckpt.glob("round_00002.*"):
        path.unlink()
    (ckpt / "latest.json").write_text(json.dumps({"checkpoint": "round_00001.json"}))
    result = _run(run, "rounds=2", "logging.mlflow=true", "--resume")
    assert result.exit_code == 0, result.output
    run_id = json.loads((run / "tracking.json").read_text())["mlflow"]
    client = MlflowClient(tracking_uri=f"sqlite:///{run / 'mlruns' / 'mlflow.db'}")
    for key in ("test_accuracy", "train_loss"):
        assert [m.step for m in client.get_metric_history(run_id, key)] == [1, 2], key
    found = client.get_run(run_id)
    assert found.info.status == "FINISHED"
    assert found.data.tags["fedforge.run_folder"] == str(run.resolve())  # which folder is whose
