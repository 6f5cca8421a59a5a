"""Typed checks of the free-form option tables (``data.options``, ``model.options``,
``data.partition_options``).

Those tables reach a dataset loader, model class or partitioner as ``**kwargs``. Their types
come from that function's signature, so a wrong option is a config error naming it
(``data.options.num_clients: Input should be a valid integer (got 'abc')``) before any data
is loaded, not a traceback mid-run. Types only: ranges are checked by the builder itself.
"""

from __future__ import annotations

import inspect
import json
import typing
from collections.abc import Callable, Mapping
from functools import cache
from typing import Any

from pydantic import BaseModel, ConfigDict, TypeAdapter, ValidationError, create_model

from fedforge.errors import ConfigError, format_error

_CONFIG = ConfigDict(extra="forbid", allow_inf_nan=False, arbitrary_types_allowed=True)


def check_options(where: str, fn: Callable, options: Mapping[str, Any],
                  fixed: Mapping[str, str], what: str, required: bool = True) -> None:
    """Validate ``options`` for ``fn(**options)``: known names, the annotated types (strict:
    no ``true`` for an int, no ``"1"`` for a number), finite floats.

    ``fixed`` maps the parameters the framework passes itself to why (e.g. ``num_classes``:
    ``"set from the dataset"``); ``required=False`` lets options without a default be absent
    (their default comes from elsewhere). ``what`` names the builder in messages.
    """
    for key in options:
        if key in fixed:
            raise ConfigError(f"{where}.{key}: not an option of {what} ({fixed[key]})")
    schema = _schema(fn, tuple(sorted(fixed)), required)
    try:
        text = json.dumps(dict(options))
    except (TypeError, ValueError, RecursionError) as exc:  # not plain data (Python callers)
        raise ConfigError(f"{where}: expected plain data ({exc})") from None
    try:
        schema.model_validate_json(text, strict=True)
    except ValidationError as exc:
        raise ConfigError(_message(exc, options, where, what, schema)) from None


def _message(exc: ValidationError, options: Mapping[str, Any], where: str, what: str,
             schema: type[BaseModel]) -> str:
    unknown = [e for e in exc.errors() if e["type"] == "extra_forbidden"]
    if unknown:  # a misspelt name first, whatever order pydantic lists its errors in
        accepted = sorted(schema.model_fields) or "none"
        return f"{where}.{unknown[0]['loc'][0]}: unknown option of {what}; accepted: {accepted}"
    return format_error(exc, dict(options), where)


@cache
def _schema(fn: Callable, fixed: tuple[str, ...], required: bool) -> type[BaseModel]:
    target = fn.__init__ if inspect.isclass(fn) else fn
    try:
        hints = typing.get_type_hints(target)
    except Exception:  # noqa: BLE001 (unresolvable annotations: check the names only)
        hints = {}
    fields: dict[str, Any] = {}
    for name, p in inspect.signature(fn).parameters.items():
        if name in fixed or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        ann = _usable(hints.get(name, Any))
        default = p.default if p.default is not p.empty else (... if required else None)
        fields[name] = (ann, default)
    return create_model(f"{getattr(fn, '__name__', 'builder')}_options", __config__=_CONFIG,
                        **fields)


def _usable(ann: Any) -> Any:
    """``ann`` if pydantic can validate it from JSON, else ``Any`` (no type check)."""
    try:
        TypeAdapter(ann, config=_CONFIG).validate_json("null", strict=True)
    except ValidationError:
        return ann
    except Exception:  # noqa: BLE001 (e.g. a tensor or generator type)
        return Any
    return ann


def partition_option_names(partition: str) -> set[str] | None:
    """The ``data.partition_options`` keys ``partition`` takes (None: not a registered
    partitioner, whose options the config check names)."""
    from fedforge.data.partition import _ALIASES, PARTITIONERS, dirichlet_fixed_size  # noqa: PLC0415

    name = _ALIASES.get(partition, partition)
    if name == "natural":
        return set()
    fn = dirichlet_fixed_size if name == "dirichlet_fixed" else PARTITIONERS.get(name)
    if fn is None:
        return None
    given = {"num_clients", "rng", "labels", "num_samples", "groups"}
    return set(inspect.signature(fn).parameters) - given


def check_builders(where: str, dataset: str, model: str, partition: str,
                   data_options: Mapping, model_options: Mapping,
                   partition_options: Mapping) -> None:
    """The option tables of one run (or one task, ``where = "tasks[2]."``)."""
    from fedforge.data import loaders  # noqa: PLC0415
    from fedforge.data.partition import _ALIASES, PARTITIONERS  # noqa: PLC0415
    from fedforge.models import MODELS  # noqa: PLC0415

    key = loaders._canonical(dataset)  # noqa: SLF001 (the registry's own name resolution)
    loader = loaders.make_synthetic if key == "synthetic" else loaders._LOADERS[key]  # noqa: SLF001
    from fedforge.data.subsets import pop_subset_options, select_train  # noqa: PLC0415

    own, subset = pop_subset_options(dict(data_options))  # subsets: every dataset
    check_options(f"{where}data.options", loader, own,
                  {"root": "set by data.root"}, f"dataset {dataset!r}")
    check_options(f"{where}data.options", select_train, subset,
                  {"splits": "the loaded dataset"}, f"dataset {dataset!r}")
    cls = MODELS[model][0]
    first_two = list(inspect.signature(cls).parameters)[:2]  # input_shape, num_classes
    check_options(f"{where}model.options", cls, model_options,
                  dict.fromkeys(first_two, "set from the dataset"), f"model {model!r}")
    fixed = {"num_clients": "set by data.num_clients", "rng": "set from seed",
             "labels": "set from the dataset", "num_samples": "set from the dataset",
             "groups": "set from the dataset"}
    name = _ALIASES.get(partition, partition)
    if name == "natural":
        if partition_options:
            raise ConfigError(f"{where}data.partition_options: partition 'natural' takes no "
                              f"options, got {sorted(partition_options)}")
    elif name in PARTITIONERS:
        check_options(f"{where}data.partition_options", PARTITIONERS[name], partition_options,
                      fixed, f"partition {partition!r}")
    elif name == "dirichlet_fixed":  # multi-task runs; alpha and size default in the runner
        from fedforge.data.partition import dirichlet_fixed_size  # noqa: PLC0415

        check_options(f"{where}data.partition_options", dirichlet_fixed_size,
                      partition_options, fixed, f"partition {partition!r}", required=False)
