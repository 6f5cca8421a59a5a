"""Deployable Flower app objects for ``flwr run`` (components ``fedforge.flower.app:server``
and ``fedforge.flower.app:client``).

The fedforge config comes from the Flower run config: ``fedforge-config`` (path of a TOML/YAML
run config readable on every machine) and ``fedforge-overrides`` (space-separated
``section.key=value``). The config's ``plugins`` are not imported from it: list them in
``fedforge-plugins`` (space-separated module names or ``.py`` paths, imported as ``--plugin``
imports them), which whoever starts the run sets, as on the command line. If
``fedforge-out`` is set, the server writes the final model there
(safetensors) and one JSON line per round (accepted / rejected clients) beside it. The
server's guards are set by ``fedforge-round-timeout``, ``fedforge-query-timeout``,
``fedforge-min-replies``, ``fedforge-max-norm-ratio``, ``fedforge-max-upload-ratio``,
``fedforge-max-norm`` (0 switches a bound or timeout off) and ``fedforge-protocol`` (see
:class:`fedforge.flower.server.ServerOptions`).
"""

from __future__ import annotations

import json
from pathlib import Path

from flwr.app import Context, Message
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp

from fedforge.experiment.config import RunConfig, load_config
from fedforge.flower.client import answer_evaluate, answer_query, answer_train
from fedforge.flower.server import ServerOptions, run_server
from fedforge.plugins import load_plugins

# Flower run config key -> (ServerOptions field, type); 0 means "off" for the optional ones
OPTION_KEYS = {
    "fedforge-round-timeout": ("round_timeout", float),
    "fedforge-query-timeout": ("query_timeout", float),
    "fedforge-min-replies": ("min_replies", int),
    "fedforge-max-norm-ratio": ("max_norm_ratio", float),
    "fedforge-max-norm": ("max_norm", float),
    "fedforge-max-upload-ratio": ("max_upload_ratio", float),
    "fedforge-protocol": ("protocol", str),
}
_OPTIONAL = {"round_timeout", "query_timeout", "max_norm_ratio", "max_norm", "max_upload_ratio"}


def config_from_run(run_config: dict) -> RunConfig:
    """The fedforge RunConfig named by a Flower run config."""
    if "fedforge-config" not in run_config:
        raise ValueError("run config: 'fedforge-config' (path of a fedforge config) is required")
    overrides = str(run_config.get("fedforge-overrides", "")).split()
    load_plugins(str(run_config.get("fedforge-plugins", "")).split(),
                 "run config: fedforge-plugins")
    return load_config(str(run_config["fedforge-config"]), overrides)


def options_from_run(run_config: dict) -> ServerOptions:
    """The server's guards from the Flower run config's ``fedforge-*`` keys (defaults:
    :class:`ServerOptions`)."""
    kwargs = {}
    for key, (name, kind) in OPTION_KEYS.items():
        if key not in run_config:
            continue
        raw = run_config[key]
        try:
            value = kind(raw)
        except (TypeError, ValueError):
            raise ValueError(f"run config: {key}: expected {kind.__name__}, got {raw!r}") from None
        kwargs[name] = None if name in _OPTIONAL and value == 0 else value
    try:
        return ServerOptions(**kwargs)
    except ValueError as exc:  # "field: why" -> "run config: fedforge-key: why"
        name, _, why = str(exc).partition(": ")
        key = next(k for k, (field, _) in OPTION_KEYS.items() if field == name)
        raise ValueError(f"run config: {key}: {why}") from None


server = ServerApp()
client = ClientApp()


@server.main()
def _main(grid: Grid, context: Context) -> None:
    cfg = config_from_run(context.run_config)
    options = options_from_run(context.run_config)
    out = str(context.run_config.get("fedforge-out", ""))
    log = Path(out).with_suffix(".rounds.jsonl") if out else None

    def on_round(t: int, params: dict, info: dict) -> None:
        if log is not None:
            with log.open("a") as f:
                f.write(json.dumps({"round": t, **info}) + "\n")

    params = run_server(grid, cfg, options, on_round=on_round)
    if out:
        from safetensors.torch import save_file

        save_file({k: v.detach().cpu().contiguous() for k, v in params.items()}, out)


@client.query()
def _query(msg: Message, context: Context) -> Message:
    return answer_query(config_from_run(context.run_config), msg, context)


@client.train()
def _train(msg: Message, context: Context) -> Message:
    return answer_train(config_from_run(context.run_config), msg, context)


@client.evaluate()
def _evaluate(msg: Message, context: Context) -> Message:
    return answer_evaluate(config_from_run(context.run_config), msg, context)
