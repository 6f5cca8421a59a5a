"""``fedforge compare``: several algorithms, identical data, partition and seed."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from fedforge.experiment.config import (
    ConfigError,
    RunConfig,
    apply_overrides,
    load_raw,
    validate,
)
from fedforge.experiment.plots import plot_metric
from fedforge.experiment.runner import run_experiment


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
    for rec in history:
        if rec.get(key, float("-inf")) >= target:
            return rec
    return None


def comparison_configs(
    path: str | Path, names: list[str], overrides: list[str] | None = None,
    seeds: list[int] | None = None,
) -> dict[str, list[RunConfig]]:
    """One config per (algorithm, seed): the file, then its ``[compare.<name>]`` table merged
    in (per-algorithm hyper-parameters, e.g. the paper's learning rates), then
    ``algorithm.name``, the command-line ``overrides`` and ``seed`` (default: the file's)."""
    raw = load_raw(path)
    tables = raw.pop("compare", {}) or {}
    if not isinstance(tables, dict):
        raise ConfigError("compare: expected a table of per-algorithm tables")
    out: dict[str, list[RunConfig]] = {}
    for name in names:
        table = tables.get(name, {})
        if not isinstance(table, dict):
            raise ConfigError(f"compare.{name}: expected a table of config sections")
        merged = apply_overrides(_merge(raw, table), [f"algorithm.name={name}",
                                                      *(overrides or [])])
        base = validate(merged)
        out[name] = [base] if seeds is None else [
            base.model_copy(update={"seed": s}) for s in seeds]
    return out


def _merge(base: dict, extra: dict) -> dict:
    """Recursive dict merge (``extra`` wins); neither input is modified."""
    out = dict(base)
    for k, v in extra.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def run_comparison(
    configs: dict[str, RunConfig | list[RunConfig]], out: Path, *, target: float | None = None,
    progress: bool = True, overwrite: bool = False,
) -> tuple[list[dict], Path]:
    """Run each config (or each seed's config) into ``out/<name>`` (``out/<name>/seed<s>`` for
    several seeds); -> (table rows, accuracy-vs-round PNG). With ``target`` the table gives
    rounds and simulated minutes to reach it: mean ± std over the seeds that reached it, with
    ``(k/m)`` when only k of m seeds did. A run already in its folder is resumed (a finished
    one returns its metrics; a changed config is refused) unless ``overwrite``."""
    runs, rows = {}, []
    for name, cfgs in configs.items():
        cfgs = [cfgs] if isinstance(cfgs, RunConfig) else list(cfgs)
        hists = [run_experiment(c, out / name if len(cfgs) == 1 else out / name / f"seed{c.seed}",
                                progress=progress, resume=not overwrite, overwrite=overwrite)
                 for c in cfgs]
        runs[name] = hists[0]
        row = {"algorithm": name, "seeds": len(hists),
               "final_acc": _mean_std([h[-1]["test_accuracy"] for h in hists], "{:.4f}"),
               "best_acc": _mean_std([max(r["test_accuracy"] for r in h) for h in hists],
                                     "{:.4f}"),
               "final_loss": _mean_std([h[-1]["test_loss"] for h in hists], "{:.4f}")}
        sims = [h[-1]["sim_time_s"] / h[-1]["round"] for h in hists if "sim_time_s" in h[-1]]
        if sims:
            row["sim_s_per_round"] = f"{np.mean(sims):.3g}"
        if target is not None:
            n = len(hists)
            reached = [rounds_to_target(h, target) for h in hists]
            row[f"rounds_to_{target:g}"] = _reached([r for r in reached if r is not None], n,
                                                    "{:.1f}")
            mins = [t / 60 for h in hists if (t := sim_time_to_target(h, target)) is not None]
            row[f"sim_min_to_{target:g}"] = _reached(mins, n, "{:.3g}")
        row["wall_s"] = f"{sum(h[-1]['wall_s'] for h in hists):.1f}"
        rows.append(row)
    if len(rows) and out.is_dir():
        (out / "table.json").write_text(json.dumps(rows, indent=1) + "\n", encoding="utf-8")
    if any("sim_time_s" in r for h in runs.values() for r in h):
        plot_metric(runs, out / "accuracy_vs_sim_time.png", x="sim_time_s",
                    title="test accuracy vs simulated time (s)")
    plot = plot_metric(runs, out / "accuracy.png", title="test accuracy vs round")
    return rows, plot


def _mean_std(values: list[float], fmt: str) -> str:
    if len(values) == 1:
        return fmt.format(values[0])
    return f"{fmt.format(np.mean(values))}±{fmt.format(np.std(values, ddof=1))}"


def _reached(values: list[float], n: int, fmt: str) -> str:
    """``mean±std`` over the seeds that reached the target, ``(k/n)`` if not all did."""
    if not values:
        return "not reached"
    text = _mean_std(values, fmt)
    return text if len(values) == n else f"{text} ({len(values)}/{n})"


def run_multitask_comparison(
    configs: dict, out: Path, *, progress: bool = True, baseline: str = "sync_st",
    overwrite: bool = False,
) -> tuple[list[dict], Path]:
    """Multi-task methods on identical tasks and seed: time to target per task, time to
    finish all tasks, and FedAST's gain ``(T_baseline - T)/T_baseline`` against ``baseline``.
    Runs already in ``out`` are resumed unless ``overwrite`` (as in :func:`run_comparison`)."""
    import json

    from fedforge.experiment.async_runner import gain, run_multitask

    runs, summaries = {}, {}
    for name, cfg in configs.items():
        runs[name] = run_multitask(cfg, out / name, progress=progress, resume=not overwrite,
                                   overwrite=overwrite)
        summaries[name] = json.loads((out / name / "summary.json").read_text())
    t_base = summaries.get(baseline, {}).get("time_all_tasks")
    rows = []
    for name, s in summaries.items():
        row = {"method": name}
        row.update({f"T_{k}": _fmt(v) for k, v in s["time_to_target"].items()})
        row["T_all"] = _fmt(s["time_all_tasks"])
        g = gain(t_base, s["time_all_tasks"])
        row[f"gain_vs_{baseline}"] = "-" if g is None else f"{100 * g:.1f}%"
        row["updates"], row["wall_s"] = s["updates"], f"{s['wall_s']:.1f}"
        rows.append(row)
    plot = plot_metric(runs, out / "accuracy.png", x="sim_time_s",
                       title="test accuracy vs simulated time")
    return rows, plot


def _fmt(v: float | None) -> str:
    return "not reached" if v is None else f"{v:.1f}"
