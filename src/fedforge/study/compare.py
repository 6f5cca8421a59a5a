"""``fedforge compare``: several algorithms, identical data, partition and seed."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

from fedforge.experiment.config import (
    BaseRunConfig,
    ConfigError,
    RunConfig,
    apply_overrides,
    load_config,
    load_raw,
    validate,
)
from fedforge.experiment.metrics import TEST_METRIC, evaluated
from fedforge.experiment.progress import run_position
from fedforge.experiment.rundir import subfolder, writable_path, write_text
from fedforge.experiment.runner import run_experiment
from fedforge.study.judged import comparison_metric
from fedforge.study.labels import metric as metric_label
from fedforge.study.paired import (
    as_pairs,
    choose_pairing,
    client_scores,
    difference,
    interval_cell,
    seed_scores,
)
from fedforge.study.stats import t_interval


def rounds_to_target(history: list[dict], target: float, key: str = "test_accuracy") -> int | None:
    """First evaluated round whose ``key`` reaches ``target`` (None if never)."""
    rec = _first_at_target(history, target, key)
    return None if rec is None else rec["round"]


def sim_time_to_target(history: list[dict], target: float,
                       key: str = "test_accuracy") -> float | None:
    """Simulated seconds (``sim_time_s``, fedforge.sim.cost) when ``key`` first reaches
    ``target`` (None if never, or if the run has no simulated time)."""
    rec = _first_at_target(history, target, key)
    return None if rec is None else rec.get("sim_time_s")


def _first_at_target(history: list[dict], target: float, key: str) -> dict | None:
    return next((rec for rec in evaluated(history, key) if rec[key] >= target), None)


def comparison_configs(
    path: str | Path, names: list[str], overrides: list[str] | None = None,
    seeds: list[int] | None = None,
) -> dict[str, list[RunConfig]]:
    """One config per (variant, seed): the file, then its ``[compare.<name>]`` table merged
    in (per-algorithm hyper-parameters, e.g. the paper's learning rates), then
    ``algorithm.name``, the command-line ``overrides`` and ``seed`` (default: the file's).

    A name is an algorithm, or a named variant: a table that sets ``algorithm.name`` itself
    (``[compare.fedavg_lo.algorithm]`` with ``name = "fedavg"``, ``local_lr = 0.01``), so
    one algorithm can be compared at two settings. An override ``compare.NAME.KEY=VALUE``
    sets a key of ``NAME``'s table alone (a plugin's hyper-parameter that the other methods
    would refuse: ``compare.my_fednova.algorithm.server_lr=0.5``)."""
    per_table = [o for o in overrides or [] if o.strip().startswith("compare.")]
    overrides = [o for o in overrides or [] if o not in per_table]
    for item in per_table:
        name = item.strip().split("=", 1)[0].split(".")[1:2]
        if name and name[0] not in names:
            raise ConfigError(f"override {item!r}: {name[0]!r} is not among the compared "
                              f"methods ({', '.join(names)})")
    raw = apply_overrides(load_raw(path), per_table)
    tables = raw.pop("compare", {}) or {}
    if not isinstance(tables, dict):
        raise ConfigError("compare: expected a table of per-algorithm tables")
    out: dict[str, list[RunConfig]] = {}
    for name in names:
        table = tables.get(name, {})
        if not isinstance(table, dict):
            raise ConfigError(f"compare.{name}: expected a table of config sections")
        merged = apply_overrides(_merge(raw, table), [f"algorithm.name={_algorithm(table, name)}",
                                                      *(overrides or [])])
        base = validate(merged)
        out[name] = [base] if seeds is None else [
            base.model_copy(update={"seed": s}) for s in seeds]
    return out


def variant_config(path: str | Path, variant: str, overrides: list[str]) -> RunConfig:
    """``fedforge run --variant X``: the config ``fedforge compare -a X`` would run (its
    first seed); a file without a ``[compare.X]`` table is a ConfigError."""
    tables = load_raw(path).get("compare") or {}
    if not isinstance(tables, dict) or variant not in tables:
        known = sorted(tables) if isinstance(tables, dict) else []
        raise ConfigError(f"--variant: no [compare.{variant}] table in {path}; "
                          f"tables: {known or 'none'}")
    return comparison_configs(path, [variant], overrides)[variant][0]


def method_configs(path: str | Path, names: list[str], overrides: list[str]
                   ) -> dict[str, RunConfig] | None:
    """A multi-task file's config per method (``--algorithms`` names methods there:
    fedast, sync_st ...), or None for a single-task file (no ``[[tasks]]`` list)."""
    if "tasks" not in load_raw(path):
        return None
    return {n: load_config(path, [*overrides, f"method={n}"]) for n in names}


def parse_seeds(text: str | None) -> list[int] | None:
    """``--seeds``: comma-separated integers (None: the config's seed)."""
    if text is None:
        return None
    try:
        return [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise ValueError(f"--seeds: expected comma-separated integers, got {text!r}") from None


def _algorithm(table: dict, name: str) -> str:
    """The algorithm a ``[compare.<name>]`` table runs: its own ``algorithm.name``, else
    ``name``."""
    section = table.get("algorithm")
    chosen = section.get("name") if isinstance(section, dict) else None
    if chosen is None:
        return name
    if not isinstance(chosen, str):
        raise ConfigError(f"compare.{name}.algorithm.name: expected an algorithm name, "
                          f"got {chosen!r}")
    return chosen


def _merge(base: dict, extra: dict) -> dict:
    """Recursive dict merge (``extra`` wins); neither input is modified."""
    out = dict(base)
    for k, v in extra.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def run_comparison(
    configs: dict[str, RunConfig | list[RunConfig]], out: Path, *, target: float | None = None,
    progress: bool = True, overwrite: bool = False, allow_processes: bool = False,
    metric: str | None = None, paired: str = "auto",
) -> tuple[list[dict], Path]:
    """Run each config (or each seed's config) into ``out/<name>`` (``out/<name>/seed<s>`` for
    several seeds); -> (table rows, figure of the ranked metric against rounds).
    ``allow_processes``: as for :func:`~fedforge.experiment.runner.run_experiment`.

    The methods are ranked on ``metric`` (default: the one they are judged by,
    :func:`fedforge.study.judged.comparison_metric`: a personalised method's mean
    per-client accuracy, else the pooled test accuracy); the table shows it and the pooled
    test accuracy. Each row holds numbers: per metric its :func:`summary` over the seeds
    (mean, std, n and the 95 % t-interval); the paired difference to the first method, by
    seed or by client (``paired``: ``auto``, ``seed`` or ``client``, :mod:`.paired`); with
    ``target`` also rounds and simulated minutes to reach it, over the seeds that reached it
    (``n`` of ``seeds``). ``out/table.json`` and ``out/table.csv`` hold the rows in the
    order of ``configs``; the figures draw every seed (mean and band). A run already in its
    folder is resumed (a finished one returns its metrics; a changed config is refused)
    unless ``overwrite``."""
    check_outputs(out)
    choose_pairing(paired, 2, True)  # a misspelt choice fails before any run
    ran: dict[str, tuple[list[list[dict]], list[Path]]] = {}
    total = sum(1 if isinstance(c, BaseRunConfig) else len(c) for c in configs.values())
    done = 0
    for name, cfgs in configs.items():
        cfgs = [cfgs] if isinstance(cfgs, BaseRunConfig) else list(cfgs)
        hists, dirs = ran.setdefault(name, ([], []))
        for c in cfgs:
            run_dir = subfolder(out, name if len(cfgs) == 1 else Path(name, f"seed{c.seed}"))
            done += 1
            with run_position(f"run {done}/{total}"):
                hists.append(run_experiment(c, run_dir, progress=progress,
                                            resume=not overwrite, overwrite=overwrite,
                                            allow_processes=allow_processes))
            dirs.append(run_dir)
    from fedforge.study.plots import load_run_list, plot_runs  # noqa: PLC0415 (matplotlib)
    runs = load_run_list([d for _, dirs in ran.values() for d in dirs])
    main = ranked_metric(runs, metric)
    rows = [_row(name, hists, target, main) for name, (hists, _) in ran.items()]
    add_ranks(rows, main)
    add_paired(rows, ran, main, paired)
    if rows and out.is_dir():
        write_table(rows, out / "table.json")
    for key, name in (("sim_time_s", "sim_time"), ("dp_epsilon", "dp_epsilon")):
        if any(key in r for run in runs for r in run.records):  # simulated time; ε spent
            plot_runs(runs, out / f"accuracy_vs_{name}.png", y=main, x=key)
    plot = plot_runs(runs, out / "accuracy.png", y=main)
    return rows, plot


def ranked_metric(runs: list, asked: str | None) -> str:
    """``asked`` if some run records it (ValueError listing what they record otherwise),
    else the metric the methods are judged by."""
    if asked is None:
        return comparison_metric(runs)
    keys = sorted({k for run in runs for r in evaluated(run.records) for k in r})
    if asked not in keys:
        raise ValueError(f"--metric {asked!r}: not in the runs' metrics; available: "
                         f"{', '.join(keys)}")
    return asked


def rank_key(main: str) -> str:
    return f"rank_by_{main}"


def add_ranks(rows: list[dict], main: str) -> None:
    """Each row's rank (1: best) on its final ``main`` mean, after ``seeds`` (the rows keep
    their order: the order the methods were named in)."""
    key = main_column(main)
    better = metric_label(main).higher_is_better is not False
    means = [r[key]["mean"] for r in rows]
    order = sorted((m for m in means if m is not None), reverse=better)
    for row, m in zip(rows, means):
        rank = None if m is None else order.index(m) + 1
        items = list(row.items())
        items.insert(2, (rank_key(main), rank))
        row.clear()
        row.update(items)


def add_paired(rows: list[dict], ran: dict, main: str, paired: str) -> None:
    """``vs_<first method>``: each method's paired difference to the first one on ``main``,
    and ``paired_by``: by seed or by client (and how many pairs)."""
    names = list(ran)
    if len(names) < 2:
        return
    seeds = max(len(h) for h, _ in ran.values())
    by_client = {n: client_scores(dirs, main) for n, (_, dirs) in ran.items()}
    how = choose_pairing(paired, seeds, all(v is not None for v in by_client.values()))
    pairs = ({n: as_pairs(seed_scores(h, main)) for n, (h, _) in ran.items()}
             if how == "seed" else by_client)
    ref = names[0]
    for name, row in zip(names, rows):
        iv = None if how is None or name == ref or pairs.get(name) is None \
            or pairs.get(ref) is None else difference(pairs[name], pairs[ref])
        row[f"vs_{ref}"] = interval_cell(iv)
        row["paired_by"] = ("reference" if name == ref else "–" if iv is None
                            else f"{how} ({iv.n} pairs)")


def main_column(main: str) -> str:
    return "final_acc" if main == TEST_METRIC else f"final_{main}"


PRIVACY_KEYS = ("dp_epsilon", "dp_noise_multiplier")
"""A private run's ε spent and its σ: shown beside its accuracy wherever a run is summed up."""


def _row(name: str, hists: list[list[dict]], target: float | None,
         main: str = TEST_METRIC) -> dict:
    evals = [evaluated(h) for h in hists]  # the last round is always evaluated
    row: dict = {"algorithm": name, "seeds": len(hists)}
    if main != TEST_METRIC:  # ranked on it; the pooled test accuracy beside it
        found = seed_scores(hists, main)
        row[main_column(main)] = summary(found or [])
    row.update({"final_acc": summary([e[-1]["test_accuracy"] for e in evals]),
                 "best_acc": summary([max(r["test_accuracy"] for r in e) for e in evals]),
                 "final_loss": summary([e[-1]["test_loss"] for e in evals])})
    for key in PRIVACY_KEYS:  # differentially private runs: what the accuracy cost
        if all(key in e[-1] for e in evals):
            row[key] = summary([e[-1][key] for e in evals])
    sims = [h[-1]["sim_time_s"] / h[-1]["round"] for h in hists if "sim_time_s" in h[-1]]
    if sims:
        row["sim_s_per_round"] = summary(sims)
    if target is not None:
        reached = [r for h in hists if (r := rounds_to_target(h, target)) is not None]
        row[f"rounds_to_{target:g}"] = summary(reached)
        mins = [t / 60 for h in hists if (t := sim_time_to_target(h, target)) is not None]
        row[f"sim_min_to_{target:g}"] = summary(mins)
    row["wall_s"] = round(sum(h[-1]["wall_s"] for h in hists), 3)
    return row


def summary(values: list[float]) -> dict:
    """``{mean, std, n, ci_low, ci_high}``: the 95 % t-interval over seeds
    (:func:`fedforge.study.stats.t_interval`); std and interval are None below 2 values,
    everything but ``n`` is None for none (a target no seed reached)."""
    iv = t_interval(values)
    if iv.n == 0:
        return {"mean": None, "std": None, "n": 0, "ci_low": None, "ci_high": None}
    two = iv.n >= 2
    return {"mean": iv.mean, "std": iv.sd if two else None, "n": iv.n,
            "ci_low": iv.low if two else None, "ci_high": iv.high if two else None}


OUTPUTS = ("table.json", "table.csv", *(f"{stem}.{ext}" for stem in (
    "accuracy", "accuracy_vs_sim_time", "accuracy_vs_dp_epsilon") for ext in ("png", "pdf",
                                                                              "json")))


def check_outputs(out: Path) -> None:
    """Refuse, before any run starts, a table or figure name in ``out`` that the writer would
    refuse at the end (a planted link): the runs may take hours."""
    for name in OUTPUTS:
        writable_path(out, name)


def write_table(rows: list[dict], path: Path) -> tuple[Path, Path]:
    """``path`` (JSON, the rows as they are) and a CSV beside it with one column per
    number (``final_acc_mean``, ``final_acc_ci_low``, ...)."""
    path = write_text(path.parent, path.name, json.dumps(rows, indent=1) + "\n")
    flat = [_flatten(r) for r in rows]
    columns = list(dict.fromkeys(k for r in flat for k in r))
    buf = io.StringIO(newline="")
    writer = csv.DictWriter(buf, columns)
    writer.writeheader()
    writer.writerows(flat)
    return path, write_text(path.parent, path.with_suffix(".csv").name, buf.getvalue())


def _flatten(row: dict) -> dict:
    out = {}
    for key, value in row.items():
        if isinstance(value, dict):
            out.update({f"{key}_{k}": v for k, v in value.items()})
        else:
            out[key] = value
    return out


def format_cell(value: object, seeds: int | None = None) -> str:
    """A table cell for people: ``0.6716 ± 0.0529`` (mean ± half the 95 % interval), with
    ``(k/m)`` when only k of m seeds count, ``not reached`` when none."""
    if value is None:
        return "–"
    if not isinstance(value, dict):
        return f"{value:.4g}" if isinstance(value, float) else str(value)
    if value.get("n", 0) == 0 or value.get("mean") is None:
        return "not reached"
    text = f"{value['mean']:.4g}"
    if value.get("ci_high") is not None:
        text += f" ± {(value['ci_high'] - value['ci_low']) / 2:.2g}"
    if seeds is not None and value["n"] < seeds:
        text += f" ({value['n']}/{seeds})"
    return text


def run_multitask_comparison(
    configs: dict, out: Path, *, progress: bool = True, baseline: str = "sync_st",
    overwrite: bool = False, allow_processes: bool = False,
) -> tuple[list[dict], Path]:
    """Multi-task methods on identical tasks and seed: time to target per task, time to
    finish all tasks, and FedAST's gain ``(T_baseline - T)/T_baseline`` against ``baseline``.
    Runs already in ``out`` are resumed unless ``overwrite`` (as in :func:`run_comparison`)."""
    check_outputs(out)
    summaries = {}
    for i, (name, cfg) in enumerate(configs.items(), 1):
        with run_position(f"run {i}/{len(configs)}"):
            run_experiment(cfg, subfolder(out, name), progress=progress, resume=not overwrite,
                           overwrite=overwrite, allow_processes=allow_processes)
        summaries[name] = json.loads((out / name / "summary.json").read_text())
    t_base = summaries.get(baseline, {}).get("time_all_tasks")
    rows = []
    for name, s in summaries.items():
        row = {"method": name}  # simulated seconds; None: target not reached
        row.update({f"T_{k}": v for k, v in s["time_to_target"].items()})
        row["T_all"] = s["time_all_tasks"]
        row[f"gain_vs_{baseline}"] = gain(t_base, s["time_all_tasks"])
        row["updates"], row["wall_s"] = s["updates"], s["wall_s"]
        rows.append(row)
    if rows and out.is_dir():
        write_table(rows, out / "table.json")
    from fedforge.study.plots import load_run_list, plot_runs  # noqa: PLC0415 (matplotlib)
    plot = plot_runs(load_run_list([out / name for name in configs]), out / "accuracy.png",
                     x="sim_time_s")
    return rows, plot


def gain(t_baseline: float | None, t_method: float | None) -> float | None:
    """FedAST's gain: ``(T_baseline - T_method) / T_baseline`` (None if either never finished)."""
    if t_baseline is None or t_method is None or t_baseline <= 0:
        return None
    return (t_baseline - t_method) / t_baseline


def compare_command(config: Path, algorithms: str, overrides: list[str], out: Path, *,
                    seeds: str | None, target: float | None, metric: str | None, paired: str,
                    progress: bool, overwrite: bool) -> tuple[list[dict], str]:
    """``fedforge compare``: the comparison of the ``--algorithms`` (in a multi-task file,
    of its methods) -> the table's rows and the line naming what was written. A bad option
    is a ``ValueError`` naming it."""
    names = [a.strip() for a in algorithms.split(",") if a.strip()]
    if not names:
        raise ValueError("--algorithms: expected a comma-separated list, e.g. fedavg,scaffold")
    methods = method_configs(config, names, overrides)
    if methods is not None:  # a multi-task file: --algorithms names methods
        rows, plot = run_multitask_comparison(methods, out, progress=progress,
                                              overwrite=overwrite, allow_processes=True)
        return rows, f"plot: {plot}"
    cfgs = comparison_configs(config, names, overrides, parse_seeds(seeds))
    rows, plot = run_comparison(cfgs, out, target=target, progress=progress,
                                overwrite=overwrite, allow_processes=True, metric=metric,
                                paired=paired)
    return rows, f"plot: {plot} (and .pdf); table: {out / 'table.json'} (and .csv)"


def printed_table(rows: list[dict], out: Path) -> tuple[str, list[str], list[list[str]]]:
    """The comparison as the command prints it: title, columns (each metric described) and
    cells (mean ± half the 95 % interval over the seeds)."""
    columns = [col if col in ("algorithm", "method", "seeds") else metric_label(col).described
               for col in rows[0]]
    return (f"comparison ({out}); mean ± half the 95 % interval over seeds", columns,
            [[format_cell(v, row.get("seeds")) for v in row.values()] for row in rows])
