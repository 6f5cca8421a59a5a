"""MLflow and W&B get what metrics.jsonl holds, through their local backends only: an MLflow
SQLite store and W&B offline files inside the run folder; a resume continues the same run."""

from __future__ import annotations

import importlib.util
import json
import struct
import time
from pathlib import Path

import pytest

from fedforge.experiment.config import load_config
from fedforge.experiment.metrics import evaluated
from fedforge.experiment.runner import read_metrics, run_experiment
from fedforge.experiment.tracking import flat_params, scalars

REPO = Path(__file__).resolve().parents[2]
QUICK = REPO / "examples" / "quickstart.toml"
SHORT = ["rounds=2", "eval.every=1", "client.local_steps=1", "client.local_epochs=null",
         "checkpoint.every=1"]


def test_scalars_and_params_are_flat():
    assert scalars({"round": 3, "test_accuracy": 0.5, "ok": True, "engine": "vmap"}) == {
        "test_accuracy": 0.5}
    assert flat_params({"algorithm": {"name": "fedavg", "local_lr": 0.1}, "seed": 0}) == {
        "algorithm.name": "fedavg", "algorithm.local_lr": 0.1, "seed": 0}


@pytest.mark.skipif(importlib.util.find_spec("mlflow") is None,
                    reason="mlflow is not installed (pip install 'fedforge[mlflow]')")
def test_mlflow_run_holds_every_round_and_resumes(tmp_path):
    from mlflow.tracking import MlflowClient

    run = tmp_path / "run"
    run_experiment(load_config(QUICK, [*SHORT, "logging.mlflow=true"]), run, progress=False)
    run_experiment(load_config(QUICK, [*SHORT, "rounds=3", "logging.mlflow=true"]), run,
                   progress=False, resume=True)
    run_id = json.loads((run / "tracking.json").read_text())["mlflow"]
    client = MlflowClient(tracking_uri=f"sqlite:///{run / 'mlruns' / 'mlflow.db'}")
    records = read_metrics(run)
    history = client.get_metric_history(run_id, "test_accuracy")
    assert [m.step for m in history] == [r["round"] for r in evaluated(records)] == [1, 2, 3]
    assert [m.value for m in history] == pytest.approx(
        [r["test_accuracy"] for r in evaluated(records)])
    found = client.get_run(run_id)
    assert found.info.status == "FINISHED"
    assert found.data.params["algorithm.local_lr"] == "0.01"
    assert len(client.search_runs([found.info.experiment_id])) == 1  # resumed, not a new run


def _wandb_history(path: Path) -> list[dict]:
    """The history rows of a W&B offline run file (LevelDB log blocks of protobuf records)."""
    from wandb.proto import wandb_internal_pb2

    data, pos, chunk, rows = path.read_bytes(), 7, b"", []  # 7: the ':W&B' file header
    while pos + 7 <= len(data):
        if (left := 32768 - pos % 32768) < 7:  # a block's tail too short for a header
            pos += left
            continue
        _crc, size, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if kind == 0 and size == 0:
            break
        chunk, pos = chunk + data[pos + 7 : pos + 7 + size], pos + 7 + size
        if kind in (1, 4):  # a whole record, or its last piece
            record = wandb_internal_pb2.Record()
            record.ParseFromString(chunk)
            if record.WhichOneof("record_type") == "history":
                rows.append({i.key or "/".join(i.nested_key): json.loads(i.value_json)
                             for i in record.history.item})
            chunk = b""
    return rows


@pytest.mark.skipif(importlib.util.find_spec("wandb") is None,
                    reason="wandb is not installed (pip install 'fedforge[wandb]')")
def test_wandb_offline_run_in_the_run_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "elsewhere"))
    monkeypatch.setenv("WANDB_SILENT", "true")
    run = tmp_path / "run"
    run_experiment(load_config(QUICK, [*SHORT, "logging.wandb=true"]), run, progress=False)
    run_id = json.loads((run / "tracking.json").read_text())["wandb"]
    offline = list((run / "wandb").glob(f"offline-run-*-{run_id}/run-{run_id}.wandb"))
    assert len(offline) == 1, sorted(p.name for p in (run / "wandb").iterdir())
    deadline = time.time() + 30  # W&B's service process may still be writing the file
    while len(rows := _wandb_history(offline[0])) < 2 and time.time() < deadline:
        time.sleep(0.2)
    records = read_metrics(run)
    assert [r["_step"] for r in rows] == [r["round"] for r in records] == [1, 2]
    assert [r["test_accuracy"] for r in rows] == pytest.approx(
        [r["test_accuracy"] for r in records])
    assert not (tmp_path / "elsewhere").exists()  # logging stays in the run folder
