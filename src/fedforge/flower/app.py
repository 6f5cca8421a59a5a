"""Deployable Flower app objects for ``flwr run`` (components ``fedforge.flower.app:server``
and ``fedforge.flower.app:client``, or ``server_for(folder)`` / ``client_for(folder)`` in a
module of the app folder).

The fedforge config comes from the Flower run config: ``fedforge-config`` (path of a TOML/YAML
run config; a relative path is read from the app folder given to :func:`server_for`, which travels
with the app, else from the working directory) and ``fedforge-overrides`` (space-separated
``section.key=value``). The config's ``plugins`` are not imported from it: list them in
``fedforge-plugins`` (space-separated module names or ``.py`` paths, imported as ``--plugin``
imports them), which whoever starts the run sets, as on the command line. If
``fedforge-out`` is set, the server writes the final model there (safetensors) and one JSON
line per round beside it (``.rounds.jsonl``: train loss, test loss and accuracy, accepted /
rejected clients, bytes); the same round line goes to the ServerApp's console, which
``flwr run --stream`` shows. The server's guards are set by ``fedforge-round-timeout``,
``fedforge-query-timeout``, ``fedforge-min-replies``, ``fedforge-max-norm-ratio``,
``fedforge-max-upload-ratio``, ``fedforge-max-norm``, ``fedforge-eval-every`` (0 switches a
bound, timeout or the evaluation off) and ``fedforge-protocol`` (see
:class:`fedforge.flower.server.ServerOptions`). ``fedforge-run-dir`` names the run folder
(``metrics.jsonl``, checkpoints; relative to the SuperLink's folder), which
``fedforge-resume = true`` continues from its last checkpoint, as ``fedforge run --resume``.
A failing ServerApp logs one ERROR line before Flower marks the run failed.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from flwr.app import Context, Message
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp

from fedforge.experiment.config import RunConfig, load_config
from fedforge.experiment.rundir import RunDirError
from fedforge.flower.client import answer_evaluate, answer_query, answer_train
from fedforge.flower.common import logger
from fedforge.flower.driver import run_server
from fedforge.flower.server import ServerOptions
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
    "fedforge-eval-every": ("eval_every", int),
}
_OPTIONAL = {"round_timeout", "query_timeout", "max_norm_ratio", "max_norm", "max_upload_ratio",
             "eval_every"}


def config_from_run(run_config: dict, base: Path | None = None) -> RunConfig:
    """The fedforge RunConfig named by a Flower run config; a relative ``fedforge-config``
    is read from ``base`` (the app folder, which travels with the app) when given."""
    if "fedforge-config" not in run_config:
        raise ValueError("run config: 'fedforge-config' (path of a fedforge config) is required")
    overrides = str(run_config.get("fedforge-overrides", "")).split()
    load_plugins(str(run_config.get("fedforge-plugins", "")).split(),
                 "run config: fedforge-plugins")
    path = Path(str(run_config["fedforge-config"])).expanduser()
    if base is not None and not path.is_absolute():
        path = Path(base) / path
    if not path.is_file():
        raise ValueError(f"run config: fedforge-config: no file {str(path)!r}")
    return load_config(str(path), overrides)


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


def to_console() -> None:
    """Send the ``fedforge.flower`` log (one line per round, rejections, errors) to Flower's
    console handler: a ServerApp's output is what ``flwr run --stream`` shows."""
    from flwr.common.logger import console_handler  # noqa: PLC0415

    if console_handler not in logger.handlers:
        logger.addHandler(console_handler)
    logger.setLevel(logging.INFO)


@contextmanager
def failing_loudly() -> Iterator[None]:
    """Log why a ServerApp stops, in one ERROR line, then re-raise: Flower marks the run
    ``finished:failed`` with this message (``flwr ls``), although ``flwr run`` exits 0."""
    try:
        yield
    except Exception as exc:
        logger.error("fedforge: the run failed: %s", one_line(exc))
        raise


def one_line(exc: BaseException) -> str:
    """An exception as one line: its message's first line, or its type's name."""
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


class RoundsLog:
    """``model.rounds.jsonl`` beside ``fedforge-out``, one JSON line a round: a fresh run
    starts it empty, a resumed one keeps the lines of the rounds before its first."""

    def __init__(self, out: str, resume: bool) -> None:
        self.path = Path(out).with_suffix(".rounds.jsonl")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.resume, self.started = resume, False

    def __call__(self, t: int, params: dict, info: dict) -> None:
        if not self.started:
            old = self.path.read_text().splitlines() if self.resume and self.path.is_file() else []
            kept = [line for line in old if json.loads(line)["round"] < t]
            self.path.write_text("".join(line + "\n" for line in kept))
            self.started = True
        with self.path.open("a") as f:
            f.write(json.dumps({"round": t, **info}) + "\n")


def run_folder_from_run(run_config: dict) -> tuple[str | None, bool, bool]:
    """``fedforge-run-dir`` (the run folder, as ``fedforge run --out``; unset: none kept),
    ``fedforge-resume`` and ``fedforge-overwrite`` (as ``--resume`` / ``--overwrite``)."""
    flags = []
    for key in ("fedforge-resume", "fedforge-overwrite"):
        value = run_config.get(key, False)
        if not isinstance(value, bool):
            raise ValueError(f"run config: {key}: expected true or false, got {value!r}")
        flags.append(value)
    out = str(run_config.get("fedforge-run-dir", "")).strip() or None
    if out is None and any(flags):
        raise ValueError("run config: fedforge-resume / fedforge-overwrite need "
                         "fedforge-run-dir (the run folder)")
    return out, flags[0], flags[1]


RUN_CONFIG_WORDS = {"--resume": "fedforge-resume = true",
                    "--overwrite": "fedforge-overwrite = true", "--out": "fedforge-run-dir"}


def in_run_config_words(text: str) -> str:
    """A run folder's error, naming the run config keys instead of the command's options."""
    for option, key in RUN_CONFIG_WORDS.items():
        text = text.replace(option, key)
    return text


def serve(grid: Grid, run_config: dict, base: Path | None = None) -> None:
    """The deployable ServerApp's body: run (in ``fedforge-run-dir``, resumable), log every
    round, save the model."""
    cfg = config_from_run(run_config, base)
    options = options_from_run(run_config)
    run_dir, resume, overwrite = run_folder_from_run(run_config)
    out = str(run_config.get("fedforge-out", ""))
    log = RoundsLog(out, resume) if out else None
    try:
        params = run_server(grid, cfg, options, on_round=log, out_dir=run_dir, resume=resume,
                            overwrite=overwrite)
    except RunDirError as exc:  # its advice in the words of the Flower run config
        raise type(exc)(in_run_config_words(str(exc))) from None
    if out:
        from safetensors.torch import save_file  # noqa: PLC0415

        save_file({k: v.detach().cpu().contiguous() for k, v in params.items()}, out)


def _folder(base: str | Path | None) -> Path | None:
    return None if base is None else Path(base)


def server_for(base: str | Path | None = None) -> ServerApp:
    """The deployable ServerApp; ``base`` is the folder a relative ``fedforge-config`` is
    read from (an app module passes its own folder, which travels with the app)."""
    folder, server = _folder(base), ServerApp()

    @server.main()
    def _main(grid: Grid, context: Context) -> None:
        to_console()
        with failing_loudly():
            serve(grid, context.run_config, folder)

    return server


def client_for(base: str | Path | None = None) -> ClientApp:
    """The deployable ClientApp; ``base`` as in :func:`server_for`."""
    folder, client = _folder(base), ClientApp()

    @client.query()
    def _query(msg: Message, context: Context) -> Message:
        return answer_query(config_from_run(context.run_config, folder), msg, context)

    @client.train()
    def _train(msg: Message, context: Context) -> Message:
        return answer_train(config_from_run(context.run_config, folder), msg, context)

    @client.evaluate()
    def _evaluate(msg: Message, context: Context) -> Message:
        return answer_evaluate(config_from_run(context.run_config, folder), msg, context)

    return client


# one name per assignment: `flwr run` finds components by reading this file's assignments
server = server_for()
client = client_for()
