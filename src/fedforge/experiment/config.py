"""Run configuration: one TOML/YAML file, validated on load, with dotted overrides.

A run is one of two kinds, told apart by the presence of a ``tasks`` list: a single-task run
(:class:`SingleTaskConfig`, synchronous rounds of one model) or a multi-task run
(:class:`MultiTaskConfig`, several tasks on one client pool). Both share the sections of
:class:`BaseRunConfig`; :data:`RunConfig` is their discriminated union, so a key of the other
kind is an unknown key of this one.

Every error names the offending field (``data.partition``, ``algorithm.local_lr``) and what
was expected, and is raised as :class:`ConfigError` so the CLI prints one line, no traceback.
"""

from __future__ import annotations

import copy
import difflib
import json
import re
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    ValidationError,
    field_validator,
    model_validator,
)

from fedforge.algorithms import algorithm_hparams, build_algorithm
from fedforge.algorithms.defaults import METHOD_DEFAULTS
from fedforge.algorithms.personal.fedbn import norm_patterns
from fedforge.core.config_io import (
    MAX_CONFIG_BYTES,
    MAX_DEPTH,
    InputError,
    Unparsable,
    decode,
    depth,
    parse_toml,
    parse_yaml,
)
from fedforge.errors import ConfigError, field_part, format_error, got, shorten
from fedforge.experiment.options import check_builders, partition_option_names
from fedforge.experiment.population_checks import check_population_run, check_population_task
from fedforge.models import head_patterns
from fedforge.privacy.checks import check_privacy
from fedforge.privacy.config import PrivacyConfig
from fedforge.schedulers.client_selection import check_sampler
from fedforge.sim.population import FEDAST_SPEED_CLASSES


class _Section(BaseModel):
    # validate_schema checks JSON types strictly: no true for an int, no "yes" for a bool,
    # no "1" for a number; NaN and infinities are refused for float fields
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


SELECTS_DATA = {"selects_data": True}
"""A field's ``json_schema_extra`` mark: the setting selects which samples train or are
evaluated, so a resumed run may not change it, even in a section it may change
(:func:`data_selecting_keys`, ``fedforge.experiment.rundir``)."""


class DataConfig(_Section):
    dataset: str = "synthetic"
    # folder holding the dataset folders; --data-root wins over it, it wins over
    # $FEDFORGE_DATA, then ./data (fedforge.data.root)
    root: str | None = None
    partition: str = "natural"
    num_clients: int | None = Field(default=None, ge=1)
    options: dict[str, Any] = Field(default_factory=dict)  # loader options
    # alpha, min_size, ...; an override that switches partition drops the options the new
    # partition does not take (data.partition=shards forgets dirichlet's alpha)
    partition_options: dict[str, Any] = Field(default_factory=dict)
    # personalised evaluation: the share of each client's samples held out as its own test
    # set (partitioned datasets; natural writers keep their own test split)
    client_test_fraction: float = Field(default=0.25, ge=0.0, lt=1.0,
                                        json_schema_extra=SELECTS_DATA)


class ModelConfig(_Section):
    name: str = "logreg"
    options: dict[str, Any] = Field(default_factory=dict)
    # start from saved weights: a .safetensors file or a run folder (docs/safl.md)
    init_from: str | None = None
    # the head of the body/head split of personalised methods, as parameter-name patterns
    # ("fc2.*", "re:..."); none: the zoo model's declared head (docs/personalised.md)
    head: list[str] | None = None


class AlgorithmConfig(BaseModel):
    """``name`` plus the algorithm's hyper-parameters as extra keys (checked by the registry)."""

    model_config = ConfigDict(extra="allow")
    name: str = "fedavg"

    @property
    def hparams(self) -> dict[str, Any]:
        return dict(self.model_extra or {})


class ClientConfig(_Section):
    """A client's local work, in both kinds of run: a single-task run trains one local epoch
    unless ``local_steps`` or ``local_epochs`` is set; the keys a multi-task run's task leaves
    unset take its method's defaults (listed under ``[[tasks]]``)."""

    batch_size: int = Field(default=10, ge=1)
    local_steps: int | None = Field(default=None, ge=1)
    local_epochs: int | None = Field(default=None, ge=1)
    # Local-optimizer settings shared by the FedNAR backbones; each, when set, is passed to the
    # algorithm as the hparam named in CLIENT_TO_HPARAM (numbers or schedule tables).
    lr: Any = None
    weight_decay: Any = None
    max_grad_norm: Any = None
    nar: bool | None = None  # FedNAR: decay inside the clip (true) or after it (false)
    # multi-task: the local steps run in epochs of n // batch_size full batches (FedAST's code)
    drop_last: bool = False

    @model_validator(mode="after")
    def _not_steps_and_epochs(self) -> ClientConfig:
        if self.local_steps is not None and self.local_epochs is not None:
            raise ValueError("set exactly one of client.local_steps and client.local_epochs")
        return self


class ServerConfig(_Section):
    clients_per_round: int = Field(default=10, ge=1)
    # None: the algorithm's own (FedAvg: num_samples, n_i / n; SCAFFOLD, FedOpt: uniform 1/S)
    aggregation: Literal["uniform", "num_samples"] | None = None
    # robust aggregation of the client deltas (fedforge.robust): mean | median | trimmed_mean |
    # norm_clip | krum | multi_krum | bulyan | meamed, with its options (beta, max_norm, f, m,
    # selection)
    aggregator: str = "mean"
    aggregator_options: dict[str, Any] = Field(default_factory=dict)
    # which clients train each round (fedforge.sim.selection): uniform | power_of_choice |
    # oort, with its options (fedforge algorithms --params oort)
    sampler: str = "uniform"
    sampler_options: dict[str, Any] = Field(default_factory=dict)


class EvalConfig(_Section):
    every: int = Field(default=1, ge=1)  # single-task; a task's own is tasks[].eval_every
    batch_size: int = Field(default=1024, ge=1)
    per_client: bool = True  # also the mean over clients' own test sets (natural splits)
    # multi-task: n evenly spaced test samples (every N // n-th; some test files are class-sorted)
    max_test_samples: int | None = Field(default=None, ge=1, json_schema_extra=SELECTS_DATA)
    # population datasets (synthetic_population): evaluate on this many sampled clients
    # (default 1000; docs/scale.md)
    clients: int | None = Field(default=None, ge=1, json_schema_extra=SELECTS_DATA)
    # the n highest client ids, never drawn to train (any dataset), evaluated apart:
    # held_out_* (populations, docs/scale.md), held_out_personal_accuracy_* after
    # finetune_steps steps (personalised evaluation, docs/personalised.md)
    held_out: int = Field(default=0, ge=0, json_schema_extra=SELECTS_DATA)
    # personalised evaluation (docs/personalised.md): each client on its own test data; none
    # = on for personalised algorithms
    personal: bool | None = Field(default=None, json_schema_extra=SELECTS_DATA)
    finetune_steps: int = Field(default=0, ge=0)
    # selection without the test data (fedforge sweep on a per-client metric): each client's
    # held-out test samples are left out entirely, this share of its remaining training
    # samples is its validation data, and every metric (pooled ones too) is measured there
    client_validation: float = Field(default=0.0, ge=0.0, lt=1.0, json_schema_extra=SELECTS_DATA)


class EngineConfig(_Section):
    # auto: times loop and vmap variants on the first cohort (from the fedforge command on a
    # CPU with >= 2 threads, also in worker processes); runs too short for that take loop for a
    # CPU conv net (there, from 1000 client updates, in worker processes) and for a model whose
    # client step keeps >= 16 MiB of activations (a transformer), vmap otherwise;
    # metrics record the choice as engine_auto.
    # procs: the cohort split over single-threaded worker processes, one per CPU, each
    # running the loop on its share (faster than threads on small CPUs)
    name: Literal["auto", "vmap", "loop", "distributed", "procs"] = "auto"
    chunk_size: int | Literal["auto"] = "auto"
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    # bf16 = autocast of the forward; bf16_sr also keeps the local weights in bf16, rounded
    # stochastically (docs/speed.md)
    precision: Literal["fp32", "bf16", "tf32", "bf16_sr"] = "fp32"
    client_state: Literal["device", "host"] = "device"  # host: per-client state in CPU RAM
    # where every client's state lives between rounds (docs/scale.md): memory, disk (files in
    # the run folder, O(cohort) per round) or auto (memory while it fits a quarter of the free
    # RAM); store_cache_mb bounds the disk store's open files
    client_store: Literal["auto", "memory", "disk"] = "auto"
    store_cache_mb: int = Field(default=256, ge=1)
    # vmap/distributed: torch.compile the chunk function (for GPUs); true = mode "default",
    # "reduce-overhead" adds CUDA graphs of the fixed-shape chunk on GPUs
    compile: Literal[False, True, "default", "reduce-overhead", "max-autotune"] = False
    # intra-op CPU threads of the process that trains: auto = its physical cores, or fewer
    # when OMP_NUM_THREADS or torch.set_num_threads set fewer (OMP_NUM_THREADS is always
    # kept); procs worker processes run 1 each. The run's first progress line shows the choice
    threads: int | Literal["auto"] = "auto"

    @field_validator("threads")
    @classmethod
    def _positive_threads(cls, v):
        if isinstance(v, int) and v < 1:
            raise ValueError("expected 'auto' or an integer >= 1")
        return v

    @field_validator("chunk_size")
    @classmethod
    def _positive_chunk(cls, v):
        if isinstance(v, int) and v < 1:
            raise ValueError("expected 'auto' or an integer >= 1")
        return v


class CheckpointConfig(_Section):
    # rounds between checkpoints (single task; default 10) or total client updates
    # (multi-task; default 2000); config.resolved.toml records the value used
    every: int | None = Field(default=None, ge=1)
    keep: int = Field(default=2, ge=1)

    def period(self, multitask: bool) -> int:
        """The period in effect: ``every``, else the default of the run's kind (written here
        once; ``resolve_config`` records it in config.resolved.toml)."""
        return self.every or (2000 if multitask else 10)


class AttackConfig(_Section):
    """Simulated Byzantine clients (fedforge.robust.attacks); ``kind = "none"`` is honest."""

    kind: Literal["none", "sign_flip", "scale", "random", "label_flip"] = "none"
    fraction: float = Field(default=0.0, ge=0.0, lt=1.0)
    scale: float = 1.0
    noise_std: float = Field(default=1.0, ge=0.0)


class ClientTiming(_Section):
    """How long a client's job takes in simulated time: its speed class times a delay law
    (fedforge.sim). One definition for straggler rounds (``[sim]``) and multi-task runs
    (``[system]``)."""

    speed_classes: list[tuple[float, float]] = list(FEDAST_SPEED_CLASSES)
    speed_seed: int = 64
    delay: Literal["shifted_exp", "constant", "trace"] = "shifted_exp"
    delay_shift: float = Field(default=0.5, ge=0)
    delay_trace: str | None = None
    trace_scale_by_speed: bool = False

    @model_validator(mode="after")
    def _trace_has_a_file(self) -> ClientTiming:
        if self.delay == "trace" and self.delay_trace is None:
            raise ValueError("delay = 'trace' needs delay_trace, the file of measured delays")
        return self


class SimConfig(ClientTiming):
    """Simulated run time (fedforge.sim.cost): per-step compute and link speeds.

    ``step_time_s`` when set; else the model's training FLOPs x batch / ``device`` preset
    throughput (``device_flops`` overrides the preset). Links default to the 100 Mbps of the
    FAdamGC paper.
    """

    step_time_s: float | None = Field(default=None, ge=0.0)
    device: str = "a100"
    device_flops: float | None = Field(default=None, gt=0.0)
    bandwidth_up_mbps: float = Field(default=100.0, gt=0.0)
    bandwidth_down_mbps: float = Field(default=100.0, gt=0.0)
    latency_s: float = Field(default=0.0, ge=0.0)
    # straggler-aware rounds (fedforge.sim.rounds): client time x speed class x delay law; the
    # round ends at the k-th arrival, later clients are dropped and stay busy
    stragglers: bool = False
    straggler_k: int | None = Field(default=None, ge=1)  # None: wait for every client

    @field_validator("device")
    @classmethod
    def _known_device(cls, v: str) -> str:
        from fedforge.sim.cost import DEVICE_FLOPS  # noqa: PLC0415

        if v not in DEVICE_FLOPS:
            raise ValueError(f"unknown device; known: {', '.join(sorted(DEVICE_FLOPS))}")
        return v


class TaskConfig(_Section):
    """One task of a multi-task run: its own data, model, algorithm and local work."""

    name: str | None = None
    data: DataConfig = Field(default_factory=DataConfig)
    model: ModelConfig = Field(default_factory=ModelConfig)
    algorithm: AlgorithmConfig = Field(default_factory=AlgorithmConfig)
    client: ClientConfig = Field(default_factory=ClientConfig)  # unset keys: the method's
    step_time: float = Field(default=1.0, gt=0)  # e_m, per-step time factor of the delay
    target: float | None = Field(default=None, gt=0, le=1)  # stop at this test accuracy
    eval_every: int = Field(default=4, ge=1)  # server rounds between evaluations of the task
    requests: int | None = Field(default=None, ge=1)  # R_m^(0) (fedast_static)
    sync_clients: int | None = Field(default=None, ge=0)  # Sync-ST per-task client count


class SystemConfig(ClientTiming):
    """The client pool the tasks of a multi-task run share, and its delay law."""

    num_clients: int = Field(default=1000, ge=1)
    available_fraction: float = Field(default=0.3, gt=0, le=1)


def method_option(key: str) -> Any:
    """The default of multi-task option ``key`` (``"async.requests"``), read from
    ``fedforge.algorithms.defaults``, where it is written once with its source. Every method
    listing the option must give it the same value (checked when this module loads)."""
    values = {repr(d.value): d.value for table in METHOD_DEFAULTS.values()
              if (d := table.get(key)) is not None}
    if len(values) != 1:
        found = sorted(values) or "no method lists it"
        raise TypeError(f"{key}: expected one default in METHOD_DEFAULTS, found {found}")
    return next(iter(values.values()))


class AsyncSection(_Section):
    """The buffered asynchronous drivers of a multi-task run (FedAST, FedBuff, FedAsync)."""

    requests: int = Field(default=method_option("async.requests"), ge=1)  # R_m^(0) per task
    rb_ratio: float = Field(default=method_option("async.rb_ratio"), gt=0)
    buffer_size: int | None = Field(default=method_option("async.buffer_size"), ge=1)
    variance_window: int = Field(default=method_option("async.variance_window"), ge=2)
    c_period_factor: float = Field(default=method_option("async.c_period_factor"), gt=0)
    min_requests: int = Field(default=method_option("async.min_requests"), ge=1)
    # jobs per vmapped call
    max_batch: int = Field(default=method_option("async.max_batch"), ge=1)
    fedasync_alpha: float = Field(default=method_option("async.fedasync_alpha"), gt=0, le=1)
    fedasync_a: float = Field(default=method_option("async.fedasync_a"), ge=0)
    # "code": the authors' rules (fedast only)
    allocation: Literal["paper", "code"] = method_option("async.allocation")


class SyncSection(_Section):
    """The synchronous multi-task rounds of a multi-task run (Sync-ST and its variants)."""

    k: int | None = Field(default=method_option("sync.k"), ge=1)
    clients_per_round: int | None = Field(default=method_option("sync.clients_per_round"), ge=1)
    ucb_c: float = Field(default=method_option("sync.ucb_c"), ge=0)


def task_client_defaults(method: str) -> dict[str, Any]:
    """``{client key: value}`` the multi-task ``method`` gives a task's unset client keys."""
    return {k.removeprefix("client."): d.value for k, d in METHOD_DEFAULTS.get(method, {}).items()
            if k.startswith("client.")}


class LoggingConfig(_Section):
    """Logs beside ``metrics.jsonl`` (fedforge.experiment.tracking)."""

    tensorboard: bool = False  # TensorBoard scalars of every round in <run>/tensorboard/
    mlflow: bool = False  # an MLflow run of every round's scalars (pip install 'fedforge[mlflow]')
    wandb: bool = False  # a W&B run of every round's scalars in <run>/wandb/ (fedforge[wandb])
    wandb_project: str = "fedforge"  # the W&B project the run belongs to
    wandb_mode: Literal["offline", "online"] = "offline"  # offline: `wandb sync` uploads later


class BaseRunConfig(_Section):
    """The sections every run reads, whichever its kind."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, populate_by_name=True)
    multitask: ClassVar[bool]
    # keys of the shared sections this kind does not read -> why (a run that sets one is
    # refused, and config.resolved.toml leaves them out); "tasks[]." keys: each task's
    unread: ClassVar[dict[str, str]] = {}
    # the top-level keys in the order config.resolved.toml writes them (keys not listed
    # follow in field order), so a run folder's file stays as earlier releases wrote it
    key_order: ClassVar[tuple[str, ...]] = ()
    name: str = "run"
    seed: int = 0
    eval: EvalConfig = Field(default_factory=EvalConfig)
    engine: EngineConfig = Field(default_factory=EngineConfig)
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)
    # the search space of ``fedforge sweep`` (docs/sweeps.md), e.g. ``algorithm.local_lr =
    # {log_uniform = [1e-3, 1]}``; a run ignores it and its run folder does not record it
    sweep: dict[str, Any] = Field(default_factory=dict, exclude=True)
    # user modules the run needs (their register_* calls add algorithms, datasets, models,
    # partitioners; docs/extending.md): module names or .py paths. Never imported from the
    # config: give each with --plugin, or pass --allow-config-plugins
    plugins: list[str] = Field(default_factory=list)


_MULTI_ONLY = "only a multi-task run reads it"


class SingleTaskConfig(BaseRunConfig):
    """One task in synchronous rounds: a config without a ``tasks`` list."""

    multitask: ClassVar[bool] = False
    unread: ClassVar[dict[str, str]] = {"eval.max_test_samples": _MULTI_ONLY,
                                        "client.drop_last": _MULTI_ONLY}
    key_order: ClassVar[tuple[str, ...]] = (
        "name", "seed", "rounds", "data", "model", "algorithm", "client", "server", "eval",
        "engine", "checkpoint", "attack", "sim", "logging", "privacy", "compare", "sweep",
        "divergence", "rollback_lr_factor", "max_rollbacks", "plugins")
    rounds: int = Field(default=10, ge=1)
    data: DataConfig = Field(default_factory=DataConfig)
    model: ModelConfig = Field(default_factory=ModelConfig)
    algorithm: AlgorithmConfig = Field(default_factory=AlgorithmConfig)
    client: ClientConfig = Field(default_factory=ClientConfig)
    server: ServerConfig = Field(default_factory=ServerConfig)
    attack: AttackConfig = Field(default_factory=AttackConfig)
    sim: SimConfig = Field(default_factory=SimConfig)
    logging: LoggingConfig = Field(default_factory=LoggingConfig)  # TensorBoard, MLflow, W&B
    privacy: PrivacyConfig = Field(default_factory=PrivacyConfig)  # fedforge.privacy
    # per-algorithm config tables merged in when that algorithm runs in ``fedforge compare``
    # (e.g. ``[compare.fedadam.algorithm] server_lr = 1e-3``) or ``fedforge run --variant``
    compare: dict[str, dict[str, Any]] = Field(default_factory=dict)
    # NaN/Inf in a loss or update (fedforge.robust.divergence): stop | skip_client | rollback
    divergence: Literal["stop", "skip_client", "rollback"] = "stop"
    rollback_lr_factor: float = Field(default=0.5, gt=0.0, lt=1.0)
    max_rollbacks: int = Field(default=3, ge=0)

    @model_validator(mode="after")
    def _one_epoch_unless_told(self) -> SingleTaskConfig:
        """Neither ``client.local_steps`` nor ``client.local_epochs``: one local epoch."""
        if self.client.local_steps is None and self.client.local_epochs is None:
            self.client = self.client.model_copy(update={"local_epochs": 1})
        return self


CLIENT_TO_HPARAM = {"lr": "local_lr", "weight_decay": "weight_decay",
                    "max_grad_norm": "max_grad_norm", "nar": "nar"}
"""``client.*`` shorthands passed to a single-task run's algorithm as these hyper-parameters."""
_PER_TASK_EVAL = ("a multi-task run does not read it (each task evaluates every "
                  "tasks[].eval_every of its rounds)")


def _task_sets(key: str) -> str:
    return f"a multi-task run does not read it; set the task's {key}"


class MultiTaskConfig(BaseRunConfig):
    """Several tasks of ``method`` on one client pool: a config with a ``[[tasks]]`` list
    (FedAST and its baselines, fedforge.sim)."""

    multitask: ClassVar[bool] = True
    unread: ClassVar[dict[str, str]] = {
        "eval.every": _PER_TASK_EVAL, "eval.per_client": _PER_TASK_EVAL,
        "tasks[].client.local_epochs": _task_sets("client.local_steps"),
        **{f"tasks[].client.{k}": _task_sets(f"algorithm.{h}")
           for k, h in CLIENT_TO_HPARAM.items()}}
    tasks: list[TaskConfig] = Field(min_length=1)  # one table per task (below)
    method: str | None = None  # a multi-task run's driver (default fedast): fedforge algorithms
    system: SystemConfig = Field(default_factory=SystemConfig)
    async_: AsyncSection = Field(default_factory=AsyncSection, alias="async")
    sync: SyncSection = Field(default_factory=SyncSection)
    max_time: float | None = Field(default=None, gt=0)  # simulated seconds
    max_updates: int | None = Field(default=None, ge=1)  # total client updates

    @property
    def method_name(self) -> str:
        """The method in effect: ``method``, else FedAST (the one place of that default)."""
        return self.method or "fedast"

    @model_validator(mode="after")
    def _method_fills_task_clients(self) -> MultiTaskConfig:
        """A task's client keys it leaves unset take the method's defaults."""
        defaults = task_client_defaults(self.method_name)
        for i, t in enumerate(self.tasks):
            unset = {k: v for k, v in defaults.items() if k not in t.client.model_fields_set}
            if unset:
                self.tasks[i] = t.model_copy(update={"client": t.client.model_copy(
                    update=unset)})
        return self

    def task_name(self, m: int) -> str:
        t = self.tasks[m]
        return t.name or f"{t.data.dataset}-{t.model.name}"


RUN_KINDS: dict[str, type[BaseRunConfig]] = {"single": SingleTaskConfig,
                                             "multi": MultiTaskConfig}


def data_selecting_keys(schema: type[BaseModel] | None = None, prefix: str = ""
                        ) -> tuple[str, ...]:
    """The dotted keys marked :data:`SELECTS_DATA` in ``schema`` (default: both kinds of
    run; ``tasks.*.`` for each task's), as ``config.resolved.toml`` spells them."""
    if schema is None:
        keys = [k for kind in RUN_KINDS.values() for k in data_selecting_keys(kind)]
        return tuple(dict.fromkeys(keys))
    keys = []
    for name, field in schema.model_fields.items():
        key = prefix + (field.alias or name)
        if isinstance(field.json_schema_extra, dict) and field.json_schema_extra.get(
                "selects_data"):
            keys.append(key)
        inner = field.annotation
        if typing.get_origin(inner) is list:  # [[tasks]]: every task's
            inner, key = typing.get_args(inner)[0], key + ".*"
        if isinstance(inner, type) and issubclass(inner, BaseModel):
            keys += data_selecting_keys(inner, key + ".")
    return tuple(keys)


def run_kind(value: Any) -> str:
    """``"multi"`` for a config with a ``tasks`` key (or a :class:`MultiTaskConfig`), else
    ``"single"``: the kind follows from the file itself, which needs no ``kind`` key."""
    if isinstance(value, BaseRunConfig):
        return "multi" if value.multitask else "single"
    return "multi" if isinstance(value, dict) and "tasks" in value else "single"


RunConfig = Annotated[Annotated[SingleTaskConfig, Tag("single")]
                      | Annotated[MultiTaskConfig, Tag("multi")], Discriminator(run_kind)]
"""A run of either kind (for type hints and pydantic fields); :func:`validate` and
:func:`load_config` return one."""


def algorithm_kwargs(cfg: SingleTaskConfig) -> dict[str, Any]:
    """``algorithm.*`` hparams plus the ``client.*`` local-optimizer settings that are set.

    A ``client`` setting the algorithm does not take, or one also given under ``algorithm``,
    is an error naming the field.
    """
    kwargs = dict(cfg.algorithm.hparams)
    allowed = algorithm_hparams(cfg.algorithm.name) if cfg.algorithm.name else {}
    for key, hparam in CLIENT_TO_HPARAM.items():
        value = getattr(cfg.client, key)
        if value is None:
            continue
        if hparam not in allowed:
            raise ConfigError(f"client.{key}: algorithm {cfg.algorithm.name!r} does not support "
                              f"it (no {hparam!r} hyper-parameter)")
        if hparam in kwargs:
            raise ConfigError(f"client.{key}: also given as algorithm.{hparam}; set one of them")
        kwargs[hparam] = value
    head = cfg.model.head if cfg.model.head is not None else head_patterns(cfg.model.name)
    if "head" in allowed and "head" not in kwargs and head is not None:  # the model's split
        kwargs["head"] = list(head)
    elif cfg.model.head is not None and "head" not in allowed:
        raise ConfigError(f"model.head: algorithm {cfg.algorithm.name!r} has no body/head split")
    norm = norm_patterns(cfg.model.name)  # FedBN: the zoo model's normalisation layers
    if "norm" in allowed and "norm" not in kwargs and norm is not None:
        kwargs["norm"] = list(norm)
    return kwargs


def _parse_value(text: str) -> Any:
    """``'0.1' -> 0.1``, ``'1e-3' -> 0.001``, ``'true' -> True``, ``'[1,2]' -> [1, 2]``,
    ``'{a: 1}'`` a table; YAML 1.2 core scalars, so ``yes`` and ``1:30`` stay strings.
    Text that is not a YAML value is a string; past the limits it raises InputError."""
    if not text.strip():
        return ""
    try:
        return parse_yaml(text)
    except Unparsable:
        return text


def _text_field(schema: type[BaseModel] | None, parts: list[str]) -> bool:
    """Whether ``parts`` names a string field of ``schema`` (the override is then its text)."""
    field = _field_at(schema, parts)
    return field is not None and field.annotation in (str, str | None)


def _field_at(schema: Any, parts: list[str]) -> Any:
    """The pydantic field that the dotted ``parts`` name within ``schema`` (section by
    section, by name or alias), or None where a part names nothing."""
    field = None
    for part in parts:
        model = schema if field is None else field.annotation
        if not (isinstance(model, type) and issubclass(model, BaseModel)):
            return None
        field = next((f for n, f in model.model_fields.items() if part in (n, f.alias)), None)
        if field is None:
            return None
    return field


_NULLS = ("~", "null", "Null", "NULL")


_KEY_PART = re.compile(r"[\w-]+")  # one name of a dotted key (``client``, ``batch_size``)


def apply_overrides(raw: dict, overrides: list[str], schema: type[BaseModel] | None = None,
                    where: str = "") -> dict:
    """Apply ``a.b.c=value`` overrides to a raw config dict (a new dict is returned).

    Values are YAML flow values (numbers, ``true``/``false``, ``null``, ``[..]``, ``{..}``);
    for a string field of ``schema`` (default: the model of ``raw``'s kind of run) the text
    is kept as typed, so ``name=2024`` is the name ``"2024"``. The schema then checks types
    strictly. ``where`` prefixes field names in errors (``tasks[1].``).
    """
    schema = RUN_KINDS[run_kind(raw)] if schema is None else schema
    if not isinstance(raw, dict):
        raise ConfigError(f"{where.rstrip('.') or 'config'}: expected a table of sections")
    out = copy.deepcopy(raw)
    for item in overrides:
        shown = repr(shorten(item, 60))
        if "=" not in item:
            raise ConfigError(f"override {shown}: expected key=value, e.g. client.batch_size=32")
        key, text = item.split("=", 1)
        parts = [p.strip() for p in key.strip().split(".") if p.strip()]
        if not parts:
            raise ConfigError(f"override {shown}: empty key")
        if not all(_KEY_PART.fullmatch(p) for p in parts):
            raise ConfigError(f"override {shown}: unknown config key {shorten(repr(key), 60)};"
                              " a key is dotted names, e.g. client.batch_size")
        try:
            value = _parse_value(text)
        except InputError as exc:
            raise ConfigError(f"override {shown}: {exc}") from None
        if _text_field(schema, parts):
            stripped = text.strip()
            quoted = isinstance(value, str) and stripped[:1] in ("'", '"')
            if not quoted and not (value is None and stripped in _NULLS):
                value = stripped
        if len(parts) + depth(value) > MAX_DEPTH:
            raise ConfigError(f"override {shown}: nested deeper than {MAX_DEPTH} levels")
        node = out
        for i, part in enumerate(parts[:-1]):
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(f"{where}{'.'.join(parts[: i + 1])}: is a value, not a section")
            node = child
        node[parts[-1]] = value
    return _drop_stale_partition_options(raw, out)


def _drop_stale_partition_options(before: dict, after: dict) -> dict:
    """An override that switches ``data.partition`` drops the options of the old partition
    that the new one does not take (Dirichlet's ``alpha`` is no option of ``shards``), as a
    researcher switching partition expects; options both take carry over, and options the
    overrides set are kept (and checked)."""
    old, new = before.get("data"), after.get("data")
    if not (isinstance(old, dict) and isinstance(new, dict)):
        return after
    options = new.get("partition_options")
    if old.get("partition") == new.get("partition") or not isinstance(options, dict):
        return after
    accepted = partition_option_names(str(new.get("partition", "natural")))
    if accepted is None:
        return after
    was = old.get("partition_options") if isinstance(old.get("partition_options"), dict) else {}
    new["partition_options"] = {k: v for k, v in options.items()
                                if k in accepted or k not in was or was[k] != v}
    return after


def load_raw(path: str | Path) -> dict:
    """Read a TOML or YAML file into plain data, within the limits of ``config_io``: at most
    MAX_CONFIG_BYTES, MAX_DEPTH levels and MAX_VALUES values (YAML aliases expanded)."""
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"config file {path}: not found")
    if not path.is_file():
        raise ConfigError(f"config file {path}: not a regular file")
    if path.suffix not in (".toml", ".yaml", ".yml"):
        raise ConfigError(f"config file {path}: expected a .toml, .yaml or .yml file")
    try:
        with path.open("rb") as f:
            data = f.read(MAX_CONFIG_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"config file {path}: cannot read ({exc.strerror or exc})") from None
    try:
        text = decode(data)
        raw = parse_toml(text) if path.suffix == ".toml" else parse_yaml(text)
    except InputError as exc:
        raise ConfigError(f"config file {path}: {exc}") from None
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ConfigError(f"config file {path}: expected a table of sections at the top level")
    return raw


def validate_schema(schema: type[BaseModel], raw: Any, prefix: str = "",
                    explain: Callable[[ValidationError], str | None] | None = None) -> Any:
    """``schema`` validated strictly, as JSON types: an int field takes only integers (not
    ``true`` or ``"3"``), a bool field only ``true``/``false``, a float field finite numbers.
    ``explain`` may give a clearer one-line message for an error than the generic one."""
    where = prefix or "config"
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: expected a table of sections")
    try:
        text = json.dumps(raw)
    except (TypeError, ValueError, RecursionError) as exc:  # Python callers' objects
        raise ConfigError(f"{where}: expected plain data ({exc})") from None
    try:
        return schema.model_validate_json(text, strict=True)
    except ValidationError as exc:
        raise ConfigError((explain and explain(exc)) or format_error(exc, raw, prefix)) from None


def validate(raw: dict | BaseRunConfig, *, allow_plugins: bool = False) -> RunConfig:
    """Validate a raw dict (the schema of its kind of run, then the registries: dataset,
    model, algorithm, and whether the run's driver serves the algorithm).

    A config cannot run code: its ``plugins`` must be imported already (``--plugin``,
    :func:`fedforge.load_plugins`); ``allow_plugins=True`` imports them instead."""
    if isinstance(raw, BaseRunConfig):
        raw = raw.model_dump(by_alias=True)
    _check_plugins(raw, allow_plugins)
    kind = RUN_KINDS[run_kind(raw)]
    cfg = validate_schema(kind, raw,
                          explain=lambda exc: (_not_config(exc) or _other_kind(kind, exc)
                                               or _did_you_mean(kind, exc)))
    _check_unread(cfg)
    if cfg.multitask:
        _check_method(cfg)
        _check_tasks(cfg)
    else:
        _check_registries(cfg)
    return cfg


def _check_plugins(raw: Any, allow: bool) -> None:
    """The config's ``plugins`` come first (they register names the checks below look up),
    but a config file may not import code: each must be imported already unless ``allow``."""
    plugins = raw.get("plugins") if isinstance(raw, dict) else None
    if not isinstance(plugins, list) or not all(isinstance(p, str) for p in plugins):
        return  # the schema check names the field
    from fedforge.plugins import PluginError, is_loaded, load_plugins  # noqa: PLC0415

    missing = [p for p in plugins if not is_loaded(p)]
    if missing and not allow:
        given = " ".join(f"--plugin {p}" for p in missing)
        raise ConfigError(f"plugins: a config cannot import code ({', '.join(missing)} not "
                          f"imported); pass {given} or --allow-config-plugins (Python: "
                          "fedforge.load_plugins first, or allow_plugins=True)")
    try:
        load_plugins(missing, "plugins")
    except PluginError as exc:
        raise ConfigError(str(exc)) from None


def listed_plugins(raw: Any) -> list[str]:
    """The plugins a raw config names, its own then its ``[compare.*]`` tables', for a caller
    that chose to import them (``--allow-config-plugins``)."""
    compare = raw.get("compare") if isinstance(raw, dict) else None
    tables = [raw, *(compare.values() if isinstance(compare, dict) else ())]
    names: list[str] = []
    for table in tables:
        listed = table.get("plugins") if isinstance(table, dict) else None
        if isinstance(listed, list):
            names += [p for p in listed if isinstance(p, str) and p not in names]
    return names


def load_config(path: str | Path, overrides: list[str] | None = None, *,
                allow_plugins: bool = False) -> RunConfig:
    """Load and validate a run config. ``tasks.1.target=0.8`` (or ``tasks[1].target=0.8``)
    sets one task's key, ``tasks.target=0.8`` every task's. Nothing is imported: the config's
    ``plugins`` must be loaded already, unless ``allow_plugins`` (see :func:`validate`)."""
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
    return validate(apply_overrides(raw, plain), allow_plugins=allow_plugins)


_TASK_KEY = re.compile(r"^tasks(?:\.(\d+)|\[(\d+)\])?\.(.+=.*)$", re.S)


# keys that are options of the command line or the environment, never of a config (a config,
# or a sweep's space, may not choose where results are written) -> where they go instead
NOT_CONFIG = {("logging", "mlflow_uri"): "a config does not choose where results are written;"
              " pass --mlflow-uri URI or set FEDFORGE_MLFLOW_URI (docs/figures-and-reports.md)"}


def _not_config(exc: ValidationError) -> str | None:
    """A key of :data:`NOT_CONFIG` (pydantic: an extra key), with where to give it instead."""
    for err in exc.errors():
        where = NOT_CONFIG.get(tuple(err["loc"])) if err["type"] == "extra_forbidden" else None
        if where:
            return f"{'.'.join(map(str, err['loc']))}: {where}"
    return None


def _did_you_mean(kind: type[BaseModel], exc: ValidationError) -> str | None:
    """An unknown key close to a known one of its section (``clients`` for ``client``),
    named with the suggestion; None when nothing is close."""
    first = exc.errors()[0]
    if first["type"] != "extra_forbidden" or not all(isinstance(p, str) for p in first["loc"]):
        return None
    *sections, key = first["loc"]
    section = _field_at(kind, sections) if sections else None
    model = kind if not sections else section and section.annotation
    if not (isinstance(model, type) and issubclass(model, BaseModel)):
        return None
    names = [n for name, f in model.model_fields.items() for n in (name, f.alias) if n]
    close = difflib.get_close_matches(key, names, n=1, cutoff=0.6)
    if not close:
        return None
    path = ".".join(field_part(p) for p in first["loc"])
    return f"{path}: unknown key; did you mean {close[0]!r}?{got(first.get('input'))}"


def _other_kind(kind: type[BaseRunConfig], exc: ValidationError) -> str | None:
    """A top-level key only the other kind of run reads (pydantic: an extra key), said so."""
    other = MultiTaskConfig if kind is SingleTaskConfig else SingleTaskConfig
    names = {n for name, f in other.model_fields.items() for n in (name, f.alias) if n}
    names -= set(kind.model_fields)
    for err in exc.errors():
        key = err["loc"][0] if err["type"] == "extra_forbidden" and len(err["loc"]) == 1 else None
        if key not in names:
            continue
        if other.multitask:
            return (f"{key}: only a multi-task run reads it; add a [[tasks]] list (fedforge "
                    "algorithms lists the methods)")
        where = (f"set it per task (tasks[].{key})" if key in TaskConfig.model_fields
                 else "drop it")
        return f"{key}: a multi-task run ([[tasks]]) does not read it; {where}"
    return None


def _check_unread(cfg: BaseRunConfig) -> None:
    """A shared section's key this kind of run does not read is refused in one line, so no
    setting is silently ignored."""
    for key, why in type(cfg).unread.items():
        *within, section, name = key.split(".")
        owners = ([(f"tasks[{i}].", t) for i, t in enumerate(cfg.tasks)]
                  if within == ["tasks[]"] else [("", cfg)])
        for where, owner in owners:
            part = getattr(owner, section)
            if getattr(part, name) != type(part).model_fields[name].get_default(
                    call_default_factory=True):
                raise ConfigError(f"{where}{section}.{name}: {why}")


def _check_method(cfg: MultiTaskConfig) -> None:
    """``method`` names a multi-task driver, and per-task Sync-ST client counts are given
    for every task or none (refused here rather than mid-run)."""
    from fedforge.schedulers.fedast import ASYNC_METHODS  # noqa: PLC0415 (sim imports torch)
    from fedforge.schedulers.multitask_sync import SYNC_METHODS  # noqa: PLC0415

    methods = (*ASYNC_METHODS, *SYNC_METHODS)
    if cfg.method is not None and cfg.method not in methods:
        raise ConfigError(f"method: unknown method {cfg.method!r}; expected one of "
                          f"{list(methods)}")
    counts = [t.sync_clients for t in cfg.tasks]
    if any(c is not None for c in counts) and any(c is None for c in counts):
        raise ConfigError("tasks[].sync_clients: set it for every task or for none")


def _check_tasks(cfg: MultiTaskConfig) -> None:
    """Each task's dataset, partition, model, options and algorithm, and that the method's
    driver serves the algorithm (refused here, in one line, rather than mid-run)."""
    import torch  # noqa: PLC0415

    from fedforge.algorithms import build_algorithm  # noqa: PLC0415
    from fedforge.protocol.algorithm import check_support  # noqa: PLC0415
    from fedforge.schedulers.serves import check_model_mixing, driver_serves  # noqa: PLC0415

    method = cfg.method_name
    driver, serves = driver_serves(method)
    for i, t in enumerate(cfg.tasks):
        where = f"tasks[{i}]"
        _check_data_model(f"{where}.", t.data, t.model, extra_partitions=("dirichlet_fixed",))
        check_population_task(f"{where}.", t.data.dataset)
        _check_hparam_names(f"{where}.", t.algorithm)
        try:
            algorithm = build_algorithm(t.algorithm.name, **t.algorithm.hparams)
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"{where}.{exc}") from None
        try:
            check_support(algorithm, {"w": torch.zeros(2)}, f"{where}.algorithm.name",
                          f"{method} {driver}", serves)
            check_model_mixing(algorithm, method, f"{where}.algorithm.name")
        except ValueError as exc:
            raise ConfigError(str(exc)) from None


def _check_data_model(where: str, data: DataConfig, model: ModelConfig,
                      extra_partitions: tuple[str, ...] = ()) -> None:
    """Dataset, partition and model names, the data root and the option tables."""
    from fedforge.data import DATASETS, PARTITIONERS  # noqa: PLC0415
    from fedforge.models import MODELS  # noqa: PLC0415

    if data.dataset not in DATASETS:
        raise ConfigError(f"{where}data.dataset: unknown dataset {data.dataset!r}; expected "
                          f"one of {sorted(DATASETS)}")
    partitions = [*PARTITIONERS, *extra_partitions]
    if data.partition not in partitions:
        raise ConfigError(f"{where}data.partition: unknown partition {data.partition!r}; "
                          f"expected one of {sorted(partitions)}")
    if model.name not in MODELS:
        raise ConfigError(f"{where}model.name: unknown model {model.name!r}; expected one of "
                          f"{sorted(MODELS)}")
    if data.root is not None and not Path(data.root).expanduser().is_dir():
        raise ConfigError(f"{where}data.root: directory {data.root!r} does not exist")
    check_builders(where, data.dataset, model.name, data.partition, data.options,
                   model.options, data.partition_options)


def _check_hparam_names(where: str, algorithm: AlgorithmConfig) -> None:
    for key in algorithm.hparams:  # odd keys from a hostile file: name them quoted
        if field_part(key) != key:
            raise ConfigError(f"{where}algorithm.{field_part(key)}: not a hyper-parameter name")


def _check_registries(cfg: SingleTaskConfig) -> None:
    _check_data_model("", cfg.data, cfg.model)
    _check_hparam_names("", cfg.algorithm)
    try:
        algorithm = build_algorithm(cfg.algorithm.name, **algorithm_kwargs(cfg))
    except ConfigError:
        raise
    except (TypeError, ValueError) as exc:
        raise ConfigError(str(exc)) from None
    check_participation(cfg, algorithm, cfg.data.num_clients)
    _check_robust(cfg, algorithm)
    check_privacy(cfg, algorithm)
    check_population_run(cfg, algorithm)
    check_sampler(cfg)


def check_participation(cfg: SingleTaskConfig, algorithm: Any, population: int | None) -> None:
    """An algorithm whose maths needs every client every round (MARINA) refuses a sampled
    cohort, and straggler rounds that drop clients, in one line naming it and the driver.

    ``population`` is the number of clients when known (None: only the stragglers are
    checked here; the runner checks the cohort once the dataset is built)."""
    if "full_participation" not in algorithm.requires:
        return
    per_round = cfg.server.clients_per_round
    if population is not None and per_round < population:
        raise ConfigError(
            f"server.clients_per_round: {algorithm.name!r} needs every client in every round, "
            f"which synchronous rounds of {per_round} of {population} clients cannot serve; "
            f"set server.clients_per_round = {population}")
    k = cfg.sim.straggler_k
    if cfg.sim.stragglers and k is not None and k < min(per_round, population or per_round):
        raise ConfigError(
            f"sim.straggler_k: {algorithm.name!r} needs every client in every round, which "
            f"straggler rounds keeping the first {k} arrivals cannot serve; set "
            "sim.straggler_k = none")


def _check_robust(cfg: SingleTaskConfig, algorithm: Any) -> None:
    """server.aggregator / its options, that the algorithm's server step reads what a robust
    aggregator replaces, and that rollback can scale the local lr."""
    from fedforge.robust.aggregators import build_aggregator  # noqa: PLC0415
    from fedforge.robust.divergence import scale_lr  # noqa: PLC0415

    aggregator = cfg.server.aggregator
    if aggregator != "mean" and not algorithm.steps_on_mean_delta:
        raise ConfigError(f"server.aggregator: {aggregator!r} would change nothing for "
                          f"algorithm {algorithm.name!r}, whose server step does not move the "
                          f"model from the mean delta (the one value a robust aggregator "
                          f"replaces); use server.aggregator = \"mean\"")
    try:
        build_aggregator(cfg.server.aggregator, **cfg.server.aggregator_options)
        if cfg.divergence == "rollback":
            scale_lr(cfg.algorithm.name, algorithm_kwargs(cfg), cfg.rollback_lr_factor)
    except (TypeError, ValueError) as exc:
        raise ConfigError(str(exc)) from None


def dump_config(cfg: BaseRunConfig, path: Path) -> None:
    """Write the resolved config as TOML (``config.resolved.toml``) with the keys the run's
    kind reads only, so the file loads back as the same run."""
    import tomli_w  # noqa: PLC0415 (optional writer)

    data = cfg.model_dump(exclude_none=True, by_alias=True)
    for key in type(cfg).unread:
        *within, section, name = key.split(".")
        for owner in data.get("tasks", []) if within == ["tasks[]"] else [data]:
            owner.get(section, {}).pop(name, None)
    order = {k: i for i, k in enumerate(type(cfg).key_order)}
    data = dict(sorted(data.items(), key=lambda kv: order.get(kv[0], len(order))))
    path.write_text(tomli_w.dumps(data), encoding="utf-8")
