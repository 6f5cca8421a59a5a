"""Experiment trackers behind the one ``[logging]`` section: TensorBoard, MLflow and W&B.

Every record a run logs (one per round; the test metrics on evaluated rounds) goes to each
tracker that is switched on, as scalars at step = round, so the three show what
``metrics.jsonl`` holds. Everything stays in the run folder unless the config says otherwise:

* ``logging.tensorboard``: event files in ``<run>/tensorboard/``;
* ``logging.mlflow``: an MLflow run in ``<run>/mlruns/mlflow.db`` (SQLite; ``mlflow ui
  --backend-store-uri sqlite:///<run>/mlruns/mlflow.db``), or at ``logging.mlflow_uri``;
  the resolved config is logged as the run's parameters;
* ``logging.wandb``: a W&B run in ``<run>/wandb/``, offline by default (``wandb sync`` uploads
  it later); the resolved config is the run's config.

A resumed run continues the same MLflow and W&B run: their ids are kept in
``<run>/tracking.json``. Each backend is an optional extra, imported only when switched on.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from fedforge.experiment.config import RunConfig

IDS_NAME = "tracking.json"


class Tracker(Protocol):
    """One backend: gets every record at its round, then ``close`` once."""

    def log(self, record: dict, step: int) -> None: ...

    def close(self, failed: bool = False) -> None: ...


def scalars(record: dict) -> dict[str, float]:
    """The record's numbers (not ``round``, which is the step; no booleans)."""
    return {k: float(v) for k, v in record.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and k != "round"}


def flat_params(tree: Any, prefix: str = "") -> dict[str, Any]:
    """A nested config as dotted keys (``algorithm.local_lr``), as trackers take parameters."""
    if isinstance(tree, dict):
        out: dict[str, Any] = {}
        for key, value in tree.items():
            out.update(flat_params(value, f"{prefix}{key}."))
        return out
    return {prefix.rstrip("."): tree}


class TensorBoardTracker:
    """TensorBoard's own writer; a resumed run drops the events after its checkpoint."""

    def __init__(self, folder: Path, start: int) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as exc:  # torch imports tensorboard lazily, here
            raise ImportError("logging.tensorboard: needs the tensorboard package "
                              "(pip install 'fedforge[tensorboard]')") from exc
        self.writer = SummaryWriter(log_dir=str(folder), purge_step=start if start > 1 else None)

    def log(self, record: dict, step: int) -> None:
        for key, value in scalars(record).items():
            self.writer.add_scalar(key, value, global_step=step)
        self.writer.flush()

    def close(self, failed: bool = False) -> None:
        self.writer.close()


class MLflowTracker:
    """One MLflow run through ``MlflowClient`` (no global active run, so runs in one process
    never mix); ``run_id`` continues an earlier run."""

    def __init__(self, uri: str, experiment: str, run_name: str, params: dict[str, Any],
                 run_id: str | None = None, artifacts: Path | None = None) -> None:
        try:
            from mlflow.entities import Metric, Param
            from mlflow.tracking import MlflowClient
        except ImportError as exc:
            raise ImportError("logging.mlflow: needs the mlflow package "
                              "(pip install 'fedforge[mlflow]')") from exc
        logging.getLogger("mlflow").setLevel(logging.WARNING)  # no database-setup chatter
        self.client, self._metric = MlflowClient(tracking_uri=uri), Metric
        if run_id is None:
            run_id = self._new_run(experiment, run_name, artifacts)
            items = [Param(k, _text(v)) for k, v in params.items()]
            for i in range(0, len(items), 100):  # MLflow takes at most 100 per batch
                self.client.log_batch(run_id, params=items[i : i + 100])
        else:
            self.client.update_run(run_id, status="RUNNING")
        self.run_id = run_id

    def _new_run(self, experiment: str, run_name: str, artifacts: Path | None) -> str:
        found = self.client.get_experiment_by_name(experiment)
        if found is not None:
            exp_id = found.experiment_id
        else:
            where = None if artifacts is None else artifacts.resolve().as_uri()
            exp_id = self.client.create_experiment(experiment, artifact_location=where)
        return self.client.create_run(exp_id, run_name=run_name).info.run_id

    def log(self, record: dict, step: int) -> None:
        now = int(time.time() * 1000)
        metrics = [self._metric(k, v, now, step) for k, v in scalars(record).items()]
        for i in range(0, len(metrics), 1000):
            self.client.log_batch(self.run_id, metrics=metrics[i : i + 1000])

    def close(self, failed: bool = False) -> None:
        self.client.set_terminated(self.run_id, status="FAILED" if failed else "FINISHED")


class WandbTracker:
    """One W&B run (offline by default); ``run_id`` continues an earlier one."""

    def __init__(self, folder: Path, project: str, run_name: str, params: dict[str, Any],
                 mode: str, run_id: str | None = None) -> None:
        try:
            import wandb
        except ImportError as exc:
            raise ImportError("logging.wandb: needs the wandb package "
                              "(pip install 'fedforge[wandb]')") from exc
        folder.mkdir(parents=True, exist_ok=True)
        self.run = wandb.init(
            project=project, dir=str(folder.parent), name=run_name, config=params, mode=mode,
            id=run_id, resume="allow" if run_id is not None else None, reinit="create_new",
            settings=wandb.Settings(console="off", quiet=True, silent=True))
        self.run_id = self.run.id

    def log(self, record: dict, step: int) -> None:
        self.run.log(scalars(record), step=step)

    def close(self, failed: bool = False) -> None:
        self.run.finish(exit_code=1 if failed else 0)


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def _saved_ids(out: Path, start: int) -> dict[str, str]:
    """The MLflow and W&B run ids of the run being resumed (none on a fresh start)."""
    path = out / IDS_NAME
    if start <= 1 or not path.is_file():
        return {}
    try:
        ids = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return {k: v for k, v in ids.items() if isinstance(k, str) and isinstance(v, str)} \
        if isinstance(ids, dict) else {}


def open_trackers(cfg: RunConfig, out: Path, start: int) -> list[Tracker]:
    """The trackers ``cfg.logging`` switches on, writing for the run in ``out`` that starts
    at round ``start`` (> 1: a resume, which continues the same MLflow and W&B runs)."""
    from fedforge.experiment.rundir import write_text

    opts, out = cfg.logging, Path(out)
    trackers: list[Tracker] = []
    if opts.tensorboard:
        trackers.append(TensorBoardTracker(out / "tensorboard", start))
    if not (opts.mlflow or opts.wandb):
        return trackers
    ids, name = _saved_ids(out, start), f"{cfg.algorithm.name} seed {cfg.seed}"
    params = flat_params(cfg.model_dump(mode="json", exclude_none=True, by_alias=True,
                                        exclude={"tasks", "compare"}))
    if opts.mlflow:
        uri = opts.mlflow_uri or "sqlite:///" + str((out / "mlruns" / "mlflow.db").resolve())
        if opts.mlflow_uri is None:
            (out / "mlruns").mkdir(parents=True, exist_ok=True)
        mlflow = MLflowTracker(uri, cfg.name, name, params, ids.get("mlflow"),
                               out / "mlruns" / "artifacts")
        ids["mlflow"] = mlflow.run_id
        trackers.append(mlflow)
    if opts.wandb:
        wandb = WandbTracker(out / "wandb", opts.wandb_project, name, params, opts.wandb_mode,
                             ids.get("wandb"))
        ids["wandb"] = wandb.run_id
        trackers.append(wandb)
    write_text(out, IDS_NAME, json.dumps(ids, indent=1) + "\n")
    return trackers


def close_all(trackers: list[Tracker], failed: bool) -> None:
    """Close every tracker, even when one of them fails to."""
    errors: list[BaseException] = []
    for tracker in trackers:
        try:
            tracker.close(failed)
        except Exception as exc:  # noqa: BLE001 (the others must still close)
            errors.append(exc)
    if errors:
        raise errors[0]


TrackerFactory = Callable[[], list[Tracker]]
