"""Plots of metrics.jsonl files (matplotlib, Agg backend: works headless)."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def load_runs(run_dirs: list[Path]) -> dict[str, list[dict]]:
    runs = {}
    for d in run_dirs:
        path = Path(d) / "metrics.jsonl"
        if not path.is_file():
            raise FileNotFoundError(f"{path}: no metrics file (is {d} a fedforge run directory?)")
        runs[Path(d).name] = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    return runs


def plot_metric(
    runs: dict[str, list[dict]], out: Path, y: str = "test_accuracy", x: str = "round",
    title: str | None = None, logx: bool = False,
) -> Path:
    """One curve per run of ``y`` against ``x``; writes a PNG and returns its path.

    ``x="bytes_up", logx=True``: accuracy against cumulative uplink bytes (issue 6)."""
    fig, ax = plt.subplots(figsize=(6, 4), dpi=120)
    if x == "round" and any("task" in r for recs in runs.values() for r in recs):
        x = "sim_time_s"  # multi-task runs: rounds differ per task, the clock is shared
    for label, recs in _split_tasks(runs).items():
        pts = [(r[x], r[y]) for r in recs if x in r and y in r]
        if pts:
            xs, ys = zip(*pts)
            ax.plot(xs, ys, label=label)
    if logx:
        ax.set_xscale("log")
    ax.set_xlabel(x)
    ax.set_ylabel(y)
    ax.grid(alpha=0.3)
    ax.legend()
    if title:
        ax.set_title(title)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    plt.close(fig)
    return out


def _split_tasks(runs: dict[str, list[dict]]) -> dict[str, list[dict]]:
    """Multi-task runs (records with ``task``) become one curve per task: ``run / task``."""
    out: dict[str, list[dict]] = {}
    for label, recs in runs.items():
        for r in recs:
            key = f"{label} / {r['task']}" if "task" in r else label
            out.setdefault(key, []).append(r)
    return out
