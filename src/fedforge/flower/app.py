"""Deployable Flower app objects for ``flwr run`` (components ``fedforge.flower.app:server``
and ``fedforge.flower.app:client``).

The fedforge config comes from the Flower run config: ``fedforge-config`` (path of a TOML/YAML
run config readable on every machine) and ``fedforge-overrides`` (space-separated
``section.key=value``). If ``fedforge-out`` is set, the server writes the final model there
(safetensors) and one JSON line per round (accepted / rejected clients) beside it.
"""

from __future__ import annotations

import json
from pathlib import Path

from flwr.app import Context, Message
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp

from fedforge.experiment.config import RunConfig, load_config
from fedforge.flower.bridge import answer_query, answer_train, run_server


def config_from_run(run_config: dict) -> RunConfig:
    """The fedforge RunConfig named by a Flower run config."""
    if "fedforge-config" not in run_config:
        raise ValueError("run config: 'fedforge-config' (path of a fedforge config) is required")
    overrides = str(run_config.get("fedforge-overrides", "")).split()
    return load_config(str(run_config["fedforge-config"]), overrides)


server = ServerApp()
client = ClientApp()


@server.main()
def _main(grid: Grid, context: Context) -> None:
    cfg = config_from_run(context.run_config)
    out = str(context.run_config.get("fedforge-out", ""))
    log = Path(out).with_suffix(".rounds.jsonl") if out else None

    def on_round(t: int, params: dict, info: dict) -> None:
        if log is not None:
            with log.open("a") as f:
                f.write(json.dumps({"round": t, **info}) + "\n")

    params = run_server(grid, cfg, on_round=on_round)
    if out:
        from safetensors.torch import save_file

        save_file({k: v.detach().cpu().contiguous() for k, v in params.items()}, out)


@client.query()
def _query(msg: Message, context: Context) -> Message:
    return answer_query(config_from_run(context.run_config), msg, context)


@client.train()
def _train(msg: Message, context: Context) -> Message:
    return answer_train(config_from_run(context.run_config), msg, context)
