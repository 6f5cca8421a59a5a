"""Run configuration: one TOML/YAML file, validated on load, with dotted overrides.

Every error names the offending field (``data.partition``, ``algorithm.local_lr``) and what
was expected, and is raised as :class:`ConfigError` so the CLI prints one line, no traceback.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


class ConfigError(ValueError):
    """A bad configuration; the message starts with the field's dotted path."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class DataConfig(_Section):
    dataset: str = "synthetic"
    root: str | None = None  # directory holding dataset folders; default $FEDFORGE_DATA
    partition: str = "natural"
    num_clients: int | None = Field(default=None, ge=1)
    options: dict[str, Any] = Field(default_factory=dict)  # loader options
    partition_options: dict[str, Any] = Field(default_factory=dict)  # alpha, min_size, ...


class ModelConfig(_Section):
    name: str = "logreg"
    options: dict[str, Any] = Field(default_factory=dict)


class AlgorithmConfig(BaseModel):
    """``name`` plus the algorithm's hyper-parameters as extra keys (checked by the registry)."""

    model_config = ConfigDict(extra="allow")
    name: str = "fedavg"

    @property
    def hparams(self) -> dict[str, Any]:
        return dict(self.model_extra or {})


class ClientConfig(_Section):
    batch_size: int = Field(default=10, ge=1)
    local_steps: int | None = Field(default=None, ge=1)
    local_epochs: int | None = Field(default=None, ge=1)
    # Local-optimizer settings shared by the FedNAR backbones; each, when set, is passed to the
    # algorithm as the hparam named in CLIENT_TO_HPARAM (numbers or schedule tables).
    lr: Any = None
    weight_decay: Any = None
    max_grad_norm: Any = None
    nar: bool | None = None  # FedNAR: decay inside the clip (true) or after it (false)

    @model_validator(mode="after")
    def _one_of_steps_or_epochs(self):
        if self.local_steps is None and self.local_epochs is None:
            self.local_epochs = 1
        if self.local_steps is not None and self.local_epochs is not None:
            raise ValueError("set exactly one of client.local_steps and client.local_epochs")
        return self


class ServerConfig(_Section):
    clients_per_round: int = Field(default=10, ge=1)
    aggregation: Literal["uniform", "num_samples"] = "uniform"
    # robust aggregation of the client deltas (fedforge.robust): mean | median | trimmed_mean |
    # norm_clip | krum | multi_krum, with its options (beta, max_norm, f, m)
    aggregator: str = "mean"
    aggregator_options: dict[str, Any] = Field(default_factory=dict)


class EvalConfig(_Section):
    every: int = Field(default=1, ge=1)
    batch_size: int = Field(default=1024, ge=1)
    per_client: bool = True  # also the mean over clients' own test sets (natural splits)


class EngineConfig(_Section):
    name: Literal["vmap", "loop", "distributed"] = "vmap"
    chunk_size: int | Literal["auto"] = "auto"
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    precision: Literal["fp32", "bf16", "tf32"] = "fp32"  # bf16 = autocast of the forward
    client_state: Literal["device", "host"] = "device"  # host: per-client state in CPU RAM
    # vmap/distributed: torch.compile the chunk function (for GPUs); true = mode "default",
    # "reduce-overhead" adds CUDA graphs of the fixed-shape chunk on GPUs
    compile: Literal[False, True, "default", "reduce-overhead", "max-autotune"] = False

    @field_validator("chunk_size")
    @classmethod
    def _positive_chunk(cls, v):
        if isinstance(v, int) and v < 1:
            raise ValueError("expected 'auto' or an integer >= 1")
        return v


class CheckpointConfig(_Section):
    every: int = Field(default=10, ge=1)
    keep: int = Field(default=2, ge=1)


class AttackConfig(_Section):
    """Simulated Byzantine clients (fedforge.robust.attacks); ``kind = "none"`` is honest."""

    kind: Literal["none", "sign_flip", "scale", "random", "label_flip"] = "none"
    fraction: float = Field(default=0.0, ge=0.0, lt=1.0)
    scale: float = 1.0
    noise_std: float = Field(default=1.0, ge=0.0)


class SimConfig(_Section):
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
    # straggler-aware rounds (fedforge.sim.rounds, issue 5): client time x speed class x delay
    # law; the round ends at the k-th arrival, later clients are dropped and stay busy
    stragglers: bool = False
    straggler_k: int | None = Field(default=None, ge=1)  # None: wait for every client
    delay: Literal["shifted_exp", "constant"] = "shifted_exp"
    speed_classes: list[tuple[float, float]] = [(0.25, 1.3), (0.5, 1.0), (0.25, 0.7)]
    speed_seed: int = 64

    @field_validator("device")
    @classmethod
    def _known_device(cls, v: str) -> str:
        from fedforge.sim.cost import DEVICE_FLOPS  # noqa: PLC0415

        if v not in DEVICE_FLOPS:
            raise ValueError(f"unknown device; known: {', '.join(sorted(DEVICE_FLOPS))}")
        return v


class RunConfig(_Section):
    name: str = "run"
    seed: int = 0
    rounds: int = Field(default=10, ge=1)
    data: DataConfig = Field(default_factory=DataConfig)
    model: ModelConfig = Field(default_factory=ModelConfig)
    algorithm: AlgorithmConfig = Field(default_factory=AlgorithmConfig)
    client: ClientConfig = Field(default_factory=ClientConfig)
    server: ServerConfig = Field(default_factory=ServerConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    engine: EngineConfig = Field(default_factory=EngineConfig)
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)
    attack: AttackConfig = Field(default_factory=AttackConfig)
    sim: SimConfig = Field(default_factory=SimConfig)
    # ``fedforge compare`` only: per-algorithm config tables merged in when that algorithm runs
    # (e.g. ``[compare.fedadam.algorithm] server_lr = 1e-3``); ``fedforge run`` ignores it.
    compare: dict[str, dict[str, Any]] = Field(default_factory=dict)
    # NaN/Inf in a loss or update (fedforge.robust.divergence): stop | skip_client | rollback
    divergence: Literal["stop", "skip_client", "rollback"] = "stop"
    rollback_lr_factor: float = Field(default=0.5, gt=0.0, lt=1.0)
    max_rollbacks: int = Field(default=3, ge=0)


CLIENT_TO_HPARAM = {"lr": "local_lr", "weight_decay": "weight_decay",
                    "max_grad_norm": "max_grad_norm", "nar": "nar"}


def algorithm_kwargs(cfg: RunConfig) -> dict[str, Any]:
    """``algorithm.*`` hparams plus the ``client.*`` local-optimizer settings that are set.

    A ``client`` setting the algorithm does not take, or one also given under ``algorithm``,
    is an error naming the field.
    """
    from fedforge.algorithms import algorithm_hparams  # noqa: PLC0415 (registry import cycle)

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
    return kwargs


def _field_part(part: Any) -> str:
    """A dotted-path component as written, quoted when it is not a plain name (``':'``)."""
    text = str(part)
    return text if re.fullmatch(r"[\w\-]+", text) else repr(text)


def _format(err: ValidationError) -> str:
    first = err.errors()[0]
    loc = ".".join(_field_part(p) for p in first["loc"]) or "config"
    msg = first["msg"].removeprefix("Value error, ")
    value = first.get("input")
    shown = "" if isinstance(value, dict) else f" (got {value!r})"
    return f"{loc}: {msg}{shown}"


def _parse_value(text: str) -> Any:
    """``'0.1' -> 0.1``, ``'true' -> True``, ``'[1,2]' -> [1, 2]``, anything else a string."""
    try:
        value = yaml.safe_load(text) if text.strip() else ""
    except yaml.YAMLError:
        return text
    if isinstance(value, str) and _FLOAT.fullmatch(value.strip()):
        return float(value)  # YAML 1.1 reads '1e-3' (no dot) as a string
    return value


_FLOAT = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+")


def apply_overrides(raw: dict, overrides: list[str]) -> dict:
    """Apply ``a.b.c=value`` overrides to a raw config dict (a new dict is returned)."""
    out = json.loads(json.dumps(raw))
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r}: expected key=value, e.g. client.batch_size=32")
        key, value = item.split("=", 1)
        parts = [p for p in key.strip().split(".") if p]
        if not parts:
            raise ConfigError(f"override {item!r}: empty key")
        node = out
        for i, part in enumerate(parts[:-1]):
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(f"{'.'.join(parts[: i + 1])}: is a value, not a section")
            node = child
        node[parts[-1]] = _parse_value(value)
    return out


def load_raw(path: str | Path) -> dict:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {path}: not found")
    text = path.read_text(encoding="utf-8")
    try:
        if path.suffix == ".toml":
            data = tomllib.loads(text)
        elif path.suffix in (".yaml", ".yml"):
            data = yaml.safe_load(text) or {}
        else:
            raise ConfigError(f"config file {path}: expected a .toml, .yaml or .yml file")
    except (tomllib.TOMLDecodeError, yaml.YAMLError) as exc:
        raise ConfigError(f"config file {path}: cannot parse: {exc}".splitlines()[0]) from exc
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path}: expected a table of sections at the top level")
    return data


def validate(raw: dict) -> RunConfig:
    """Validate a raw dict (schema, then the registries: dataset, model, algorithm)."""
    try:
        cfg = RunConfig.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(_format(exc)) from None
    _check_registries(cfg)
    return cfg


def load_config(path: str | Path, overrides: list[str] | None = None) -> RunConfig:
    return validate(apply_overrides(load_raw(path), overrides or []))


def _check_registries(cfg: RunConfig) -> None:
    from fedforge.algorithms import build_algorithm
    from fedforge.data import DATASETS, PARTITIONERS
    from fedforge.models import MODELS

    if cfg.data.dataset not in DATASETS:
        raise ConfigError(f"data.dataset: unknown dataset {cfg.data.dataset!r}; expected one of "
                          f"{sorted(DATASETS)}")
    if cfg.data.partition not in PARTITIONERS:
        raise ConfigError(f"data.partition: unknown partition {cfg.data.partition!r}; expected "
                          f"one of {sorted(PARTITIONERS)}")
    if cfg.model.name not in MODELS:
        raise ConfigError(f"model.name: unknown model {cfg.model.name!r}; expected one of "
                          f"{sorted(MODELS)}")
    if cfg.data.root is not None and not Path(cfg.data.root).expanduser().is_dir():
        raise ConfigError(f"data.root: directory {cfg.data.root!r} does not exist")
    for key in cfg.algorithm.hparams:  # odd keys from a hostile file: name them quoted
        if _field_part(key) != key:
            raise ConfigError(f"algorithm.{_field_part(key)}: not a hyper-parameter name")
    try:
        build_algorithm(cfg.algorithm.name, **algorithm_kwargs(cfg))
    except ConfigError:
        raise
    except (TypeError, ValueError) as exc:
        raise ConfigError(str(exc)) from None
    _check_robust(cfg)


def _check_robust(cfg: RunConfig) -> None:
    """server.aggregator / its options, and that rollback can scale the local lr."""
    from fedforge.robust.aggregators import build_aggregator  # noqa: PLC0415
    from fedforge.robust.divergence import scale_lr  # noqa: PLC0415

    try:
        build_aggregator(cfg.server.aggregator, **cfg.server.aggregator_options)
        if cfg.divergence == "rollback":
            scale_lr(cfg.algorithm.name, algorithm_kwargs(cfg), cfg.rollback_lr_factor)
    except (TypeError, ValueError) as exc:
        raise ConfigError(str(exc)) from None


def dump_config(cfg: RunConfig, path: Path) -> None:
    """Write the resolved config as TOML (``config.resolved.toml``)."""
    import tomli_w  # noqa: PLC0415 (optional writer)

    data = cfg.model_dump(exclude_none=True)
    path.write_text(tomli_w.dumps(data), encoding="utf-8")
