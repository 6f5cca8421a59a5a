"""The config reference, generated from the schema of both kinds of run
(:class:`~fedforge.experiment.config.SingleTaskConfig`,
:class:`~fedforge.experiment.config.MultiTaskConfig`).

Each key's type and default come from the pydantic field; its description is the comment
written beside (or just above) the field in ``config.py``, so the reference cannot drift from
the code: ``fedforge config --defaults`` prints it as a commented TOML file, and
``docs/config.md`` is ``fedforge config --markdown`` (``tests/test_config_reference.py``
fails when the committed page differs).
"""

from __future__ import annotations

import inspect
import io
import re
import tokenize
import types
import typing
from functools import cache
from typing import Any, NamedTuple

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from fedforge.experiment import config as schema


class Key(NamedTuple):
    path: str  # dotted, e.g. "client.local_steps"
    type: str
    default: Any  # the value, or MISSING (required / computed)
    description: str


MISSING = object()
_INTERNAL = re.compile(r",?\s*\(?\bissue \d+\)?")  # code comments may cite tracker items


def _annotation(ann: Any) -> str:
    """A type as a config author reads it: ``int``, ``"a" | "b"``, ``number or table``."""
    origin = typing.get_origin(ann)
    if origin is typing.Literal:
        return " \\| ".join(_literal(v) for v in typing.get_args(ann))
    if origin in (typing.Union, types.UnionType):
        parts = [_annotation(a) for a in typing.get_args(ann) if a is not type(None)]
        nullable = type(None) in typing.get_args(ann)
        return " \\| ".join(parts) + (" \\| null" if nullable else "")
    if origin is tuple:
        return "[" + ", ".join(_annotation(a) for a in typing.get_args(ann)
                               if a is not Ellipsis) + "]"
    if origin is list:
        return "list of " + ", ".join(_annotation(a) for a in typing.get_args(ann))
    if origin is dict or ann is dict:
        return "table"
    if ann is Any:
        return "any"
    if isinstance(ann, type) and issubclass(ann, BaseModel):
        return "table"
    return {int: "int", float: "float", str: "string", bool: "bool"}.get(ann, str(ann))


def _literal(value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    return f'"{value}"' if isinstance(value, str) else str(value)


def _default(field: Any) -> Any:
    if field.default is not PydanticUndefined:
        return field.default
    if field.default_factory is not None:
        return field.default_factory()
    return MISSING


def show(value: Any) -> str:
    """A default as a config spells it (``null`` for unset)."""
    if value is MISSING:
        return "required"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(show(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} = {show(v)}" for k, v in value.items()) + "}"
    return repr(value)


def _notes(cls: type) -> dict[str, str]:
    """The comments of ``cls``'s fields, inherited ones (a shared section of both kinds of
    run) included."""
    out: dict[str, str] = {}
    for c in reversed(cls.__mro__):
        if isinstance(c, type) and issubclass(c, BaseModel) and c is not BaseModel:
            out.update(_comments(c))
    return out


@cache
def _comments(cls: type) -> dict[str, str]:
    """Field name -> the comment lines right above it plus the comment on its own line."""
    try:
        source = inspect.getsource(cls)
    except (OSError, TypeError):
        return {}
    out: dict[str, str] = {}
    pending: list[str] = []
    for line in source.splitlines():
        stripped = line.strip()
        if stripped.startswith("#"):
            text = stripped.lstrip("#").strip()
            if not text.startswith("---"):  # a section rule, not a field's comment
                pending.append(text)
            continue
        field = _FIELD.match(line)
        if field:
            out[field.group(1)] = " ".join([*pending, _trailing(line)]).strip()
        pending = []
    return out


_FIELD = re.compile(r"^    (\w+)\s*:[^=]*=")


def _trailing(line: str) -> str:
    """The ``# comment`` ending a line of code (not a ``#`` inside a string)."""
    try:
        toks = list(tokenize.generate_tokens(io.StringIO(line.strip() + "\n").readline))
    except (tokenize.TokenError, SyntaxError):
        return ""
    return next((t.string.lstrip("#").strip() for t in toks if t.type == tokenize.COMMENT), "")


def _doc(cls: type) -> str:
    doc = inspect.getdoc(cls) or ""
    return " ".join(doc.split("\n\n")[0].split()) if cls.__doc__ else ""


def _clean(text: str) -> str:
    text = _INTERNAL.sub("", text).replace("``", "`").replace("None:", "null:")
    return text.replace("|", "\\|").strip()


def top_fields() -> dict[str, tuple[FieldInfo, type[BaseModel]]]:
    """Every top-level field of either kind of run -> (field, the kind's model): the
    single-task run's keys in the order its config.resolved.toml writes them, then the keys
    only a multi-task run reads."""
    single, multi = schema.SingleTaskConfig, schema.MultiTaskConfig
    order = {k: i for i, k in enumerate(single.key_order)}
    names = sorted(single.model_fields, key=lambda n: order.get(n, len(order)))
    out = {n: (single.model_fields[n], single) for n in names}
    out.update({n: (f, multi) for n, f in multi.model_fields.items() if n not in out})
    return out


def keys(model: type[BaseModel] | None = None, prefix: str = "") -> list[Key]:
    """Every leaf key of ``model`` (sections recursed), in declaration order; ``None``: the
    top level of both kinds of run (:func:`top_fields`)."""
    out: list[Key] = []
    fields = (top_fields() if model is None
              else {n: (f, model) for n, f in model.model_fields.items()})
    for name, (field, owner) in fields.items():
        notes = _notes(owner)
        key = field.alias or name
        ann = field.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            out.extend(keys(ann, f"{prefix}{key}."))
            continue
        if typing.get_origin(ann) is list and any(
                isinstance(a, type) and issubclass(a, BaseModel) for a in typing.get_args(ann)):
            text = notes.get(name) or NOTES.get(f"{prefix}{key}", "")
            out.append(Key(f"{prefix}{key}", "list of tables", [], _clean(text)))
            continue
        path = f"{prefix}{key}"
        text = (notes.get(name) or NOTES.get(path)
                or NOTES.get(path.removeprefix("tasks[]."), ""))
        out.append(Key(path, _annotation(ann), _default(field), _clean(text)))
    return out


def sections() -> list[tuple[str, type[BaseModel] | None, str]]:
    """(name, schema, one-line description) of the top level and each section."""
    out: list[tuple[str, Any, str]] = [("", None, "")]
    for name, (field, _) in top_fields().items():
        ann = field.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            out.append((field.alias or name, ann, _clean(_doc(ann))))
    return out


# one description per field of ClientTiming, shown under [sim] and [system]
CLIENT_TIMING: dict[str, str] = {
    "speed_classes": "(fraction of clients, speed factor) pairs",
    "speed_seed": "seed of the clients' speed classes",
    "delay": "delay law of a client's job",
    "delay_shift": "shift of the shifted-exponential delay",
    "delay_trace": "`trace` delay: the file of measured delays",
    "trace_scale_by_speed": "`trace` delay: scale by the client's speed class",
}

NOTES: dict[str, str] = {
    "name": "the run's name (shown in logs and comparison tables)",
    "seed": "seeds the model, the partition and every round's sampling (`(seed, round)`)",
    "rounds": "server rounds to run",
    "data.dataset": "a dataset from `fedforge datasets` (or a plugin's)",
    "data.partition": "how the training set is split over clients: `natural` (the dataset's "
                      "own clients), `iid`, `dirichlet`, `dirichlet_class`, `dirichlet_equal`, "
                      "`shards`, `quantity_skew`, flwr-datasets' `flwr:iid`, `flwr:dirichlet`, "
                      "`flwr:pathological`, `flwr:natural_id` (docs/huggingface.md), or a "
                      "plugin's",
    "data.root": "folder holding the dataset folders; `--data-root` wins over it and it wins "
                 "over `$FEDFORGE_DATA` (default: `./data` in the folder fedforge runs from)",
    "plugins": "your modules (names or `.py` paths) the run needs; never imported from the "
               "config: give each with `--plugin` (or pass `--allow-config-plugins`)",
    "method": "a multi-task run's driver (default `fedast`; `fedforge algorithms` lists them)",
    "data.num_clients": "clients to split into (natural splits: the first n; null: all)",
    "data.options": "options of the dataset's loader, e.g. `{max_samples_per_client = 500}`",
    "data.partition_options": "options of the partition, e.g. `{alpha = 0.5}` for `dirichlet`",
    "eval.finetune_steps": "personalised evaluation: local steps each held-out client takes "
                           "from the global model before it is evaluated",
    "model.name": "a model from `fedforge models` (or a plugin's)",
    "model.options": "options of the model class, e.g. `{hidden = [200, 200]}`",
    "algorithm.name": "an algorithm from `fedforge algorithms` (or a plugin's); its "
                      "hyper-parameters are further keys of `[algorithm]`",
    "client.batch_size": "local mini-batch size",
    "client.local_steps": "local steps per round (set this or `local_epochs`)",
    "client.local_epochs": "local epochs per round (default 1 when `local_steps` is unset)",
    "client.weight_decay": "shorthand for the algorithm's `weight_decay` (number or schedule)",
    "client.max_grad_norm": "shorthand for the algorithm's `max_grad_norm` (clip threshold)",
    "server.clients_per_round": "clients sampled each round (S)",
    "server.aggregator_options": "options of the robust aggregator (`beta`, `max_norm`, `f`, "
                                 "`m`)",
    "server.sampler_options": "options of the client sampler (`fedforge algorithms --params "
                              "oort`)",
    "eval.batch_size": "evaluation batch size (speed only)",
    "engine.name": "`vmap` (cohort chunks as one batched computation), `loop` (one client at "
                   "a time, the reference) or `distributed` (under torchrun)",
    "engine.chunk_size": "clients per vmapped chunk; `auto` sizes it from free memory",
    "engine.store_cache_mb": "`disk` client store: MiB of its live files kept open at a time",
    "checkpoint.keep": "checkpoints kept on disk",
    "attack.kind": "simulated Byzantine clients' behaviour",
    "attack.fraction": "fraction of clients that attack",
    "attack.scale": "`scale` attack: multiplies the delta",
    "attack.noise_std": "`random` attack: standard deviation of the noise",
    "sim.step_time_s": "simulated seconds per local step (null: from the model's FLOPs)",
    "sim.device": "device preset of the simulated clients' throughput",
    "sim.device_flops": "overrides the preset's FLOP/s",
    "sim.bandwidth_up_mbps": "simulated uplink Mbit/s",
    "sim.bandwidth_down_mbps": "simulated downlink Mbit/s",
    "sim.latency_s": "simulated latency per message",
    **{f"sim.{k}": v for k, v in CLIENT_TIMING.items()},
    "rollback_lr_factor": "`rollback`: the local lr is multiplied by this after each rollback",
    "max_rollbacks": "`rollback`: rollbacks before the run stops",
    "tasks": "multi-task runs: one table per task (below)",
    "system.num_clients": "multi-task: size of the shared client pool",
    "system.available_fraction": "fraction of the pool available at a time",
    **{f"system.{k}": v for k, v in CLIENT_TIMING.items()},
    "async.rb_ratio": "R / b: the buffer size from the requests",
    "async.buffer_size": "the buffer size b (null: from `rb_ratio`)",
    "async.variance_window": "updates in FedAST's variance estimate",
    "async.c_period_factor": "FedAST's re-allocation period factor",
    "async.min_requests": "least requests a task keeps",
    "async.fedasync_alpha": "FedAsync's mixing α",
    "async.fedasync_a": "FedAsync's staleness exponent a, weight (1 + s)^-a",
    "sync.k": "Sync-ST: the first k arrivals per round are kept",
    "sync.clients_per_round": "Sync-ST: clients per round (null: the availability cap)",
    "sync.ucb_c": "Sync-UCB-ST exploration weight",
    "tasks[].name": "the task's name in logs and summaries (default: dataset-model)",
}
"""Descriptions of keys whose definition in ``config.py`` carries no comment (a comment there
wins, so a changed field is described where it is changed)."""


# --- `fedforge config --defaults` ----------------------------------------------------------
def defaults_toml(algorithm: str | None = None) -> str:
    """The whole schema as a commented TOML file of defaults; with ``algorithm``, its
    resolved hyper-parameters and where each default comes from. Keys only a multi-task run
    reads are commented out, so the output is itself a valid single-task config."""
    multitask = {f.alias or n for n, (f, kind) in top_fields().items() if kind.multitask}
    unread = schema.SingleTaskConfig.unread  # shared sections' multi-task keys
    lines = ["# fedforge run config: every key with its default (docs/config.md explains them)",
             "# null defaults are commented out (TOML has no null: leave the key unset)", ""]
    later: list[str] = []
    for name, model, doc in sections():
        if name == "":
            for key in keys(model):
                if "." in key.path:
                    continue
                line = _toml_line(key)
                (later if key.path in multitask else lines).append(line)
            continue
        block = [""]
        if name == "algorithm" and algorithm is not None:
            block += algorithm_toml(algorithm)
        else:
            block.append(f"[{name}]" + (f"  # {doc}" if doc else ""))
            block += [_commented(_toml_line(key)) if key.path in unread else _toml_line(key)
                      for key in keys(model, f"{name}.")]
        if name in multitask:
            later += block
        else:
            lines += block
    lines += ["", "# --- multi-task runs only (a [[tasks]] list; docs/config.md) ---"]
    lines += [_commented(line) for line in later]
    return "\n".join(lines) + "\n"


def _commented(line: str) -> str:
    return line if line.startswith("#") or not line else "# " + line


def _toml_line(key: Key) -> str:
    name = key.path.split(".")[-1]
    comment = f"  # {key.type}" + (f"; {key.description}" if key.description else "")
    comment = comment.replace("\\|", "|")
    if key.default is None or key.default is MISSING:
        return f"# {name} = null{comment}"
    return f"{name} = {show(key.default)}{comment}"


def algorithm_rows(name: str) -> list[tuple[str, str, str, str]]:
    """``(hyper-parameter, default, source, where / why)``; an algorithm without an entry in
    ``fedforge.algorithms.defaults`` (a plugin's) gives its factory's defaults."""
    from fedforge.algorithms import algorithm_hparams
    from fedforge.algorithms.defaults import show
    from fedforge.algorithms.methods import parameter_rows

    try:
        return parameter_rows(name)
    except KeyError:
        return [(k, show(v), "factory", "the factory's keyword default (no source "
                 "recorded)") for k, v in algorithm_hparams(name).items()]


def algorithm_toml(name: str) -> list[str]:
    from fedforge.algorithms import canonical_name

    lines = [f"[algorithm]  # {name}'s hyper-parameters: default, then its source",
             f'name = "{canonical_name(name)}"']
    for key, value, source, ref in algorithm_rows(name):
        line = f"{key} = {value}" if value != "none" else f"# {key} = null"
        lines.append(f"{line}  # {source}: {ref}")
    return lines


# --- docs/config.md ------------------------------------------------------------------------
def markdown() -> str:
    """``docs/config.md``: the guide to the config syntax, then every section's keys."""
    lines = [_INTRO.strip(), ""]
    for name, model, doc in sections():
        title = f"`[{name}]`" if name else "Top level"
        lines += ["", f"### {title}", ""]
        if doc:
            lines += [doc, ""]
        if not name:
            lines += [_kinds(), ""]
        lines += ["| key | type | default | meaning |", "|---|---|---|---|"]
        for key in keys(model, f"{name}." if name else ""):
            if not name and "." in key.path:
                continue
            shown = show(key.default).replace("|", "\\|")
            lines.append(f"| `{key.path}` | {key.type} | `{shown}` | {key.description} |")
    lines += ["", _TASK_HEADER.strip(), "", "| key | type | default | meaning |",
              "|---|---|---|---|"]
    for key in task_keys():
        shown = show(key.default).replace("|", "\\|")
        lines.append(f"| `{key.path}` | {key.type} | `{shown}` | {key.description} |")
    return "\n".join(lines) + "\n"


def task_keys(method: str = "fedast") -> list[Key]:
    """A task's keys as a multi-task run of ``method`` reads them: the client keys with the
    method's defaults, without the keys a multi-task run does not read."""
    filled = {f"tasks[].client.{k}": v for k, v in schema.task_client_defaults(method).items()}
    return [key._replace(default=filled.get(key.path, key.default))
            for key in keys(schema.TaskConfig, "tasks[].")
            if key.path not in schema.MultiTaskConfig.unread]


def _kinds() -> str:
    """Which top-level keys each kind of run reads, from the two schemas."""
    def listed(kind: type[BaseModel], exclude: set[str] = frozenset()) -> str:
        return ", ".join(f"`{f.alias or n}`" for n, (f, k) in top_fields().items()
                         if k is kind and n not in exclude)

    shared = set(schema.BaseRunConfig.model_fields)
    return (f"Every run reads {', '.join(f'`{n}`' for n in schema.BaseRunConfig.model_fields)}"
            f". Only a single-task run: {listed(schema.SingleTaskConfig, shared)}. Only a "
            f"multi-task run: {listed(schema.MultiTaskConfig)}.")


_INTRO = """
# Config reference

<!-- generated by `fedforge config --markdown > docs/config.md` from the schema in
     src/fedforge/experiment/config.py; tests/test_config_reference.py fails when this page
     is stale. Do not edit by hand. -->

A run is one TOML (or YAML) file of sections. Every key below has a default, so a config
only names what it changes; `fedforge config --defaults` prints all of them as a commented
TOML file, and `fedforge config --defaults ALGORITHM` adds that algorithm's
hyper-parameters with the paper, code or reason each default comes from. Unknown keys,
wrong types and out-of-range values are refused in one line naming the key.

**Two kinds of run.** A config without a `tasks` list is a *single-task* run: one model
trained in synchronous rounds (`rounds`, `[data]`, `[model]`, `[algorithm]`, `[client]`,
`[server]`, ...). A config with a `[[tasks]]` list is a *multi-task* run: several tasks, each
with its own data, model, algorithm and client, trained by one `method` on a shared client
pool (`[system]`, `[async]`, `[sync]`). Both read the shared keys (`name`, `seed`, `[eval]`,
`[engine]`, `[checkpoint]`, `plugins`); a key of the other kind is refused in one line
naming it, so no setting is silently ignored. The `client` keys a task leaves unset take
the method's defaults (shown under `[[tasks]]` below).

## Syntax

**Dotted overrides.** Any key can be set on the command line after the config file as
`section.key=value`, e.g. `fedforge run examples/quickstart.toml client.local_steps=20
algorithm.local_lr=0.05`. Values are read as YAML flow values: `0.1`, `1e-3`, `true`,
`[1, 2]`, `{schedule: exponential, init: 0.01, gamma: 0.998}`; for a string key the text is
kept as typed (`name=2024` is the name `"2024"`). Overrides apply in order, after the file.

**`null`.** `key=null` (or `~`) on the command line, or `key: null` in YAML, unsets a key:
it takes its default behaviour, e.g. `client.local_steps=10 client.local_epochs=null` switches
from epochs to steps, and `server.aggregation=null` returns to the algorithm's own weighting.
TOML has no null: leave the key out instead.

**Schedules.** Wherever a learning rate, weight decay, server lr, Adam ε/τ, FedExP ε or clip
threshold is accepted, a number is a constant and a table is a schedule of the 1-based round
`t`; `schedule` (or `kind`) names it:

| value | at round t |
|---|---|
| `0.01` or `{schedule = "constant", value = 0.01}` | 0.01 |
| `{schedule = "exponential", init = 0.01, gamma = 0.998}` | `init · gamma^t` |
| `{schedule = "cosine", init = 0.1, rounds = 500, final = 0.0}` | `final + (init − final)(1 + cos(π min(t, T)/T))/2` |
| `{schedule = "step", init = 0.1, factor = 0.1, every = 100}` | `init · factor^⌊t/every⌋` |
| `{schedule = "step", init = 0.1, factor = 0.1, milestones = [100, 300]}` | `init · factor^(#milestones ≤ t)` |
| `{schedule = "warmup", init = 0.1, rounds = 10, then = {...}}` | `init · t/rounds` for `t < rounds`, then `then` (default: constant `init`) |

On the command line: `algorithm.local_lr={schedule: exponential, init: 0.01, gamma: 0.998}`.
A resumed run continues a schedule exactly, because its position is the round.

**`[compare.X]` tables.** A config may carry per-algorithm settings that apply only when that
algorithm runs: `[compare.fedadam.algorithm]` with `server_lr = 0.01` is merged over the file
when `fedforge compare -a fedavg,fedadam` runs FedAdam. `fedforge run CONFIG --variant fedadam`
runs exactly that one (the table merged, `algorithm.name = "fedadam"`, then the command-line
overrides); without `--variant`, `fedforge run` does not read the tables. A table that sets
`algorithm.name` itself is a *named variant*: `[compare.fedavg_lo.algorithm]` with
`name = "fedavg"` and `local_lr = 0.01` beside `[compare.fedavg_hi.algorithm]` with
`local_lr = 0.5` lets `fedforge compare -a fedavg_lo,fedavg_hi` compare one algorithm at two
settings, each in its own folder and table row.

**`[algorithm]`.** `name` plus that algorithm's hyper-parameters as further keys; each
algorithm's keys, defaults and their sources are in [the algorithms page](algorithms.md)
and in `fedforge config --defaults NAME`. `client.lr`, `client.weight_decay`,
`client.max_grad_norm` and `client.nar` are shorthands passed to algorithms that take
`local_lr`, `weight_decay`, `max_grad_norm` and `nar`.

**Plugins and data.** A plugin is code, so it comes from the command line: `--plugin
my_module` imports your module before the config is checked, so the algorithms, datasets,
models and partitions it registers can be named in it (see [Extending
fedforge](extending.md)). `plugins = ["my_module"]` in a config only names the modules a run
needs; a config never imports them. A config whose `plugins` were not given with `--plugin`
stops with a one-line error, unless you pass `--allow-config-plugins` (`run`, `compare`,
`pretrain`) to import the config's list as `--plugin` would. Datasets are read
from `--data-root`, else `data.root`, else `$FEDFORGE_DATA`, else `./data` in the folder
fedforge runs from.

## Keys
"""  # noqa: E501 (markdown table rows)

_TASK_HEADER = """
### `[[tasks]]` (multi-task runs)

A config with a `[[tasks]]` list is a multi-task run of `method` on one client pool
(`[system]`, `[async]`, `[sync]`, `max_time`, `max_updates`; see [FedAST](fedast.md)).
Each task has its own `data`, `model` and `algorithm` tables, with the keys above, and:
"""
