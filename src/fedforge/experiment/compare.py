"""``fedforge compare``: several algorithms, identical data, partition and seed."""

from __future__ import annotations

from pathlib import Path

from fedforge.experiment.config import RunConfig
from fedforge.experiment.plots import plot_metric
from fedforge.experiment.runner import run_experiment


def rounds_to_target(history: list[dict], target: float, key: str = "test_accuracy") -> int | None:
    """First evaluated round whose ``key`` reaches ``target`` (None if never)."""
    for rec in history:
        if rec.get(key, float("-inf")) >= target:
            return rec["round"]
    return None


def run_comparison(
    configs: dict[str, RunConfig], out: Path, *, target: float | None = None, progress: bool = True
) -> tuple[list[dict], Path]:
    """Run each config into ``out/<name>``; -> (table rows, accuracy-vs-round PNG)."""
    runs, rows = {}, []
    for name, cfg in configs.items():
        history = run_experiment(cfg, out / name, progress=progress)
        runs[name] = history
        last = history[-1]
        best = max(r["test_accuracy"] for r in history)
        row = {"algorithm": name, "final_acc": f"{last['test_accuracy']:.4f}",
               "best_acc": f"{best:.4f}", "final_loss": f"{last['test_loss']:.4f}",
               "wall_s": f"{last['wall_s']:.1f}"}
        if target is not None:
            row[f"rounds_to_{target:g}"] = rounds_to_target(history, target)
        rows.append(row)
    plot = plot_metric(runs, out / "accuracy.png", title="test accuracy vs round")
    return rows, plot


def run_multitask_comparison(
    configs: dict, out: Path, *, progress: bool = True, baseline: str = "sync_st"
) -> tuple[list[dict], Path]:
    """Multi-task methods on identical tasks and seed: time to target per task, time to
    finish all tasks, and FedAST's gain ``(T_baseline - T)/T_baseline`` against ``baseline``."""
    import json

    from fedforge.experiment.async_runner import gain, run_multitask

    runs, summaries = {}, {}
    for name, cfg in configs.items():
        runs[name] = run_multitask(cfg, out / name, progress=progress)
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
