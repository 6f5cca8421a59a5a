"""The options several commands take, and what they do before a command runs: ``--plugin``
and ``--allow-config-plugins`` import user code, ``--data-root`` and ``--mlflow-uri`` set
where data is read and runs are logged (in the environment, so that the runs of worker
processes read them too), ``--out`` and the other folders refuse an empty value, and
``--bands`` / ``--legend`` style every figure a command draws."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Annotated

import typer

from fedforge.commands.output import fail, failing

Overrides = Annotated[list[str] | None, typer.Argument(help="dotted key=value overrides")]
Plugins = Annotated[list[str] | None, typer.Option(
    "--plugin", help="user module (name or .py path) whose register_* calls run first; "
                     "repeatable")]
AllowConfigPlugins = Annotated[bool, typer.Option(
    "--allow-config-plugins", help="import the modules the config's plugins list names (a "
                                   "plugin is code; without this a config cannot run any)")]
DataRootOption = Annotated[Path | None, typer.Option(
    "--data-root", help="folder holding the dataset folders (wins over data.root and "
                        "$FEDFORGE_DATA)")]
MlflowUri = Annotated[str | None, typer.Option(
    "--mlflow-uri", envvar="FEDFORGE_MLFLOW_URI", metavar="URI",
    help="MLflow tracking URI for logging.mlflow (a server, or a file inside the run "
         "folder; default SQLite in RUN/mlruns/)")]
Bands = Annotated[str | None, typer.Option(
    "--bands", metavar="alpha|off|panels",
    help="95 % interval over seeds: shaded (alpha, default), off, or one panel per method")]
Legend = Annotated[str | None, typer.Option(
    "--legend", metavar="best|outside|off",
    help="best (default): inside where it hides no line or band, else outside the axes")]


def nonempty(option: str) -> Callable[[str | Path | None], Path | None]:
    """A parser for a path option (``--out``, ``--runs``) that refuses an empty value: it
    would silently mean the current folder."""
    def parse(value: str | Path | None) -> Path | None:
        from fedforge.experiment.rundir import folder_option

        with failing(ValueError):
            return None if value is None else folder_option(option, value)

    return parse


out_path = nonempty("--out")


def setup(plugins: list[str] | None, data_root: Path | None = None,
          mlflow_uri: str | None = None, config: Path | None = None,
          allow_config_plugins: bool = False) -> None:
    """Set --mlflow-uri, import the --plugin modules (before any config is checked), set
    --data-root, then with --allow-config-plugins import the modules the config's
    ``plugins`` (and its [compare.*] tables') name, as --plugin would; without the flag a
    config that names plugins not given is refused when it is loaded."""
    import os

    from fedforge.data.root import use_data_root_option
    from fedforge.experiment.config import ConfigError, listed_plugins, load_raw
    from fedforge.experiment.tracking import URI_ENV
    from fedforge.plugins import PluginError, load_plugins

    if mlflow_uri is not None:
        os.environ[URI_ENV] = mlflow_uri
    with failing(PluginError):
        load_plugins(plugins or [])
    if data_root is not None:
        with failing(ValueError):
            use_data_root_option(data_root)
    if allow_config_plugins and config is not None:
        with failing(ConfigError, PluginError):
            load_plugins(listed_plugins(load_raw(config)), "plugins")


def figure_options(bands: str | None, legend: str | None) -> AbstractContextManager:
    """The figure options context of --bands and --legend; a bad value exits naming it."""
    from fedforge.study.plots import FigureOptions
    from fedforge.study.plots import figure_options as styled

    try:
        FigureOptions(bands or "alpha", legend or "best")
    except ValueError as exc:
        fail(f"--{exc}")
    return styled(bands, legend)
