"""``fedforge`` command line: run | pretrain | compare | sweep | reproduce | plot | report |
bench WORKLOAD | algorithms | config | datasets | models. Only the command surface: what
each command does lives in the module it calls."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from fedforge.bench.commands import Workloads
from fedforge.commands.options import (
    AllowConfigPlugins,
    Bands,
    DataRootOption,
    Legend,
    MlflowUri,
    Overrides,
    Plugins,
    figure_options,
    nonempty,
    out_path,
    setup,
)
from fedforge.commands.output import console, fail, failing, out_of_memory_fails, print_table

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="fedforge: fast, faithful federated-learning simulation.")


@app.callback()
def _startup() -> None:
    """fast, faithful federated-learning simulation."""
    from fedforge.core.malloc import keep_freed_memory

    keep_freed_memory()  # CPU runs: no page faults for each step's fresh tensors


@app.command()
def run(
    config: Annotated[Path, typer.Argument(help="TOML or YAML run config")],
    overrides: Overrides = None,
    out: Annotated[Path, typer.Option("--out", "-o", help="output directory",
                                      parser=out_path, metavar="PATH")] = Path("runs/run"),
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
    setup(plugin, data_root, mlflow_uri, config, allow_config_plugins)
    from fedforge.bench.profiling import profiled
    from fedforge.experiment.config import ConfigError, load_config
    from fedforge.experiment.metrics import run_summary
    from fedforge.experiment.runner import run_experiment
    from fedforge.study.compare import variant_config

    with failing(ConfigError):
        cfg = (load_config(config, overrides or []) if variant is None
               else variant_config(config, variant, overrides or []))
    with (failing(ValueError, OSError, FloatingPointError), out_of_memory_fails(),
          profiled(out / "profile", "run", enabled=profile)):
        history = run_experiment(cfg, out, resume=resume, progress=not quiet,
                                 overwrite=overwrite, allow_processes=True)
    summary = run_summary(cfg, history, out)
    if summary is not None:  # ranks > 0 of a torchrun job: rank 0 reports
        console.print(f"[bold green]done[/bold green] {summary}", highlight=not cfg.multitask)


@app.command()
def pretrain(
    config: Annotated[Path, typer.Argument(help="TOML or YAML run config (model and data)")],
    overrides: Overrides = None,
    out: Annotated[Path, typer.Option("--out", "-o", help="output directory",
                                      parser=out_path, metavar="PATH")] = Path("runs/pretrain"),
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
    setup(plugin, data_root, None, config, allow_config_plugins)
    from fedforge import pretrain as pretraining
    from fedforge.experiment.config import ConfigError, load_config

    with failing(ConfigError):
        cfg = load_config(config, overrides or [])
    with failing(ValueError, OSError):  # a bad --part, a missing dataset file
        summary = pretraining.pretrain(
            cfg, out, part=part, epochs=epochs, lr=lr,  # type: ignore[arg-type]
            batch_size=batch_size, optimizer=optimizer, max_steps=max_steps)
    console.print(f"[bold green]done[/bold green] {pretraining.summary_line(summary, out)}",
                  highlight=False)


@app.command()
def compare(
    config: Annotated[Path, typer.Argument(help="TOML or YAML run config")],
    algorithms: Annotated[str, typer.Option("--algorithms", "-a", help="comma-separated names")],
    overrides: Overrides = None,
    out: Annotated[Path, typer.Option("--out", "-o", parser=out_path, metavar="PATH")
                   ] = Path("runs/compare"),
    quiet: Annotated[bool, typer.Option("--quiet", "-q")] = False,
    target: Annotated[float | None, typer.Option(
        "--target", help="test accuracy: table gives rounds and simulated minutes to it")] = None,
    seeds: Annotated[str | None, typer.Option(
        "--seeds", help="comma-separated seeds (default: the config's); mean and 95 % "
                        "interval over them")] = None,
    overwrite: Annotated[bool, typer.Option(
        "--overwrite", help="re-run the runs already in --out instead of continuing them")] = False,
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
    from fedforge.study.compare import compare_command, printed_table

    setup(plugin, data_root, mlflow_uri, config, allow_config_plugins)
    with failing(ValueError, OSError, FloatingPointError), figure_options(bands, legend):
        rows, written = compare_command(
            config, algorithms, overrides or [], out, seeds=seeds, target=target,
            metric=metric, paired=paired, progress=not quiet, overwrite=overwrite)
    print_table(*printed_table(rows, out), title_justify="left")
    console.print(written)


@app.command()
def sweep(
    config: Annotated[Path, typer.Argument(help="TOML or YAML run config")],
    overrides: Overrides = None,
    out: Annotated[Path, typer.Option("--out", "-o", help="sweep folder", parser=out_path,
                                      metavar="PATH")] = Path("runs/sweep"),
    space: Annotated[Path | None, typer.Option(
        "--space", help="TOML file of the search space (default: the config's \\[sweep])")] = None,
    sampler: Annotated[str, typer.Option("--sampler", help="grid | random | tpe")] = "tpe",
    trials: Annotated[int | None, typer.Option(
        "--trials", help="number of trials (default: the whole grid, or 20)")] = None,
    jobs: Annotated[int | None, typer.Option(
        "--jobs", "-j", help="trials at a time (default: one per GPU, else per CPU core)")] = None,
    metric: Annotated[str | None, typer.Option(
        "--metric", help="val_accuracy | val_loss | personal_accuracy_mean | a metrics key "
                         "(default: what the method is judged by)")] = None,
    direction: Annotated[str | None, typer.Option(
        "--direction", help="maximize | minimize (default: minimize a loss, else maximize)")
    ] = None,
    prune: Annotated[bool, typer.Option(
        "--prune", help="stop trials whose metric lags the median of earlier ones by round")
    ] = False,
    resume: Annotated[bool, typer.Option("--resume", help="continue the sweep in --out")] = False,
    validation_fraction: Annotated[float, typer.Option(
        "--validation-fraction", help="share of the training data held out for selection")] = 0.2,
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
    setup(plugin, data_root, mlflow_uri, config, allow_config_plugins)
    from fedforge.study.sweep import SweepSettings, run_sweep

    settings = SweepSettings(
        config, out, list(overrides or []), space, sampler, trials, jobs, metric, direction,
        prune, resume, validation_fraction, seed, final, list(plugin or []),
        allow_config_plugins, data_root, allow_processes=True)
    with failing(ValueError, OSError, ImportError):
        result = run_sweep(settings, log=lambda line: console.print(
            line, highlight=False, markup=False, soft_wrap=True))
    console.print(f"table: {out / 'table.csv'} (and .json); figure: {out / 'sweep.png'}"
                  + ("" if result.best is not None else "; no trial completed"),
                  highlight=False)


@app.command()
def reproduce(
    name: Annotated[str, typer.Argument(help="registered reproduction, e.g. fadamgc")],
    scale: Annotated[str, typer.Option(
        "--scale", help="cpu: run the grid here; paper: print the paper-scale commands")] = "cpu",
    report_only: Annotated[bool, typer.Option(
        "--report-only", help="regenerate the report from the raw metrics (--data) without "
        "running")] = False,
    runs: Annotated[Path, typer.Option("--runs", help="run folders", parser=nonempty("--runs"),
                                       metavar="PATH")] = Path("runs/reproduce"),
    out: Annotated[Path | None, typer.Option(
        "--out", "-o", parser=out_path, metavar="PATH",
        help="where the page (PATH/reproductions/NAME.md) and figures (PATH/img/) go, by "
             "default reproductions/NAME in the current folder; '--out docs' from a source "
             "checkout rewrites its committed pages")] = None,
    data: Annotated[Path, typer.Option(
        "--data", parser=nonempty("--data"), metavar="PATH",
        help="raw metrics, one folder per reproduction (a source checkout commits them in "
             "docs/data); the grid copies each run's metrics.jsonl here")] = Path("docs/data"),
    seeds: Annotated[str | None, typer.Option(
        "--seeds", help="run these seeds (e.g. 0-9: the seeds a page's power rule asks "
        "for); the report reads every committed seed")] = None,
    conditions: Annotated[str | None, typer.Option(
        "--conditions", help="run only these conditions (comma-separated names)")] = None,
    batch_seeds: Annotated[bool, typer.Option("--batch-seeds", help="train each condition's "
        "missing seeds as one vmapped batch where they can (the same numbers)")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q")] = False,
    plugin: Plugins = None,
    data_root: DataRootOption = None,
) -> None:
    """Run a paper's reproduction grid (resuming what exists) and write its table, figures
    and verdicts to reproductions/NAME/ in the current folder (--out). Reproductions:
    baselines, fadamgc, fedast, fednar, fedptr, lora, pfl, safl; 'all --report-only --out
    docs' rewrites every page and docs/reproductions.md."""
    from fedforge.reproduce import command

    setup(plugin, data_root)
    with failing(ValueError, OSError, FloatingPointError):
        done = command(name, scale=scale, report_only=report_only, runs=runs, data=data,
                       out=out, seeds=seeds, conditions=conditions, progress=not quiet,
                       batch_seeds=batch_seeds)
    if isinstance(done, str):  # --scale paper: the commands, not run
        console.print(done, highlight=False, soft_wrap=True)
    else:
        console.print(f"report: {done}")


@app.command()
def plot(
    run_dirs: Annotated[list[Path], typer.Argument(help="run directories")],
    metric: Annotated[str | None, typer.Option(
        "--metric", "-m", help="a metrics key (default: what the methods are judged by)")] = None,
    x: Annotated[str, typer.Option("--x", help="round, sim_time_s, bytes_up, ...")] = "round",
    out: Annotated[Path, typer.Option("--out", "-o", parser=out_path, metavar="PATH")
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
    from fedforge.study.plots import load_run_list, plot_runs

    styled = figure_options(bands, legend)
    # missing/damaged metrics file, unknown metric
    with failing(OSError, ValueError), styled:
        path = plot_runs(load_run_list(run_dirs), out, y=metric, x=x, logx=logx,
                         average=not per_seed)
    console.print(f"wrote {path} and {path.with_suffix('.pdf')}")


@app.command()
def report(
    folder: Annotated[Path, typer.Argument(help="a run folder or a compare --out folder")],
    out: Annotated[Path | None, typer.Option(
        "--out", "-o", help="HTML file to write (default FOLDER/report.html)",
        parser=out_path, metavar="PATH")] = None,
    metric: Annotated[str | None, typer.Option(
        "--metric", "-m", help="the metric the page ranks and plots first (default: what "
                               "the methods are judged by)")] = None,
    bands: Bands = None,
    legend: Legend = None,
) -> None:
    """Write one self-contained HTML page (no external files): config, partition
    statistics, curves, per-client distributions and the final table."""
    from fedforge.study.report import write_report

    styled = figure_options(bands, legend)
    with failing(OSError, ValueError), styled:
        path = write_report(folder, out, metric=metric)
    console.print(f"wrote {path}")


app.add_typer(typer.Typer(cls=Workloads, no_args_is_help=True,
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
    setup(plugin)
    from fedforge.algorithms import methods

    if markdown:
        typer.echo(methods.markdown(), nl=False)
        return
    with failing(KeyError, ValueError):
        table = methods.method_table() if params is None else methods.parameter_table(params)
    print_table(*table)


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
    setup(plugin)
    from fedforge.algorithms import ALGORITHMS, canonical_name
    from fedforge.study import reference

    if markdown and (algorithm is not None or defaults):
        fail("--markdown: takes no ALGORITHM and no --defaults")
    if not markdown and algorithm is not None and canonical_name(algorithm) not in ALGORITHMS:
        fail(f"ALGORITHM: unknown algorithm {algorithm!r}; expected one of {sorted(ALGORITHMS)}")
    typer.echo(reference.markdown() if markdown else reference.defaults_toml(algorithm), nl=False)


@app.command("datasets")
def list_datasets(plugin: Plugins = None) -> None:
    """Datasets the loaders read (and the embedded default)."""
    setup(plugin)
    from fedforge.data import DATASETS

    print_table("datasets", ("name", "description"), sorted(DATASETS.items()),
                highlight=True, bold_first=True)


@app.command("models")
def list_models(plugin: Plugins = None) -> None:
    """Registered models, and the pretrained models installed packages ship (model.name =
    "pretrained" with model.options.path set to the folder shown)."""
    setup(plugin)
    from fedforge.models import model_rows
    from fedforge.models.pretrained import installed_models

    installed = installed_models()
    print_table("models", ("name", "description"), model_rows(installed), highlight=True,
                bold_first=True)
    for m in installed:  # whole, for model.options.path (a table cell would cut it)
        print(f"{m.name}: path = {m.source.path}")


if __name__ == "__main__":
    app()
