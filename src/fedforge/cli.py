"""``fedforge`` command line: run | pretrain | compare | sweep | reproduce | plot | report |
bench WORKLOAD | algorithms | config | datasets | models. Only the command surface: what
each command does lives in the module it calls."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from importlib import import_module
from pathlib import Path
from typing import Annotated

import click
import typer
from rich.console import Console
from rich.table import Table
from typer.core import TyperGroup

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="fedforge: fast, faithful federated-learning simulation.")
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
console = Console(soft_wrap=True)  # a path printed whole, also when piped (grep finds it)
err_console = Console(stderr=True)


@app.callback()
def _startup() -> None:
    """fast, faithful federated-learning simulation."""
    from fedforge.core.malloc import keep_freed_memory

    keep_freed_memory()  # CPU runs: no page faults for each step's fresh tensors


def _fail(message: str) -> None:
    from rich.markup import escape

    err_console.print(f"[red]error:[/red] {escape(message)}", highlight=False, soft_wrap=True)
    raise typer.Exit(code=2)


@contextmanager
def _failing(*errors: type[Exception]) -> Iterator[None]:
    """An error of these types (the user's input, not a bug) leaves as one line."""
    try:
        yield
    except errors as exc:
        _fail(str(exc))


def _nonempty(option: str):
    """A parser for a path option (``--out``, ``--runs``) that refuses an empty value: it
    would silently mean the current folder."""
    def parse(value: str | Path | None) -> Path | None:
        from fedforge.experiment.rundir import folder_option

        with _failing(ValueError):
            return None if value is None else folder_option(option, value)

    return parse


_out_path = _nonempty("--out")


def _setup(plugins: list[str] | None, data_root: Path | None = None,
           mlflow_uri: str | None = None) -> None:
    """Import --plugin modules (before any config is checked), set --data-root and
    --mlflow-uri (in the environment, so that the runs of worker processes read it too)."""
    import os

    from fedforge.data.root import use_data_root_option
    from fedforge.experiment.tracking import URI_ENV
    from fedforge.plugins import PluginError, load_plugins

    if mlflow_uri is not None:
        os.environ[URI_ENV] = mlflow_uri

    with _failing(PluginError):
        load_plugins(plugins or [])
    if data_root is not None:
        with _failing(ValueError):
            use_data_root_option(data_root)


def _config_plugins(config: Path, allow: bool) -> None:
    """--allow-config-plugins: import the config's ``plugins`` (and its [compare.*] tables'),
    as --plugin would; without the flag a config that names plugins not given is refused."""
    if not allow:
        return
    from fedforge.experiment.config import ConfigError, listed_plugins, load_raw
    from fedforge.plugins import PluginError, load_plugins

    with _failing(ConfigError, PluginError):
        load_plugins(listed_plugins(load_raw(config)), "plugins")


@app.command()
def run(
    config: Annotated[Path, typer.Argument(help="TOML or YAML run config")],
    overrides: Overrides = None,
    out: Annotated[Path, typer.Option("--out", "-o", help="output directory",
                                      parser=_out_path, metavar="PATH")] = Path("runs/run"),
    resume: Annotated[bool, typer.Option("--resume", help="continue from out/checkpoints")] = False,
    overwrite: Annotated[bool, typer.Option(
        "--overwrite", help="replace the run already in --out (its own files only)")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="no progress bar")] = False,
    plugin: Plugins = None,
    allow_config_plugins: AllowConfigPlugins = False,
    data_root: DataRootOption = None,
    variant: Annotated[str | None, typer.Option(
        "--variant", help="apply the config's \\[compare.VARIANT] table and algorithm, as "
                          "fedforge compare -a VARIANT does")] = None,
    profile: Annotated[bool, typer.Option(
        "--profile", help="torch profiler trace of the run in OUT/profile/ and its top "
                          "kernels (use a few rounds: the trace grows with the run)")] = False,
    mlflow_uri: MlflowUri = None,
) -> None:
    r"""Run one experiment (one task, or a \[\[tasks]] list: FedAST and the multi-task
    baselines); writes config.resolved.toml, metrics.jsonl and checkpoints/.

    An --out that holds an earlier run needs --resume (continue it; only rounds, eval,
    checkpoint and engine settings may change) or --overwrite."""
    _setup(plugin, data_root, mlflow_uri)
    _config_plugins(config, allow_config_plugins)
    from fedforge.bench.profiling import profiled
    from fedforge.core.memory import out_of_memory
    from fedforge.data import DatasetError
    from fedforge.experiment.compare import variant_config
    from fedforge.experiment.config import ConfigError, load_config
    from fedforge.experiment.metrics import run_summary
    from fedforge.experiment.runner import run_experiment

    with _failing(ConfigError):
        cfg = (load_config(config, overrides or []) if variant is None
               else variant_config(config, variant, overrides or []))
    try:
        with profiled(out / "profile", "run", enabled=profile):
            history = run_experiment(cfg, out, resume=resume, progress=not quiet,
                                     overwrite=overwrite, allow_processes=True)
    except (DatasetError, ValueError, OSError, FloatingPointError) as exc:
        _fail(str(exc))
    except (MemoryError, RuntimeError) as exc:  # an allocation past a ulimit -v: one line
        if (message := out_of_memory(exc)) is None:
            raise
        _fail(message)
    summary = run_summary(cfg, history, out)
    if summary is not None:  # ranks > 0 of a torchrun job: rank 0 reports
        console.print(f"[bold green]done[/bold green] {summary}", highlight=not cfg.multitask)


@app.command()
def pretrain(
    config: Annotated[Path, typer.Argument(help="TOML or YAML run config (model and data)")],
    overrides: Overrides = None,
    out: Annotated[Path, typer.Option("--out", "-o", help="output directory",
                                      parser=_out_path, metavar="PATH")] = Path("runs/pretrain"),
    part: Annotated[str, typer.Option(
        "--part", help="public | private | all: which part of the training set "
                       "(data.options.train_part; all keeps the config's data)")] = "public",
    epochs: Annotated[int, typer.Option("--epochs")] = 1,
    lr: Annotated[float, typer.Option("--lr")] = 1e-3,
    batch_size: Annotated[int, typer.Option("--batch-size")] = 64,
    optimizer: Annotated[str, typer.Option("--optimizer", help="adam | sgd")] = "adam",
    max_steps: Annotated[int | None, typer.Option("--max-steps")] = None,
    plugin: Plugins = None,
    allow_config_plugins: AllowConfigPlugins = False,
    data_root: DataRootOption = None,
) -> None:
    """Train the config's model centrally (default: on the public half of its training set);
    writes OUT/model.safetensors for model.init_from and OUT/pretrain.json."""
    _setup(plugin, data_root)
    _config_plugins(config, allow_config_plugins)
    from fedforge.data import DatasetError
    from fedforge.experiment.config import ConfigError, load_config
    from fedforge.pretrain import pretrain as run_pretrain

    with _failing(ConfigError):
        cfg = load_config(config, overrides or [])
    if part not in ("public", "private", "all"):
        _fail(f"--part: expected public, private or all, got {part!r}")
    with _failing(DatasetError, ValueError, OSError):
        summary = run_pretrain(cfg, out, part=part, epochs=epochs, lr=lr,  # type: ignore[arg-type]
                               batch_size=batch_size, optimizer=optimizer, max_steps=max_steps)
    console.print(f"[bold green]done[/bold green] pretrained {cfg.model.name} on "
                  f"{summary['train_samples']} samples: test_accuracy="
                  f"{summary['test_accuracy']:.4f} -> {out}", highlight=False)


Bands = Annotated[str | None, typer.Option(
    "--bands", metavar="alpha|off|panels",
    help="95 % interval over seeds: shaded (alpha, default), off, or one panel per method")]
Legend = Annotated[str | None, typer.Option(
    "--legend", metavar="best|outside|off",
    help="best (default): inside where it hides no line or band, else outside the axes")]


def _figure_options(bands: str | None, legend: str | None) -> AbstractContextManager:
    """The figure options context of --bands and --legend; a bad value exits naming it."""
    from fedforge.experiment.plots import FigureOptions, figure_options

    try:
        FigureOptions(bands or "alpha", legend or "best")
    except ValueError as exc:
        _fail(f"--{exc}")
    return figure_options(bands, legend)


@app.command()
def compare(
    config: Annotated[Path, typer.Argument(help="TOML or YAML run config")],
    algorithms: Annotated[str, typer.Option("--algorithms", "-a", help="comma-separated names")],
    overrides: Overrides = None,
    out: Annotated[Path, typer.Option("--out", "-o", parser=_out_path, metavar="PATH")
                   ] = Path("runs/compare"),
    quiet: Annotated[bool, typer.Option("--quiet", "-q")] = False,
    target: Annotated[float | None, typer.Option(
        "--target", help="test accuracy: table gives rounds and simulated minutes to it")] = None,
    seeds: Annotated[str | None, typer.Option(
        "--seeds", help="comma-separated seeds (default: the config's); mean and 95 % "
                        "interval over them")] = None,
    overwrite: Annotated[bool, typer.Option(
        "--overwrite", help="re-run the runs already in --out instead of continuing them")
    ] = False,
    metric: Annotated[str | None, typer.Option(
        "--metric", "-m", help="rank on this metrics key (default: what the methods are "
                               "judged by, e.g. personal_accuracy_mean)")] = None,
    paired: Annotated[str, typer.Option(
        "--paired", help="auto | seed | client: how differences to the first method pair")
    ] = "auto",
    plugin: Plugins = None,
    allow_config_plugins: AllowConfigPlugins = False,
    data_root: DataRootOption = None,
    bands: Bands = None,
    legend: Legend = None,
    mlflow_uri: MlflowUri = None,
) -> None:
    r"""Run several algorithms on identical data, partition and seeds; table and figures.

    A \[compare.ALGORITHM] table in the config is merged in for that algorithm only (e.g.
    its learning rates). With --seeds, the figures draw each algorithm's mean over the seeds
    with a shaded 95 % t-interval, and table.json / table.csv give mean, std, n and the
    interval of each metric. Runs already in --out with the same config are continued (a
    finished one is not re-run); with a changed config they need --overwrite."""
    from fedforge.experiment import compare as studies
    from fedforge.experiment.config import ConfigError

    _setup(plugin, data_root, mlflow_uri)
    _config_plugins(config, allow_config_plugins)
    styled = _figure_options(bands, legend)
    names = [a.strip() for a in algorithms.split(",") if a.strip()]
    if not names:
        _fail("--algorithms: expected a comma-separated list, e.g. fedavg,scaffold")
    with _failing(ConfigError, ValueError, OSError):
        methods = studies.method_configs(config, names, overrides or [])
    if methods is not None:  # a multi-task file: --algorithms names methods
        with _failing(ConfigError, ValueError, OSError), styled:
            table_rows, plot = studies.run_multitask_comparison(
                methods, out, progress=not quiet, overwrite=overwrite, allow_processes=True)
        _print_rows(table_rows, out)
        console.print(f"plot: {plot}")
        return
    with _failing(ValueError):
        seed_list = studies.parse_seeds(seeds)
    with _failing(ConfigError):
        cfgs = studies.comparison_configs(config, names, overrides, seed_list)
    with _failing(ValueError, OSError, FloatingPointError), styled:
        table_rows, plot = studies.run_comparison(cfgs, out, target=target, progress=not quiet,
                                                  overwrite=overwrite, allow_processes=True,
                                                  metric=metric, paired=paired)
    _print_rows(table_rows, out)
    console.print(f"plot: {plot} (and .pdf); table: {out / 'table.json'} (and .csv)")


@app.command()
def sweep(
    config: Annotated[Path, typer.Argument(help="TOML or YAML run config")],
    overrides: Overrides = None,
    out: Annotated[Path, typer.Option("--out", "-o", help="sweep folder", parser=_out_path,
                                      metavar="PATH")] = Path("runs/sweep"),
    space: Annotated[Path | None, typer.Option(
        "--space", help="TOML file of the search space (default: the config's \\[sweep])")
    ] = None,
    sampler: Annotated[str, typer.Option("--sampler", help="grid | random | tpe")] = "tpe",
    trials: Annotated[int | None, typer.Option(
        "--trials", help="number of trials (default: the whole grid, or 20)")] = None,
    jobs: Annotated[int | None, typer.Option(
        "--jobs", "-j", help="trials at a time (default: one per GPU, else per CPU core)")
    ] = None,
    metric: Annotated[str | None, typer.Option(
        "--metric", help="val_accuracy | val_loss | personal_accuracy_mean | a metrics key "
                         "(default: what the method is judged by)")
    ] = None,
    direction: Annotated[str | None, typer.Option(
        "--direction", help="maximize | minimize (default: minimize a loss, else maximize)")
    ] = None,
    prune: Annotated[bool, typer.Option(
        "--prune", help="stop trials whose metric lags the median of earlier ones by round")
    ] = False,
    resume: Annotated[bool, typer.Option("--resume", help="continue the sweep in --out")
                      ] = False,
    validation_fraction: Annotated[float, typer.Option(
        "--validation-fraction", help="share of the training data held out for selection")
    ] = 0.2,
    seed: Annotated[int, typer.Option("--seed", help="the sampler's seed")] = 0,
    final: Annotated[bool, typer.Option(
        "--final/--no-final", help="train the chosen setting on all the training data and "
                                   "report its test score (OUT/best/)")] = True,
    plugin: Plugins = None,
    allow_config_plugins: AllowConfigPlugins = False,
    data_root: DataRootOption = None,
    mlflow_uri: MlflowUri = None,
) -> None:
    """Search config keys (grid, random or TPE on Optuna), trials in parallel, each a run
    folder in OUT/trials/; select on a validation split, report test for the choice only.

    Writes OUT/table.csv, table.json and sweep.png; a killed sweep continues with --resume
    (docs/sweeps.md)."""
    _setup(plugin, data_root, mlflow_uri)
    _config_plugins(config, allow_config_plugins)
    from fedforge.data import DatasetError
    from fedforge.experiment.sweep import SweepSettings, run_sweep

    settings = SweepSettings(
        config, out, list(overrides or []), space, sampler, trials, jobs, metric, direction,
        prune, resume, validation_fraction, seed, final, list(plugin or []),
        allow_config_plugins, data_root)
    with _failing(DatasetError, ValueError, OSError, ImportError):
        result = run_sweep(settings, log=lambda line: console.print(
            line, highlight=False, markup=False, soft_wrap=True))
    console.print(f"table: {out / 'table.csv'} (and .json); figure: {out / 'sweep.png'}"
                  + ("" if result.best is not None else "; no trial completed"),
                  highlight=False)


def _print_table(title: str, columns: Sequence[str], rows: Iterable[Sequence[str]], *,
                 highlight: bool = False, bold_first: bool = False, **table_options) -> None:
    table = Table(title=title, **table_options)
    for i, column in enumerate(columns):
        table.add_column(column, style="bold" if bold_first and i == 0 else None)
    for row in rows:
        table.add_row(*row)
    console.print(table, highlight=highlight)


def _print_rows(table_rows: list[dict], out: Path) -> None:
    from fedforge.experiment.compare import format_cell
    from fedforge.experiment.labels import metric

    columns = [col if col in ("algorithm", "method", "seeds") else metric(col).described
               for col in table_rows[0]]
    _print_table(f"comparison ({out}); mean ± half the 95 % interval over seeds", columns,
                 [[format_cell(v, row.get("seeds")) for v in row.values()]
                  for row in table_rows], title_justify="left")


@app.command()
def reproduce(
    name: Annotated[str, typer.Argument(help="registered reproduction, e.g. fadamgc")],
    scale: Annotated[str, typer.Option(
        "--scale", help="cpu: run the grid here; paper: print the paper-scale commands")
    ] = "cpu",
    report_only: Annotated[bool, typer.Option(
        "--report-only", help="regenerate the report from the raw metrics (--data) without "
        "running")
    ] = False,
    runs: Annotated[Path, typer.Option("--runs", help="run folders", parser=_nonempty("--runs"),
                                       metavar="PATH")] = Path("runs/reproduce"),
    out: Annotated[Path | None, typer.Option(
        "--out", "-o", parser=_out_path, metavar="PATH",
        help="where the page (PATH/reproductions/NAME.md) and figures (PATH/img/) go, by "
             "default reproductions/NAME in the current folder; '--out docs' from a source "
             "checkout rewrites its committed pages")] = None,
    data: Annotated[Path, typer.Option(
        "--data", parser=_nonempty("--data"), metavar="PATH",
        help="raw metrics, one folder per reproduction (a source checkout commits them in "
             "docs/data); the grid copies each run's metrics.jsonl here")
    ] = Path("docs/data"),
    seeds: Annotated[str | None, typer.Option(
        "--seeds", help="run these seeds (e.g. 0-9: the seeds a page's power rule asks "
        "for); the report reads every committed seed")] = None,
    conditions: Annotated[str | None, typer.Option(
        "--conditions", help="run only these conditions (comma-separated names)")] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q")] = False,
    plugin: Plugins = None,
    data_root: DataRootOption = None,
) -> None:
    """Run a paper's reproduction grid (resuming what exists) and write its table, figures
    and verdicts to reproductions/NAME/ in the current folder (--out). Reproductions:
    fadamgc, fedast, fednar, fedptr, pfl, safl; 'all --report-only --out docs' rewrites
    every page and docs/reproductions.md."""
    from fedforge.experiment.config import ConfigError
    from fedforge.reproduce import get_reproduction, parse_seeds, report_all
    from fedforge.reproduce import reproduce as run_reproduction
    from fedforge.reproduce.report import paper_scale

    _setup(plugin, data_root)
    if scale not in ("cpu", "paper"):
        _fail(f"--scale: expected cpu or paper, got {scale!r}")
    if name == "all":  # every page and the summary, from the raw metrics only
        if not report_only:
            _fail("reproduce all: only with --report-only (each grid runs on its own)")
        with _failing(ValueError, OSError):
            page = report_all(data, out or Path("reproductions"))
        console.print(f"report: {page}")
        return
    try:
        spec = get_reproduction(name)
    except KeyError as exc:
        _fail(str(exc.args[0]))
    if scale == "paper":
        console.print(paper_scale(spec), highlight=False, soft_wrap=True)
        return
    with _failing(ConfigError, ValueError, OSError, FloatingPointError):
        try:
            page = run_reproduction(
                spec, runs=runs, data=data, out=out, report_only=report_only,
                progress=not quiet, allow_processes=True,
                seeds=parse_seeds(seeds) if seeds else None,
                conditions=tuple(c.strip() for c in conditions.split(",")) if conditions
                else None)
        except KeyError as exc:  # an unknown --conditions name
            _fail(str(exc.args[0]))
    console.print(f"report: {page}")


@app.command()
def plot(
    run_dirs: Annotated[list[Path], typer.Argument(help="run directories")],
    metric: Annotated[str | None, typer.Option(
        "--metric", "-m", help="a metrics key (default: what the methods are judged by)")
    ] = None,
    x: Annotated[str, typer.Option("--x", help="round, sim_time_s, bytes_up, ...")] = "round",
    out: Annotated[Path, typer.Option("--out", "-o", parser=_out_path, metavar="PATH")
                   ] = Path("plot.png"),
    per_seed: Annotated[bool, typer.Option(
        "--per-seed", help="one line per run instead of the mean over seeds")] = False,
    logx: Annotated[bool, typer.Option("--logx", help="logarithmic x axis")] = False,
    bands: Bands = None,
    legend: Legend = None,
) -> None:
    """Plot a metric of runs against rounds (or another metric): one line per algorithm,
    the mean over its seeds with a shaded 95 % interval; a PDF and the plotted numbers
    (JSON) are written beside the PNG."""
    from fedforge.experiment.plots import load_run_list, plot_runs

    styled = _figure_options(bands, legend)
    # missing/damaged metrics file, unknown metric
    with _failing(OSError, ValueError), styled:
        path = plot_runs(load_run_list(run_dirs), out, y=metric, x=x, logx=logx,
                         average=not per_seed)
    console.print(f"wrote {path} and {path.with_suffix('.pdf')}")


@app.command()
def report(
    folder: Annotated[Path, typer.Argument(help="a run folder or a compare --out folder")],
    out: Annotated[Path | None, typer.Option(
        "--out", "-o", help="HTML file to write (default FOLDER/report.html)",
        parser=_out_path, metavar="PATH")] = None,
    metric: Annotated[str | None, typer.Option(
        "--metric", "-m", help="the metric the page ranks and plots first (default: what "
                               "the methods are judged by)")] = None,
    bands: Bands = None,
    legend: Legend = None,
) -> None:
    """Write one self-contained HTML page (no external files): config, partition
    statistics, curves, per-client distributions and the final table."""
    from fedforge.experiment.report import write_report

    styled = _figure_options(bands, legend)
    with _failing(OSError, ValueError), styled:
        path = write_report(folder, out, metric=metric)
    console.print(f"wrote {path}")


BENCHES = {"w1": "throughput:w1", "w2": "throughput:w2", "w3": "time_to_accuracy:w3",
           "population": "population:population", "pfl-cifar10": "pfl_cifar10:pfl_cifar10",
           "pfl-ditto": "pfl_speed:pfl_ditto", "results": "results:results"}
"""``fedforge bench NAME`` -> ``module:function`` in ``fedforge.bench``: the function's
parameters are the command's options."""


class _Benches(TyperGroup):
    """``fedforge bench``: a workload's module is imported only when its command runs (or
    ``fedforge bench --help`` lists them), so the other commands start without it. Each
    returns the table it recorded; a ValueError or OSError is a one-line error."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(BENCHES)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in BENCHES:
            return None
        module, function = BENCHES[cmd_name].split(":")
        workload = typer.Typer(add_completion=False)
        workload.command(cmd_name)(getattr(import_module(f"fedforge.bench.{module}"),
                                           function))
        return typer.main.get_command(workload)

    def invoke(self, ctx: click.Context) -> None:
        with _failing(ValueError, OSError):
            table = super().invoke(ctx)
        console.print(table, markup=False)


app.add_typer(typer.Typer(cls=_Benches, no_args_is_help=True,
                          help="Run a benchmark workload, print its table and write its record "
                               "to --results, regenerating RESULTS.md (fedforge bench WORKLOAD "
                               "--help); fedforge bench results regenerates the page alone."),
            name="bench")


@app.command("algorithms")
def list_algorithms(
    params: Annotated[str | None, typer.Option(
        "--params", help="one method's hyper-parameters with their defaults and sources")] = None,
    markdown: Annotated[bool, typer.Option(
        "--markdown", help="print the docs/algorithms.md page")] = False,
    plugin: Plugins = None,
) -> None:
    """Every method the CLI accepts, with its kind: sync algorithms, async methods and
    multi-task baselines (the last two as a multi-task config's ``method``)."""
    _setup(plugin)
    from fedforge.algorithms import methods

    if markdown:
        typer.echo(methods.markdown(), nl=False)
        return
    if params is not None:
        with _failing(KeyError, ValueError):
            rows, kind = methods.parameter_rows(params), methods.method_kind(params)
        _print_table(f"{params} ({kind}): defaults and their sources",
                     ("parameter", "default", "source", "where / why"), rows)
        return
    _print_table("methods (fedforge algorithms --params NAME for the defaults)",
                 ("name", "kind", "description"),
                 [(name, kind, methods.describe(name))
                  for name, kind in methods.all_methods().items()])


@app.command("config")
def config_reference(
    algorithm: Annotated[str | None, typer.Argument(
        help="also this algorithm's hyper-parameters, with their sources")] = None,
    defaults: Annotated[bool, typer.Option(
        "--defaults", help="print every key with its default as a commented TOML file "
                           "(the default action)")] = False,
    markdown: Annotated[bool, typer.Option(
        "--markdown", help="print the docs/config.md page")] = False,
    plugin: Plugins = None,
) -> None:
    """The config reference, generated from the schema: every key, its type and default."""
    from fedforge.experiment import reference

    _setup(plugin)
    if markdown:
        if algorithm is not None or defaults:
            _fail("--markdown: takes no ALGORITHM and no --defaults")
        typer.echo(reference.markdown(), nl=False)
        return
    if algorithm is not None:
        from fedforge.algorithms import ALGORITHMS, canonical_name

        if canonical_name(algorithm) not in ALGORITHMS:
            _fail(f"ALGORITHM: unknown algorithm {algorithm!r}; expected one of "
                  f"{sorted(ALGORITHMS)}")
    typer.echo(reference.defaults_toml(algorithm), nl=False)


@app.command("datasets")
def list_datasets(plugin: Plugins = None) -> None:
    """Datasets the loaders read (and the embedded default)."""
    _setup(plugin)
    from fedforge.data import DATASETS

    _print_table("datasets", ("name", "description"), sorted(DATASETS.items()),
                 highlight=True, bold_first=True)


@app.command("models")
def list_models(plugin: Plugins = None) -> None:
    """Registered models, and the pretrained models installed packages ship (model.name =
    "pretrained" with model.options.path set to the folder shown)."""
    _setup(plugin)
    from fedforge.models import MODELS
    from fedforge.models.pretrained import installed_models

    rows = [(k, v[1]) for k, v in sorted(MODELS.items())]
    installed = installed_models()
    rows += [(f"pretrained: {m.name}", f"{m.task}, installed by {m.package} {m.version}")
             for m in installed]
    _print_table("models", ("name", "description"), rows, highlight=True, bold_first=True)
    for m in installed:  # whole, for model.options.path (a table cell would cut it)
        where = m.source.folder / m.source.gguf_file if m.source.gguf_file else m.source.folder
        print(f"{m.name}: path = {where}")


if __name__ == "__main__":
    app()
