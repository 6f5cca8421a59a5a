"""``fedforge sweep``: a search over any config keys, on Optuna (docs/sweeps.md).

* The space is a ``[sweep]`` table of the config or a small TOML file (``--space``): a list is
  a set of choices, ``{uniform = [lo, hi]}``, ``{log_uniform = [lo, hi]}``, ``{int = [lo, hi]}``
  and ``{log_int = [lo, hi]}`` are ranges. ``--sampler grid | random | tpe``.
* Every trial is a normal run folder, ``OUT/trials/<number>/``, written by the one runner.
  Trials run in parallel in worker processes (spawned, one per ``--jobs``; one per GPU when
  there are GPUs).
* The study lives in ``OUT/study.db`` (SQLite), so a sweep killed at any point resumes with
  ``--resume``: finished trials are kept, a trial that was running continues from its last
  checkpoint.
* Selection on validation, report on test: trials train on the training data less a held-out
  validation split and are scored on it (the dataset ``sweep_validation`` below); the test
  split is used once, by ``OUT/best/``, the chosen setting trained on all the training data.
* ``OUT/table.csv``, ``OUT/table.json`` (one row per trial) and ``OUT/sweep.png``.
"""

from __future__ import annotations

import json
import math
import multiprocessing
import os
import re
import threading
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from fedforge.data.base import DatasetSplits
from fedforge.errors import shorten
from fedforge.experiment.config import (
    RunConfig,
    apply_overrides,
    load_config,
    load_raw,
    validate,
)

SAMPLERS = ("grid", "random", "tpe")
RANGES = ("uniform", "log_uniform", "int", "log_int")
METRIC_KEYS = {"val_accuracy": "test_accuracy", "val_loss": "test_loss",
               "val_perplexity": "test_perplexity",  # next-token data (minimised)
               "val_client_mean_accuracy": "client_mean_accuracy"}
"""Sweep metric -> the key trials record it under (their test split is the validation split)."""
VALIDATION_DATASET = "sweep_validation"
STUDY = "sweep"
SETTINGS_NAME = "sweep.json"
RUN_CONFIG = "config.yaml"  # the run config: the file, its overrides, no [sweep]
TRIAL_CONFIG = "validation.yaml"  # the same, scored on the validation split
DEFAULT_TRIALS = 20
RESTORE = "restore it, or start a new sweep in another --out"  # a sweep file gone wrong
TRIALS = "trials"  # OUT/trials/<number>/: one run folder per trial
BEST = "best"  # OUT/best/: the chosen setting on all the training data, scored on test
_KEY = re.compile(r"[\w-]+(?:\.[\w-]+)*")
"""A config key as an override writes it: dotted names (``algorithm.local_lr``)."""


class SweepError(ValueError):
    """A sweep that cannot run as asked; the message is one line naming the field or file."""


def _optuna() -> Any:
    try:
        import optuna
    except ImportError as exc:
        raise ImportError("fedforge sweep: needs the optuna package "
                          "(pip install 'fedforge[sweep]')") from exc
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna


# ----------------------------------------------------------------------------- the space


@dataclass(frozen=True)
class Param:
    """One swept key: a list of ``choices``, or a range ``kind`` from ``low`` to ``high``."""

    key: str
    kind: str  # "choice" or one of RANGES
    choices: tuple = ()
    low: float = 0.0
    high: float = 0.0


def parse_space(table: Any, where: str = "sweep") -> list[Param]:
    """``{algorithm: {local_lr: {log_uniform: [..]}}}`` (TOML's dotted keys) -> params."""
    if not isinstance(table, dict) or not table:
        raise SweepError(f"{where}: expected a table of keys to search, e.g. "
                         "algorithm.local_lr = {log_uniform = [1e-3, 1]}")
    params: list[Param] = []
    for key, value in table.items():
        if not _KEY.fullmatch(str(key)):
            raise SweepError(f"{where}: unknown config key {shorten(repr(str(key)))}; a key "
                             "is dotted names, e.g. algorithm.local_lr")
        path = f"{where}.{key}"
        if isinstance(value, dict) and not (set(value) & set(RANGES)):
            params += [replace(p, key=f"{key}.{p.key}") for p in parse_space(value, path)]
        else:
            params.append(_param(str(key), value, path))
    return params


def _param(key: str, value: Any, where: str) -> Param:
    if isinstance(value, list):
        if not value:
            raise SweepError(f"{where}: an empty list of choices")
        if not all(v is None or isinstance(v, (bool, int, float, str)) for v in value):
            raise SweepError(f"{where}: choices must be numbers, strings, booleans or null")
        if len(set(map(json.dumps, value))) != len(value):
            raise SweepError(f"{where}: a choice is listed twice")
        return Param(key, "choice", tuple(value))
    if not isinstance(value, dict) or len(value) != 1:
        raise SweepError(f"{where}: expected a list of choices or one of "
                         f"{{{' | '.join(f'{r} = [lo, hi]' for r in RANGES)}}}")
    (kind, bounds), = value.items()
    if kind not in RANGES:
        raise SweepError(f"{where}.{kind}: unknown range; expected one of {list(RANGES)}")
    ok = (isinstance(bounds, list) and len(bounds) == 2
          and all(isinstance(b, (int, float)) and not isinstance(b, bool) for b in bounds))
    if not ok or not bounds[0] < bounds[1]:
        raise SweepError(f"{where}.{kind}: expected [low, high] with low < high")
    if kind.startswith("log") and bounds[0] <= 0:
        raise SweepError(f"{where}.{kind}: a log range needs low > 0")
    if kind.endswith("int") and not all(isinstance(b, int) for b in bounds):
        raise SweepError(f"{where}.{kind}: expected integer bounds")
    return Param(key, kind, (), bounds[0], bounds[1])


def load_space(config: Path, space: Path | None) -> tuple[dict, list[Param]]:
    """The raw space table (``--space`` file, else the config's ``[sweep]``) and its params."""
    if space is not None:
        table, where = load_raw(space), str(space)
        table = table.get("sweep", table) if set(table) == {"sweep"} else table
    else:
        table, where = load_raw(config).get("sweep"), "sweep"
        if table is None:
            raise SweepError(f"{config}: no [sweep] table; add one or give --space FILE")
    return table, parse_space(table, where)


def distributions(params: list[Param]) -> dict[str, Any]:
    """Optuna's distribution of each key."""
    dist = _optuna().distributions
    out: dict[str, Any] = {}
    for p in params:
        if p.kind == "choice":
            out[p.key] = dist.CategoricalDistribution(p.choices)
        elif p.kind.endswith("int"):
            out[p.key] = dist.IntDistribution(int(p.low), int(p.high), log=p.kind == "log_int")
        else:
            out[p.key] = dist.FloatDistribution(p.low, p.high, log=p.kind == "log_uniform")
    return out


def grid_size(params: list[Param]) -> int:
    return math.prod(len(p.choices) for p in params)


def make_sampler(name: str, params: list[Param], seed: int) -> Any:
    """The Optuna sampler; a grid needs a list of choices for every key."""
    samplers = _optuna().samplers
    if name == "grid":
        ranged = [p.key for p in params if p.kind != "choice"]
        if ranged:
            raise SweepError(f"sweep.{ranged[0]}: --sampler grid needs a list of values, not a "
                             "range (or use --sampler random or tpe)")
        return _grid_sampler(samplers.GridSampler)({p.key: list(p.choices) for p in params},
                                                   seed=seed)
    if name == "random":
        return samplers.RandomSampler(seed=seed)
    if name == "tpe":
        return samplers.TPESampler(seed=seed)
    raise SweepError(f"--sampler: unknown sampler {name!r}; expected one of {list(SAMPLERS)}")


def _grid_sampler(base: type) -> type:
    """Optuna's grid sampler without its end-of-grid ``Study.stop`` (which works only inside
    ``optimize``; the driver asks for exactly the grid's trials itself)."""

    class Grid(base):
        def after_trial(self, study: Any, trial: Any, state: Any, values: Any) -> None:
            return None

    return Grid


def overrides(values: dict[str, Any]) -> list[str]:
    """A trial's values as the dotted overrides ``load_config`` takes (JSON is YAML flow)."""
    return [f"{key}={json.dumps(value)}" for key, value in values.items()]


# ----------------------------------------------------------------------------- validation split


def validation_mask(n: int, groups: np.ndarray | None, fraction: float,
                    seed: int) -> np.ndarray:
    """Which training samples are held out: ``fraction`` of each natural client's samples
    (each keeps at least one for training), or of the whole set without natural clients."""
    rng = np.random.default_rng(seed)
    keys = np.zeros(n, dtype=np.int64) if groups is None else np.asarray(groups)
    order = np.argsort(keys, kind="stable")
    cuts = np.flatnonzero(np.diff(keys[order])) + 1
    mask = np.zeros(n, dtype=bool)
    for members in np.split(order, cuts):
        take = min(int(round(fraction * len(members))), len(members) - 1)
        if take > 0:
            mask[rng.permutation(members)[:take]] = True
    return mask


def sweep_validation(root: Path, dataset: str, fraction: float = 0.2, seed: int = 0,
                     options: dict[str, Any] | None = None) -> DatasetSplits:
    """``dataset`` with a validation split held out of its training data as the test split
    (the real test split is not loaded into the run): what sweep trials train and score on."""
    from fedforge.data.loaders import load_dataset

    if not 0.0 < fraction < 1.0:
        raise ValueError(f"data.options.fraction: expected a number in (0, 1), got {fraction!r}")
    splits = load_dataset(dataset, root, **(options or {}))
    groups = splits.train_groups
    held = validation_mask(splits.num_train, groups, fraction, seed)
    keep, val = torch_index(~held), torch_index(held)
    return replace(
        splits, name=f"{splits.name} (validation)",
        train_x=splits.train_x[keep], train_y=splits.train_y[keep],
        test_x=splits.train_x[val], test_y=splits.train_y[val],
        train_groups=None if groups is None else groups[~held],
        test_groups=None if groups is None else groups[held])


def torch_index(mask: np.ndarray) -> Any:
    import torch

    return torch.from_numpy(np.flatnonzero(mask))


def _register_dataset() -> None:
    from fedforge.plugins import register_dataset

    register_dataset(VALIDATION_DATASET, sweep_validation,
                     "a dataset's training data with a held-out validation split as its test "
                     "split (fedforge sweep trials)")


_register_dataset()


def validation_raw(raw: dict, cfg: RunConfig, fraction: float, seed: int,
                   per_client: bool = False) -> dict:
    """The raw config ``raw`` (validated as ``cfg``) training on its data less the
    validation split and scored on that split. ``per_client`` (a per-client metric): the
    split is carved from each client's own training data after its test samples are left
    out (``eval.client_validation``), so no test sample is seen during selection."""
    if per_client:
        return {**raw, "eval": {**(raw.get("eval") or {}), "personal": True,
                                "client_validation": fraction}}
    data = {**raw.get("data", {}), "dataset": VALIDATION_DATASET, "options": {
        "dataset": cfg.data.dataset, "fraction": fraction, "seed": seed,
        "options": dict(cfg.data.options)}}
    plugins = [*cfg.plugins, *([] if __name__ in cfg.plugins else [__name__])]
    return {**raw, "data": data, "plugins": plugins}


def validation_key(key: str) -> str:
    """A swept key as it reads in the trials' config (the dataset's own options moved)."""
    if key == "data.dataset":
        return "data.options.dataset"
    if key.startswith("data.options."):
        return "data.options.options." + key.removeprefix("data.options.")
    return key


# ----------------------------------------------------------------------------- settings, folder


@dataclass
class SweepSettings:
    """What ``fedforge sweep`` was asked; ``KEPT`` ones must match on ``--resume``."""

    config: Path
    out: Path
    overrides: list[str] = field(default_factory=list)
    space: Path | None = None
    sampler: str = "tpe"
    trials: int | None = None
    jobs: int | None = None
    metric: str | None = None  # None: what the config's algorithm is judged by
    direction: str | None = None
    prune: bool = False
    resume: bool = False
    validation_fraction: float = 0.2
    seed: int = 0
    final: bool = True
    plugins: list[str] = field(default_factory=list)
    allow_plugins: bool = False
    data_root: Path | None = None
    # as for compare: `auto` may run a trial on the procs engine's worker pool (within the
    # trial's share of the cores); run_experiment's own default is False
    allow_processes: bool = False

    KEPT = ("space", "sampler", "metric", "direction", "prune", "validation_fraction", "seed")


def metric_key(metric: str) -> str:
    return METRIC_KEYS.get(metric, metric)


def per_client(metric: str) -> bool:
    """Whether ``metric`` is a summary over clients of the personalised evaluation (then
    each client's validation data is carved from its own training data)."""
    from fedforge.experiment.client_metrics import column_of

    return column_of(metric_key(metric)) is not None


def default_metric(cfg: RunConfig) -> str:
    """What the config's algorithm is judged by, as a sweep metric (``val_accuracy`` for
    the pooled test accuracy)."""
    from fedforge.experiment.metrics import TEST_METRIC
    from fedforge.study.judged import algorithm_metric

    key = algorithm_metric(cfg.algorithm.name, cfg.algorithm.hparams)
    return "val_accuracy" if key == TEST_METRIC else key


def saved_metric(out: Path) -> str | None:
    """The metric the sweep in ``out`` was started with (None: no readable sweep there)."""
    try:
        saved = json.loads((out / SETTINGS_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    metric = saved.get("metric") if isinstance(saved, dict) else None
    return metric if isinstance(metric, str) else None


def selected_on(metric: str) -> str:
    """Where trials are scored, in words."""
    return ("each client's validation split (carved from its own training data)"
            if per_client(metric) else "the validation split (held out of the training data)")


def resolve_direction(metric: str, direction: str | None) -> str:
    if direction is None:
        from fedforge.study.labels import metric as described

        better = described(metric_key(metric)).higher_is_better
        return "minimize" if better is False or (better is None and "loss" in metric) \
            else "maximize"
    if direction not in ("maximize", "minimize"):
        raise SweepError(f"--direction: expected maximize or minimize, got {direction!r}")
    return direction


def prepare_folder(s: SweepSettings) -> tuple[list[Param], str, int]:
    """Check the settings, write (or on resume check) ``OUT/sweep.json``, ``config.yaml``
    (the run config) and ``validation.yaml`` (the trials' config) -> (params, direction,
    number of trials). A ``metric`` of None becomes what the config's algorithm is judged
    by (:func:`default_metric`), in ``s``."""
    table, params = load_space(s.config, s.space)
    if not 0.0 < s.validation_fraction < 1.0:
        raise SweepError("--validation-fraction: expected a number in (0, 1), got "
                         f"{s.validation_fraction}")
    make_sampler(s.sampler, params, s.seed)  # refuses a range under grid, an unknown name
    raw = apply_overrides(load_raw(s.config), s.overrides)
    raw.pop("sweep", None)  # the trials' configs are the file less its search space
    cfg = validate(raw, allow_plugins=s.allow_plugins)
    if cfg.multitask:
        raise SweepError("tasks: fedforge sweep searches single-task configs")
    if s.metric is None:  # resolved once, saved in sweep.json like an explicit one
        s.metric = saved_metric(s.out) if s.resume else None
        s.metric = s.metric or default_metric(cfg)
    direction = resolve_direction(s.metric, s.direction)
    val = validation_raw(raw, cfg, s.validation_fraction, s.seed, per_client(s.metric))
    for p in params:  # each key, with one of its values, must make a valid trial config
        validate(apply_overrides(val, overrides({validation_key(p.key): _example(p)})),
                 allow_plugins=s.allow_plugins)
    kept = {"space": table, "sampler": s.sampler, "metric": s.metric, "direction": direction,
            "prune": s.prune, "validation_fraction": s.validation_fraction, "seed": s.seed}
    _write_or_check(s, raw, val, kept)
    trials = grid_size(params) if s.sampler == "grid" else DEFAULT_TRIALS
    if s.trials is not None:
        if s.trials < 1:
            raise SweepError(f"--trials: expected at least 1, got {s.trials}")
        trials = min(s.trials, trials) if s.sampler == "grid" else s.trials
    return params, direction, trials


def _example(p: Param) -> Any:
    return p.choices[0] if p.kind == "choice" else (
        int(p.low) if p.kind.endswith("int") else float(p.low))


def _write_or_check(s: SweepSettings, raw: dict, val: dict, kept: dict) -> None:
    """Raw configs (YAML: nulls kept as given), so a trial's config is exactly the file plus
    its own values, before any default is filled in."""
    import yaml

    from fedforge.experiment.rundir import write_text

    out, path = s.out, s.out / SETTINGS_NAME
    if path.is_file() and not s.resume:
        raise SweepError(f"{out}: holds an earlier sweep; pass --resume to continue it (or "
                         "choose another --out)")
    new_config = json.loads(json.dumps(raw, default=str))
    if path.is_file():
        saved = json.loads(path.read_text(encoding="utf-8"))
        for key, value in kept.items():
            if saved.get(key) != json.loads(json.dumps(value)):
                raise SweepError(f"--{key.replace('_', '-')}: differs from the sweep in {out} "
                                 f"({saved.get(key)!r}); a resumed sweep keeps its settings")
        if saved.get("run_config") != new_config:
            raise SweepError(f"{s.config}: the run config differs from the one the sweep in "
                             f"{out} started with ({out / RUN_CONFIG})")
        for name, table in ((RUN_CONFIG, raw), (TRIAL_CONFIG, val)):
            _check_saved(out / name, table)
        return
    out.mkdir(parents=True, exist_ok=True)
    write_text(out, SETTINGS_NAME, json.dumps({**kept, "config": str(s.config),
                                               "run_config": new_config}, indent=1) + "\n")
    for name, table in ((RUN_CONFIG, raw), (TRIAL_CONFIG, val)):
        write_text(out, name, yaml.safe_dump(table, sort_keys=False))


def _check_saved(path: Path, table: dict) -> None:
    """The trials and the final run read ``config.yaml`` and ``validation.yaml``, so on resume
    each must still be the config ``sweep.json`` records: an edited one (a key changed, a
    plugin added) would rank trials of two configs together, or import code the command
    line never named."""
    import yaml

    from fedforge.core.files import not_plain

    try:
        saved = None if not_plain(path) else yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        saved = None
    if saved != yaml.safe_load(yaml.safe_dump(table, sort_keys=False)):
        raise SweepError(f"{path}: missing, a link or edited since the sweep started (it "
                         f"must be the config {SETTINGS_NAME} records); {RESTORE}")


# ----------------------------------------------------------------------------- one trial


@dataclass(frozen=True)
class TrialTask:
    """What a worker process needs to run one trial."""

    number: int
    trial_id: int
    values: dict[str, Any]
    out: Path
    metric: str
    resume: bool
    allow_plugins: bool
    prune: bool
    allow_processes: bool = False


def run_trial(task: TrialTask) -> dict[str, Any]:
    """Run one trial in its run folder -> ``{state, value, error, seconds}`` (a worker's job;
    any failure is the trial's, reported, never the sweep's)."""
    from fedforge.experiment.rundir import subfolder

    t0 = time.perf_counter()
    folder = task.out / TRIALS / str(task.number)
    result: dict[str, Any] = {"state": "complete", "value": None, "error": None}
    try:
        subfolder(task.out, Path(TRIALS, str(task.number)))  # a planted link is refused
        keyed = {validation_key(k): v for k, v in task.values.items()}
        cfg = load_config(task.out / TRIAL_CONFIG, overrides(keyed),
                          allow_plugins=task.allow_plugins)
        if task.resume:
            _wait_for_run_lock(folder)
        _run(cfg, folder, task)
    except Exception as exc:  # noqa: BLE001 (a trial's error fails the trial only)
        if type(exc).__name__ == "TrialPruned":
            result["state"] = "pruned"
        else:
            result.update(state="fail", error=" ".join(f"{type(exc).__name__}: {exc}".split()))
    if result["state"] != "fail":
        result["value"] = final_value(folder, task.metric)
        if result["value"] is None and result["state"] == "complete":
            result.update(state="fail", error=f"no {task.metric} in {folder}/metrics.jsonl")
    result["seconds"] = round(time.perf_counter() - t0, 3)
    return result


def _run(cfg: RunConfig, folder: Path, task: TrialTask) -> None:
    from contextlib import nullcontext

    from fedforge.experiment.progress import observe_rounds
    from fedforge.experiment.runner import run_experiment

    watch = observe_rounds(_pruner(task)) if task.prune else nullcontext()
    with watch:
        run_experiment(cfg, folder, resume=task.resume, progress=False,
                       allow_processes=task.allow_processes)


def _pruner(task: TrialTask) -> Callable[[int, dict], None]:
    """Report the metric of each evaluated round to the study; stop a trial Optuna prunes."""
    optuna = _optuna()
    study = optuna.load_study(study_name=STUDY, storage=storage(task.out),
                              sampler=optuna.samplers.RandomSampler(),
                              pruner=optuna.pruners.MedianPruner())
    trial = optuna.trial.Trial(study, task.trial_id)
    key = metric_key(task.metric)

    def observe(round_: int, record: dict) -> None:
        if isinstance(record.get(key), (int, float)):
            trial.report(float(record[key]), round_)
            if trial.should_prune():
                raise optuna.TrialPruned(f"pruned at round {round_}")

    return observe


def _wait_for_run_lock(folder: Path, timeout: float = 30.0) -> None:
    """A resumed trial waits for a worker of the killed sweep to let go of its folder."""
    from filelock import FileLock

    lock = folder / "run.lock"
    if lock.is_file() and not lock.is_symlink():
        with FileLock(str(lock), timeout=timeout):
            pass


def final_value(folder: Path, metric: str) -> float | None:
    """The metric at the trial's last evaluated round (None: no such round)."""
    from fedforge.experiment.runner import read_metrics

    key = metric_key(metric)
    if not (folder / "metrics.jsonl").is_file():
        return None
    values = [r[key] for r in read_metrics(folder) if isinstance(r.get(key), (int, float))]
    return float(values[-1]) if values else None


# ----------------------------------------------------------------------------- workers


def _worker_init(plugins: list[str], data_root: str | None, threads: int, parent: int,
                 gpus: Any) -> None:
    """Each worker: the user's plugins, the data root, its share of the CPU threads or one
    GPU, and it ends itself when the sweep dies (kill -9 leaves no orphan training)."""
    if gpus is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = str(gpus.get())
    import torch

    from fedforge.data.root import use_data_root
    from fedforge.plugins import load_plugins

    torch.set_num_threads(threads)
    load_plugins(plugins)
    if data_root is not None:
        use_data_root(data_root)
    threading.Thread(target=_exit_with_parent, args=(parent,), daemon=True).start()


def _exit_with_parent(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(0.5)
    os._exit(1)


def _gpu_ids() -> list[str]:
    import torch

    if not torch.cuda.is_available():
        return []
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible:
        return [g.strip() for g in visible.split(",") if g.strip()]
    return [str(i) for i in range(torch.cuda.device_count())]


def _pool(s: SweepSettings, jobs: int, gpus: list[str]) -> ProcessPoolExecutor:
    ctx = multiprocessing.get_context("spawn")
    queue = None
    if gpus:
        queue = ctx.Queue()
        for i in range(jobs):
            queue.put(gpus[i % len(gpus)])
    threads = max(1, (os.cpu_count() or 1) // jobs)
    root = None if s.data_root is None else str(s.data_root)
    return ProcessPoolExecutor(max_workers=jobs, mp_context=ctx, initializer=_worker_init,
                               initargs=(s.plugins, root, threads, os.getpid(), queue))


# ----------------------------------------------------------------------------- the driver


STUDY_FILES = ("study.db", "study.db-journal", "study.db-wal", "study.db-shm")
"""The study's SQLite file and the files SQLite writes beside it."""


def storage(out: Path) -> Any:
    """The study's SQLite file; writers from several processes wait for each other. It and
    SQLite's side files are checked like every file a run writes: a planted link is refused."""
    from fedforge.experiment.rundir import writable_path  # noqa: PLC0415

    for name in STUDY_FILES:
        writable_path(out, name)
    return _optuna().storages.RDBStorage(
        f"sqlite:///{Path(out).absolute() / 'study.db'}",
        engine_kwargs={"connect_args": {"timeout": 60}})


@dataclass
class SweepResult:
    rows: list[dict]
    best: dict | None
    test: dict | None
    out: Path


def run_sweep(s: SweepSettings, log: Callable[[str], None] = print) -> SweepResult:
    """Run (or resume) the sweep ``s`` describes; writes the table, figure and best run."""
    from filelock import FileLock, Timeout

    from fedforge.experiment.rundir import subfolder

    params, direction, total = prepare_folder(s)
    try:
        lock = FileLock(str(s.out / "sweep.lock"), timeout=0)
        lock.acquire()
    except Timeout:
        raise SweepError(f"{s.out}: another sweep is writing this folder") from None
    try:
        for name in (TRIALS, BEST):  # the sweep's own folders: a planted link is refused
            if os.path.lexists(s.out / name):
                subfolder(s.out, name)
        study = open_study(s, params, direction)
        _drive(study, s, params, total, log)
        rows = trial_rows(study, params, s.metric)
        best = best_row(rows, s.metric, direction)
        write_outputs(s.out, rows, params, s.metric, direction, best, None)
        test = run_final(s, best, log) if s.final and best is not None else None
        if test is not None:
            write_outputs(s.out, rows, params, s.metric, direction, best, test)
    finally:
        lock.release()
    return SweepResult(rows, best, test, s.out)


def open_study(s: SweepSettings, params: list[Param], direction: str) -> Any:
    """The study in ``OUT/study.db``, read once here so that a corrupt or hostile file (not
    SQLite, a text trial number) is one line naming it, and one that lost trials the folder
    holds (emptied, replaced) never re-runs them or overwrites the finished table."""
    from fedforge.experiment.rundir import RunDirError

    optuna = _optuna()
    path = s.out / "study.db"
    sampler = make_sampler(s.sampler, params, s.seed)
    pruner = optuna.pruners.MedianPruner() if s.prune else optuna.pruners.NopPruner()
    try:
        study = optuna.create_study(storage=storage(s.out), study_name=STUDY,
                                    direction=direction, load_if_exists=True, sampler=sampler,
                                    pruner=pruner)
        numbers = [t.number for t in study.get_trials(deepcopy=False)]
    except RunDirError:  # a planted link: the writer's own one line
        raise
    except Exception as exc:  # noqa: BLE001 (SQLite, SQLAlchemy, Optuna: the file is bad)
        raise SweepError(f"{path}: not a readable study ({_one_line(exc)}); {RESTORE}"
                         ) from None
    if set(numbers) != set(range(len(numbers))):
        raise SweepError(f"{path}: its trial numbers are not 0 to {len(numbers) - 1}, so "
                         f"fedforge did not write it; {RESTORE}")
    trials = s.out / TRIALS
    held = sorted(int(e.name) for e in os.scandir(trials) if e.name.isdigit()
                  ) if trials.is_dir() else []
    lost = [n for n in held if n >= len(numbers)]
    if lost:
        raise SweepError(f"{path}: holds {len(numbers)} trials but {trials} holds trial "
                         f"{lost[0]}; the study was emptied or replaced: {RESTORE}")
    return study


def _one_line(exc: BaseException) -> str:
    """An exception's first line (SQLAlchemy's add the statement and a link below it)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return shorten(lines[0] if lines else type(exc).__name__, 120)


FINISHED = ("COMPLETE", "PRUNED", "FAIL")


def _drive(study: Any, s: SweepSettings, params: list[Param], total: int,
           log: Callable[[str], None]) -> None:
    """Keep up to ``jobs`` trials running until ``total`` have finished; trials left running
    by a killed sweep go first, in their own folders."""
    trials = study.get_trials(deepcopy=False)
    stale = [t for t in trials if t.state.name == "RUNNING"]
    to_ask = max(0, total - sum(t.state.name in FINISHED for t in trials) - len(stale))
    gpus = _gpu_ids()
    jobs = max(1, min(s.jobs or len(gpus) or os.cpu_count() or 1, len(stale) + to_ask))
    if not stale and not to_ask:
        return
    log(f"sweep {s.out}: {total} trials ({total - to_ask - len(stale)} done, {len(stale)} to "
        f"resume), {jobs} at a time, sampler {s.sampler}, {s.metric} on {selected_on(s.metric)}")
    dists = distributions(params)
    optuna = _optuna()
    queue = [(optuna.trial.Trial(study, t._trial_id), True) for t in stale]  # noqa: SLF001
    running: dict[Any, Any] = {}
    with _pool(s, jobs, gpus) as pool:
        while queue or to_ask or running:
            while len(running) < jobs and (queue or to_ask):
                if queue:
                    trial, resume = queue.pop(0)
                else:
                    trial, resume, to_ask = study.ask(dists), False, to_ask - 1
                task = TrialTask(trial.number, trial._trial_id, dict(trial.params), s.out,  # noqa: SLF001
                                 s.metric, resume, s.allow_plugins, s.prune,
                                 s.allow_processes)
                running[pool.submit(run_trial, task)] = trial
            done, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in done:
                trial = running.pop(future)
                _tell(study, trial, _result(future), s.metric, log)


def _result(future: Any) -> dict[str, Any]:
    try:
        return future.result()
    except Exception as exc:  # noqa: BLE001 (a worker that died: the trial failed)
        return {"state": "fail", "value": None, "seconds": None,
                "error": " ".join(f"{type(exc).__name__}: {exc}".split())}


def _tell(study: Any, trial: Any, result: dict, metric: str, log: Callable[[str], None]
          ) -> None:
    state = _optuna().trial.TrialState
    if result.get("error"):
        trial.set_user_attr("error", result["error"])
    if result.get("seconds") is not None:
        trial.set_user_attr("seconds", result["seconds"])
    kind = {"complete": state.COMPLETE, "pruned": state.PRUNED}.get(result["state"], state.FAIL)
    value = result["value"] if kind == state.COMPLETE else None
    study.tell(trial, value, state=kind)
    shown = "" if result["value"] is None else f" {metric} {result['value']:.4f}"
    why = f" ({result['error']})" if result.get("error") else ""
    log(f"trial {trial.number} {result['state']}{shown}: {_values_text(trial.params)}{why}")


def _values_text(values: dict[str, Any]) -> str:
    return " ".join(f"{k}={_short(v)}" for k, v in values.items())


def _short(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


# ----------------------------------------------------------------------------- results


def trial_rows(study: Any, params: list[Param], metric: str) -> list[dict]:
    """One row per trial: number, state, each key's value, the metric, seconds, folder."""
    rows = []
    for t in study.get_trials(deepcopy=False):
        value = t.value
        if value is None and t.intermediate_values:  # pruned: its last reported value
            value = t.intermediate_values[max(t.intermediate_values)]
        rows.append({"trial": t.number, "state": t.state.name.lower(),
                     **{p.key: t.params.get(p.key) for p in params}, metric: value,
                     "seconds": t.user_attrs.get("seconds"), "folder": f"{TRIALS}/{t.number}",
                     "error": t.user_attrs.get("error")})
    return rows


def best_row(rows: list[dict], metric: str, direction: str) -> dict | None:
    """The complete trial with the best metric (ties: the first)."""
    done = [r for r in rows if r["state"] == "complete" and r.get(metric) is not None]
    if not done:
        return None
    pick = max if direction == "maximize" else min
    return pick(done, key=lambda r: r[metric])


def run_final(s: SweepSettings, best: dict, log: Callable[[str], None]) -> dict:
    """The chosen setting trained on all the training data and scored on the test split,
    once, in ``OUT/best/`` -> its last evaluated record's test metrics. ``best/`` is never
    replaced: it resumes (or keeps) a run of the same setting, and one of another setting
    (an extended sweep chose anew) stops the sweep, so no test score is lost unseen."""
    from fedforge.experiment.metrics import evaluated
    from fedforge.experiment.rundir import ResumeConfigError, subfolder
    from fedforge.experiment.runner import run_experiment

    if s.metric is None:  # a caller's settings: the sweep's own metric
        s = replace(s, metric=saved_metric(s.out) or "val_accuracy")
    values = {k: v for k, v in best.items() if k not in _ROW_FIELDS and k != s.metric}
    cfg = load_config(s.out / RUN_CONFIG, overrides(values), allow_plugins=s.allow_plugins)
    log(f"best: trial {best['trial']}, {s.metric} {best[s.metric]:.4f}: "
        f"{_values_text(values)}; training it on all the training data for the test score")
    folder = subfolder(s.out, BEST)
    try:
        records = run_experiment(cfg, folder, resume=True, progress=False,
                                 allow_processes=s.allow_processes)
    except ResumeConfigError:
        raise SweepError(
            f"{folder}: holds the final run of another setting, which a sweep never replaces; "
            f"rename it to keep its test score, then --resume to train trial {best['trial']} "
            f"(the table is up to date)") from None
    last = evaluated(records)[-1] if evaluated(records) else {}
    key = metric_key(s.metric)
    test = {k: v for k, v in last.items()
            if k.startswith("test_") or k in ("client_mean_accuracy", "round", key)}
    score = test.get(key)
    others = " ".join(f"{k} {v:.4f}" for k, v in test.items() if k not in ("round", key))
    shown = "none recorded" if score is None else f"{score:.4f}"
    log(f"test score of the chosen setting, on the selection metric: {key} {shown} "
        f"({_measured_on(key)}); also {others} (run folder {folder})")
    return test


def _measured_on(key: str) -> str:
    from fedforge.study.labels import metric

    return metric(key).source or "the test split"


_ROW_FIELDS = ("trial", "state", "seconds", "folder", "error")


def write_outputs(out: Path, rows: list[dict], params: list[Param], metric: str,
                  direction: str, best: dict | None, test: dict | None) -> None:
    """``table.csv``, ``table.json`` and ``sweep.png`` in the sweep folder."""
    import csv
    import io

    from fedforge.experiment.rundir import write_text

    text = io.StringIO()
    fields = ["trial", "state", *(p.key for p in params), metric, "seconds", "folder", "error"]
    writer = csv.DictWriter(text, fieldnames=fields, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    write_text(out, "table.csv", text.getvalue())
    key = metric_key(metric)
    table = {"metric": metric, "direction": direction, "selected_on": selected_on(metric),
             "best": best, "test": test,
             "final_score": None if test is None else {
                 "metric": key, "value": test.get(key), "measured_on": _measured_on(key)},
             "rows": rows}
    write_text(out, "table.json", json.dumps(table, indent=1) + "\n")
    if rows:
        plot_sweep(out, rows, params, metric, best)


def plot_sweep(out: Path, rows: list[dict], params: list[Param], metric: str,
               best: dict | None) -> Path:
    """``sweep.png``: the metric of every trial in order, then against each key's values."""
    import matplotlib
    import matplotlib.ticker

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from fedforge.experiment.rundir import save_figure
    from fedforge.study.plots import plain_text

    scored = [r for r in rows if r.get(metric) is not None]
    fig, axes = plt.subplots(1, 1 + len(params), figsize=(4.2 * (1 + len(params)), 3.8),
                             squeeze=False, layout="constrained")
    ax = axes[0][0]
    for state, marker in (("complete", "o"), ("pruned", "x")):
        pts = [r for r in scored if r["state"] == state]
        if not pts:
            continue
        ax.scatter([r["trial"] for r in pts], [r[metric] for r in pts], marker=marker,
                   label=state, color="C0" if state == "complete" else "C7")
    if best is not None:
        ax.scatter([best["trial"]], [best[metric]], s=140, facecolors="none", edgecolors="C3",
                   label="chosen")
    where = "each client's validation split" if per_client(metric) else "the validation split"
    ax.set(xlabel="trial", ylabel=plain_text(f"{metric}\non {where}"), title="per trial")
    ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    if scored:  # below the panels: a legend never covers a point
        fig.legend(*ax.get_legend_handles_labels(), loc="outside lower center", ncols=3,
                   fontsize=8)
    for ax, p in zip(axes[0][1:], params):
        _plot_key(ax, [r for r in scored if r["state"] == "complete"], p, metric)
        untangle_ticks(fig, ax)
    path = save_figure(out, "sweep.png", fig, dpi=120)
    plt.close(fig)
    return path


def untangle_ticks(fig: Any, ax: Any) -> None:
    """x tick labels that overlap are turned 45° (measured on the drawn figure), and if
    they still do, only every k-th is kept."""
    labels = [t for t in ax.get_xticklabels() if t.get_text()]

    def overlap() -> bool:
        fig.canvas.draw()
        boxes = sorted((t.get_window_extent() for t in labels if t.get_visible()),
                       key=lambda b: b.x0)
        return any(a.x1 + 2 > b.x0 for a, b in zip(boxes, boxes[1:]))

    if len(labels) < 2 or not overlap():
        return
    for t in labels:
        t.set(rotation=45, ha="right", rotation_mode="anchor")
    step = 2
    while overlap() and step < len(labels):
        for i, t in enumerate(labels):
            t.set_visible(i % step == 0)
        step += 1


def _plot_key(ax: Any, rows: list[dict], p: Param, metric: str) -> None:
    from fedforge.study.plots import plain_text

    if p.kind == "choice":
        labels = [str(c) for c in p.choices]
        xs = [labels.index(str(r[p.key])) for r in rows]
        ax.set_xticks(range(len(labels)), [plain_text(x) for x in labels])
        ax.set_xlim(-0.5, len(labels) - 0.5)
    else:
        xs = [r[p.key] for r in rows]
        if p.kind.startswith("log"):
            ax.set_xscale("log")
    from fedforge.study.styles import style_for

    # a method keeps its colour of every other figure; other keys' points are all blue
    colors = ([style_for(str(r[p.key])).color for r in rows] if p.key == "algorithm.name"
              else "C0")
    ax.scatter(xs, [r[metric] for r in rows], color=colors)
    ax.set(xlabel=plain_text(p.key), title=plain_text(f"per value of {p.key}"))
