"""Multi-task run configuration: a list of tasks sharing one client pool and one clock.

A config with a ``[[tasks]]`` list is a multi-task (asynchronous or synchronous-simultaneous)
run; ``fedforge run`` sends it to :func:`fedforge.experiment.async_runner.run_multitask`.
Errors name the field, e.g. ``tasks[2].model.name: unknown model 'cnnn'; ...``.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import Field, field_validator

from fedforge.experiment.config import (
    AlgorithmConfig,
    ConfigError,
    DataConfig,
    EngineConfig,
    ModelConfig,
    _Section,
    apply_overrides,
    load_raw,
    validate_schema,
)
from fedforge.sim.fedast import ASYNC_METHODS
from fedforge.sim.multitask_sync import SYNC_METHODS
from fedforge.sim.population import FEDAST_SPEED_CLASSES

METHODS = (*ASYNC_METHODS, *SYNC_METHODS)


class TaskClientConfig(_Section):
    batch_size: int = Field(default=32, ge=1)
    local_steps: int = Field(default=27, ge=1)  # tau_m (3 epochs of 300/32 in the paper)


class TaskConfig(_Section):
    name: str | None = None
    data: DataConfig = Field(default_factory=DataConfig)
    model: ModelConfig = Field(default_factory=ModelConfig)
    algorithm: AlgorithmConfig = Field(default_factory=AlgorithmConfig)
    client: TaskClientConfig = Field(default_factory=TaskClientConfig)
    step_time: float = Field(default=1.0, gt=0)  # e_m, per-step time factor of the delay
    target: float | None = Field(default=None, gt=0, le=1)  # stop at this test accuracy
    eval_every: int = Field(default=4, ge=1)  # server rounds of this task between evals
    requests: int | None = Field(default=None, ge=1)  # R_m^(0) (fedast_static)
    sync_clients: int | None = Field(default=None, ge=0)  # Sync-ST per-task client count


class SystemConfig(_Section):
    num_clients: int = Field(default=1000, ge=1)
    speed_classes: list[tuple[float, float]] = list(FEDAST_SPEED_CLASSES)
    speed_seed: int = 64
    available_fraction: float = Field(default=0.3, gt=0, le=1)
    delay: Literal["shifted_exp", "constant", "trace"] = "shifted_exp"
    delay_shift: float = Field(default=0.5, ge=0)
    delay_trace: str | None = None
    trace_scale_by_speed: bool = False


class AsyncSection(_Section):
    requests: int = Field(default=96, ge=1)  # R_m^(0) per task
    rb_ratio: float = Field(default=32.0, gt=0)
    buffer_size: int | None = Field(default=None, ge=1)
    variance_window: int = Field(default=8, ge=2)
    c_period_factor: float = Field(default=0.75, gt=0)
    min_requests: int = Field(default=1, ge=1)
    max_batch: int = Field(default=64, ge=1)  # jobs per vmapped call
    fedasync_alpha: float = Field(default=0.6, gt=0, le=1)
    fedasync_a: float = Field(default=0.5, ge=0)


class SyncSection(_Section):
    k: int | None = Field(default=30, ge=1)
    clients_per_round: int | None = Field(default=None, ge=1)
    ucb_c: float = Field(default=0.5, ge=0)


class MTEvalConfig(_Section):
    batch_size: int = Field(default=1024, ge=1)
    max_test_samples: int | None = Field(default=None, ge=1)  # first n test samples only


class MTCheckpointConfig(_Section):
    every: int = Field(default=2000, ge=1)  # total client updates between checkpoints
    keep: int = Field(default=2, ge=1)


class MultiTaskConfig(_Section):
    name: str = "multitask"
    seed: int = 0
    method: str = "fedast"
    tasks: list[TaskConfig] = Field(min_length=1)
    system: SystemConfig = Field(default_factory=SystemConfig)
    async_: AsyncSection = Field(default_factory=AsyncSection, alias="async")
    sync: SyncSection = Field(default_factory=SyncSection)
    max_time: float | None = Field(default=None, gt=0)  # simulated seconds
    max_updates: int | None = Field(default=None, ge=1)  # total client updates
    eval: MTEvalConfig = Field(default_factory=MTEvalConfig)
    engine: EngineConfig = Field(default_factory=EngineConfig)
    checkpoint: MTCheckpointConfig = Field(default_factory=MTCheckpointConfig)
    model_config = {"extra": "forbid", "populate_by_name": True}

    @field_validator("method")
    @classmethod
    def _known_method(cls, v: str) -> str:
        if v not in METHODS:
            raise ValueError(f"unknown method {v!r}; expected one of {list(METHODS)}")
        return v

    def task_name(self, m: int) -> str:
        t = self.tasks[m]
        return t.name or f"{t.data.dataset}-{t.model.name}"


def is_multitask(raw: dict) -> bool:
    return isinstance(raw, dict) and "tasks" in raw


def validate_multitask(raw: dict) -> MultiTaskConfig:
    """Strict schema check (as :func:`fedforge.experiment.config.validate`), then each task's
    dataset, partition, model, options and algorithm."""
    cfg = validate_schema(MultiTaskConfig, raw)
    _check_tasks(cfg)
    return cfg


def load_multitask(path, overrides: list[str] | None = None) -> MultiTaskConfig:
    """Load and validate; ``tasks.1.target=0.8`` (or ``tasks[1].target=0.8``) sets one task's
    key, ``tasks.target=0.8`` every task's."""
    raw = load_raw(path)
    plain = []
    for item in overrides or []:
        m = _TASK_KEY.match(item)
        if not m:
            plain.append(item)
            continue
        tasks = raw.get("tasks", [])
        if not isinstance(tasks, list):
            raise ConfigError("tasks: expected a list of task tables ([[tasks]])")
        index, rest = m.group(1) or m.group(2), m.group(3)
        targets = range(len(tasks)) if index is None else [int(index)]
        for i in targets:
            if not 0 <= i < len(tasks):
                raise ConfigError(f"tasks[{i}]: no such task (the config has {len(tasks)})")
            tasks[i] = apply_overrides(tasks[i], [rest], TaskConfig, f"tasks[{i}].")
    return validate_multitask(apply_overrides(raw, plain, MultiTaskConfig))


_TASK_KEY = re.compile(r"^tasks(?:\.(\d+)|\[(\d+)\])?\.(.+=.*)$", re.S)


def _check_tasks(cfg: MultiTaskConfig) -> None:
    from fedforge.algorithms import build_algorithm
    from fedforge.data import DATASETS, PARTITIONERS
    from fedforge.experiment.options import check_builders
    from fedforge.models import MODELS

    for i, t in enumerate(cfg.tasks):
        where = f"tasks[{i}]"
        if t.data.dataset not in DATASETS:
            raise ConfigError(f"{where}.data.dataset: unknown dataset {t.data.dataset!r}; "
                              f"expected one of {sorted(DATASETS)}")
        parts = [*PARTITIONERS, "dirichlet_fixed"]
        if t.data.partition not in parts:
            raise ConfigError(f"{where}.data.partition: unknown partition {t.data.partition!r}; "
                              f"expected one of {sorted(parts)}")
        if t.model.name not in MODELS:
            raise ConfigError(f"{where}.model.name: unknown model {t.model.name!r}; expected "
                              f"one of {sorted(MODELS)}")
        check_builders(f"{where}.", t.data.dataset, t.model.name, t.data.partition,
                       t.data.options, t.model.options, t.data.partition_options)
        try:
            build_algorithm(t.algorithm.name, **t.algorithm.hparams)
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"{where}.{exc}") from None
    counts = [t.sync_clients for t in cfg.tasks]
    if any(c is not None for c in counts) and any(c is None for c in counts):
        raise ConfigError("tasks[].sync_clients: set it for every task or for none")


def dump_multitask(cfg: MultiTaskConfig, path) -> None:
    import tomli_w  # noqa: PLC0415

    data: dict[str, Any] = cfg.model_dump(exclude_none=True, by_alias=True)
    path.write_text(tomli_w.dumps(data), encoding="utf-8")
