"""Plots of metrics.jsonl files (matplotlib, Agg backend: works headless)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

logger = logging.getLogger(__name__)


def load_runs(run_dirs: list[Path]) -> dict[str, list[dict]]:
    """``metrics.jsonl`` of each run directory, keyed by the directory's name.

    A half-written last line (a run still writing, or killed mid-write) is skipped with a
    warning; any other line that is not a JSON record is a ``ValueError`` naming the line.
    """
    runs = {}
    for d in run_dirs:
        path = Path(d) / "metrics.jsonl"
        if not path.is_file():
            raise FileNotFoundError(f"{path}: no metrics file (is {d} a fedforge run directory?)")
        runs[Path(d).name] = read_metrics(path)
    return runs


def read_metrics(path: Path) -> list[dict]:
    lines = path.read_bytes().decode("utf-8", errors="replace").splitlines()
    numbered = [(i, x) for i, x in enumerate(lines, 1) if x.strip()]
    records = []
    for i, line in numbered:
        try:
            rec = json.loads(line)
        except ValueError:
            rec = None
        if isinstance(rec, dict):
            records.append(rec)
        elif i == numbered[-1][0]:
            logger.warning("%s: skipping the incomplete last line %d (run still writing?)",
                           path, i)
        else:
            raise ValueError(f"{path}: line {i} is not a JSON record; the file is damaged")
    return records


def metric_keys(runs: dict[str, list[dict]]) -> list[str]:
    """Every numeric metric some record of ``runs`` has (what ``plot_metric`` can draw)."""
    return sorted({k for recs in runs.values() for r in recs for k, v in r.items()
                   if _number(v)})


def plot_metric(
    runs: dict[str, list[dict]], out: Path, y: str = "test_accuracy", x: str = "round",
    title: str | None = None, logx: bool = False,
) -> Path:
    """One curve per run of ``y`` against ``x``; writes a PNG and returns its path.

    ``x="bytes_up", logx=True``: accuracy against cumulative uplink bytes. A metric no
    record has is a ``ValueError`` listing the available ones (no empty plot is written)."""
    if x == "round" and any("task" in r for recs in runs.values() for r in recs):
        x = "sim_time_s"  # multi-task runs: rounds differ per task, the clock is shared
    keys = metric_keys(runs)
    for name, value in (("metric", y), ("x", x)):
        if value not in keys:
            raise ValueError(f"{name} {value!r}: not in the metrics files; available: "
                             f"{', '.join(keys) or 'none (no records)'}")
    fig, ax = plt.subplots(figsize=(6, 4), dpi=120)
    for label, recs in _split_tasks(runs).items():
        pts = [(r[x], r[y]) for r in recs if _number(r.get(x)) and _number(r.get(y))]
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


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
