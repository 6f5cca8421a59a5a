"""Experiment trackers behind the one ``[logging]`` section: TensorBoard, MLflow and W&B.

Every record a run logs (one per round; the test metrics on evaluated rounds) goes to each
tracker that is switched on, as scalars at step = round, so the three show what
``metrics.jsonl`` holds. Everything stays in the run folder:

* ``logging.tensorboard``: event files in ``<run>/tensorboard/``;
* ``logging.mlflow``: an MLflow run in ``<run>/mlruns/mlflow.db`` (SQLite; ``mlflow ui
  --backend-store-uri sqlite:///<run>/mlruns/mlflow.db``), or at the tracking URI of
  ``--mlflow-uri`` / ``$FEDFORGE_MLFLOW_URI`` (never of a config: a config does not choose
  where results go); the resolved config is logged as the run's parameters;
* ``logging.wandb``: a W&B run in ``<run>/wandb/``, offline by default (``wandb sync`` uploads
  it later); the resolved config is the run's config.

The folders are created through the run folder's writer (a planted link is refused), a file
or SQLite URI must lie inside the run folder, the trackers' own caches and settings go to
``<run>/wandb/`` and their telemetry is off, so nothing is written under ``$HOME``. These
settings are made in the environment only while a tracker is called (W&B's service process,
started then, keeps them), and restored after.

A resumed run continues the same MLflow and W&B run: their ids are kept in
``<run>/tracking.json``. A round that the tracker already holds (one re-run after a kill) is
not logged again. Each backend is an optional extra, imported only when switched on.
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import unquote, urlparse

from fedforge.errors import shorten
from fedforge.experiment.rundir import RunDirError, subfolder, writable_path, write_text

if TYPE_CHECKING:
    from fedforge.experiment.config import RunConfig

IDS_NAME = "tracking.json"
URI_ENV = "FEDFORGE_MLFLOW_URI"  # the MLflow tracking URI (the CLI's --mlflow-uri sets it)
MLFLOW_DB = "mlruns/mlflow.db"
# what MLflow's HTTP client does when no server answers: one retry, then a one-line error
# (its defaults retry for minutes); a value the user set in the environment wins
HTTP_DEFAULTS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "1", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
                 "MLFLOW_HTTP_REQUEST_TIMEOUT": "10"}


class TrackerError(ValueError):
    """A tracker that cannot be opened, logged to or closed; one line naming the setting."""


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
    never mix); ``run_id`` continues an earlier run, whose points are kept: a step that run
    already holds for a metric is not logged again. ``env``: the environment MLflow runs in
    (:func:`tracker_env`)."""

    def __init__(self, uri: str, experiment: str, run_name: str, params: dict[str, Any],
                 run_id: str | None = None, artifacts: Path | None = None,
                 env: dict[str, str] | None = None, tags: dict[str, str] | None = None) -> None:
        self.env = env or {}
        with scoped_env(self.env):
            try:
                from mlflow.entities import Metric, Param
                from mlflow.tracking import MlflowClient
            except ImportError as exc:
                raise ImportError("logging.mlflow: needs the mlflow package "
                                  "(pip install 'fedforge[mlflow]')") from exc
            _telemetry_off()
            logging.getLogger("mlflow").setLevel(logging.WARNING)  # no database-setup chatter
            self.client, self._metric, self.uri = MlflowClient(tracking_uri=uri), Metric, uri
            self.held: dict[str, set[int]] = {}
            if run_id is None:
                run_id = self._new_run(experiment, run_name, artifacts, tags or {})
                items = [Param(k, _text(v)) for k, v in params.items()]
                for i in range(0, len(items), 100):  # MLflow takes at most 100 per batch
                    self.client.log_batch(run_id, params=items[i : i + 100])
            else:
                self.client.update_run(run_id, status="RUNNING")
                self.held = {key: {m.step for m in self.client.get_metric_history(run_id, key)}
                             for key in self.client.get_run(run_id).data.metrics}
        self.run_id = run_id

    def _new_run(self, experiment: str, run_name: str, artifacts: Path | None,
                 tags: dict[str, str]) -> str:
        found = self.client.get_experiment_by_name(experiment)
        if found is not None:
            exp_id = found.experiment_id
        else:
            where = None if artifacts is None else artifacts.resolve().as_uri()
            exp_id = self.client.create_experiment(experiment, artifact_location=where)
        return self.client.create_run(exp_id, run_name=run_name, tags=tags).info.run_id

    def log(self, record: dict, step: int) -> None:
        now = int(time.time() * 1000)
        metrics = [self._metric(k, v, now, step) for k, v in scalars(record).items()
                   if step not in self.held.get(k, ())]
        with _one_line(f"logging.mlflow: cannot log round {step} to {shorten(self.uri)}"), \
                scoped_env(self.env):
            for i in range(0, len(metrics), 1000):
                self.client.log_batch(self.run_id, metrics=metrics[i : i + 1000])

    def close(self, failed: bool = False) -> None:
        with _one_line(f"logging.mlflow: cannot end the run at {shorten(self.uri)}"), \
                scoped_env(self.env):
            self.client.set_terminated(self.run_id, status="FAILED" if failed else "FINISHED")


class WandbTracker:
    """One W&B run (offline by default); ``run_id`` continues an earlier one. ``env``: the
    environment W&B runs in (:func:`tracker_env`); its service process, started here, keeps
    it and is ended on ``close``, so the next run's service gets that run's folders."""

    def __init__(self, folder: Path, project: str, run_name: str, params: dict[str, Any],
                 mode: str, run_id: str | None = None, env: dict[str, str] | None = None) -> None:
        self.env = env or {}
        with scoped_env(self.env):
            try:
                import wandb
            except ImportError as exc:
                raise ImportError("logging.wandb: needs the wandb package "
                                  "(pip install 'fedforge[wandb]')") from exc
            self.run = wandb.init(
                project=project, dir=str(folder.parent), name=run_name, config=params,
                mode=mode, id=run_id, resume="allow" if run_id is not None else None,
                reinit="create_new",
                settings=wandb.Settings(console="off", quiet=True, silent=True))
        self._teardown = wandb.teardown
        self.run_id = self.run.id

    def log(self, record: dict, step: int) -> None:
        with scoped_env(self.env):
            self.run.log(scalars(record), step=step)

    def close(self, failed: bool = False) -> None:
        with scoped_env(self.env):
            self.run.finish(exit_code=1 if failed else 0)
            self._teardown()


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def _telemetry_off() -> None:
    """MLflow decides on telemetry when it is first imported; an MLflow imported earlier in
    this process (outside :func:`scoped_env`) is told again, now that it is switched off."""
    try:
        from mlflow.telemetry.client import get_telemetry_client, set_telemetry_client
    except ImportError as exc:
        if exc.name == "mlflow":
            raise TrackerError("logging.mlflow needs MLflow: pip install "
                               "'fedforge[mlflow]'") from None
        return  # an MLflow without telemetry
    if get_telemetry_client() is not None:
        set_telemetry_client()


@contextmanager
def scoped_env(values: dict[str, str]) -> Iterator[None]:
    """``os.environ`` with ``values`` set for the block, then as it was: the trackers read
    their settings from the environment, and no other code should see them."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def tracker_env(out: Path, wandb: bool) -> dict[str, str]:
    """The environment the trackers of the run in ``out`` run in: no telemetry or error
    reports, MLflow's bounded HTTP retries, and (``wandb``) W&B's cache, settings and data
    folders in ``<run>/wandb/`` (created through the run folder's writer), not ``$HOME``."""
    env = {"MLFLOW_DISABLE_TELEMETRY": "true", "DO_NOT_TRACK": "true",
           **{k: os.environ.get(k, v) for k, v in HTTP_DEFAULTS.items()}}
    if wandb:
        env["WANDB_ERROR_REPORTING"] = "false"  # no crash reports sent to W&B
        env |= {f"WANDB_{name.upper()}_DIR": str(subfolder(out, f"wandb/{name}").resolve())
                for name in ("cache", "config", "data")}
        env["WANDB_ARTIFACT_DIR"] = str(subfolder(out, "wandb").resolve() / "artifacts")
    return env


def mlflow_uri(out: Path) -> str:
    """The MLflow tracking URI of the run in ``out``: ``$FEDFORGE_MLFLOW_URI`` (the CLI's
    ``--mlflow-uri``), else SQLite in ``<run>/mlruns/mlflow.db``. A local store (a path, a
    ``file:`` or ``sqlite:`` URI) must lie inside the run folder, and neither its folders nor
    its database files may be links (TrackerError, RunDirError)."""
    uri = os.environ.get(URI_ENV, "").strip()
    if not uri:
        db = Path(MLFLOW_DB)
        return "sqlite:///" + str(_local_store(out, db.parent, db.name, is_db=True))
    path, is_db = _local_path(uri)
    if path is None:
        return uri
    try:
        inside = path.parent.resolve().relative_to(Path(out).resolve())
    except ValueError:
        raise TrackerError(f"{URI_ENV} / --mlflow-uri: {shorten(uri)} is outside the run "
                           f"folder {out}; a local MLflow store goes inside it (the default "
                           f"is {out / MLFLOW_DB}), or use a tracking server") from None
    store = _local_store(out, inside, path.name, is_db)
    return uri.split(":", 1)[0] + ":///" + str(store) if is_db else store.as_uri()


def _local_path(uri: str) -> tuple[Path | None, bool]:
    """(the local file or folder ``uri`` names, whether it is an SQLite file); (None, _)
    for a server or a remote database."""
    scheme = urlparse(uri).scheme.lower()
    if scheme.split("+")[0] == "sqlite":
        rest = uri.split(":", 1)[1].split("?", 1)[0]
        if not rest.startswith("///") or len(rest) == 3:  # sqlite:// is in memory
            raise TrackerError(f"{URI_ENV} / --mlflow-uri: {shorten(uri)}: expected "
                               "sqlite:///PATH (a file inside the run folder)")
        return Path(unquote(rest[3:])).expanduser(), True
    if scheme == "file":
        return Path(unquote(urlparse(uri).path)).expanduser(), False
    if scheme == "" or re.fullmatch(r"[a-z]", scheme):  # a plain path (C:/... on Windows)
        return Path(uri).expanduser(), False
    return None, False


def _local_store(out: Path, inside: Path, name: str, is_db: bool) -> Path:
    """The store ``out/inside/name`` checked as one the run may write -> its resolved path:
    its folders lead nowhere else and (SQLite) the database and its side files are plain."""
    if not is_db:
        return subfolder(out, inside / name).resolve()
    for suffix in ("", "-journal", "-wal", "-shm"):
        writable_path(out, inside / (name + suffix))
    return subfolder(out, inside).resolve() / name


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
    at round ``start`` (> 1: a resume, which continues the same MLflow and W&B runs).

    A tracker that cannot be opened (a missing package, no server at the URI) ends the run
    before its first round with one line (TrackerError), the ones opened already closed."""
    opts, out = cfg.logging, Path(out)
    trackers: list[Tracker] = []
    try:
        if opts.tensorboard:
            with _one_line("logging.tensorboard: cannot open the event file"):
                trackers.append(TensorBoardTracker(subfolder(out, "tensorboard"), start))
        if not (opts.mlflow or opts.wandb):
            return trackers
        ids, name = _saved_ids(out, start), f"{cfg.algorithm.name} seed {cfg.seed}"
        params = flat_params(cfg.model_dump(mode="json", exclude_none=True, by_alias=True,
                                            exclude={"tasks", "compare"}))
        env = tracker_env(out, opts.wandb)
        if opts.mlflow:
            uri = mlflow_uri(out)
            # a local store keeps its artifacts in the run folder; a server chooses its own
            artifacts = out / "mlruns" / "artifacts" if _local_path(uri)[0] else None
            with _one_line(f"logging.mlflow: cannot use the tracking store {shorten(uri)}"):
                mlflow = MLflowTracker(uri, cfg.name, name, params, ids.get("mlflow"),
                                       artifacts, env, {"fedforge.run_folder": str(out.resolve())})
            ids["mlflow"] = mlflow.run_id
            trackers.append(mlflow)
        if opts.wandb:
            folder = subfolder(out, "wandb")
            with _one_line("logging.wandb: cannot start the W&B run"):
                wandb = WandbTracker(folder, opts.wandb_project, name, params,
                                     opts.wandb_mode, ids.get("wandb"), env)
            ids["wandb"] = wandb.run_id
            trackers.append(wandb)
        write_text(out, IDS_NAME, json.dumps(ids, indent=1) + "\n")
    except BaseException:
        with suppress(Exception):  # the error that stopped the opening is the one to report
            close_all(trackers, failed=True)
        raise
    return trackers


@contextmanager
def _one_line(what: str) -> Iterator[None]:
    """A tracker's own error (while it opens, logs or closes) as one TrackerError line
    starting with ``what`` (a missing package: its install hint alone)."""
    try:
        yield
    except (TrackerError, RunDirError):
        raise
    except ImportError as exc:
        raise TrackerError(str(exc)) from None
    except Exception as exc:  # noqa: BLE001 (the trackers raise many kinds)
        raise TrackerError(f"{what}: {_reason(exc)}") from None


def _reason(exc: BaseException) -> str:
    """One short line of a tracker's error (MLflow's name a URL, a pool and a cause)."""
    text = str(exc)
    found = re.search(r"\[Errno -?\d+\][^\"')]*", text)
    return shorten(found.group(0) if found else " ".join(text.split()) or type(exc).__name__,
                   200)


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
