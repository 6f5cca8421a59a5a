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
