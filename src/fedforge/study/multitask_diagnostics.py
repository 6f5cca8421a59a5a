"""Where a multi-task run's time went: requests per task, time to target, idle clients.

Reads a run folder's ``metrics.jsonl`` (each async evaluation carries ``requests`` and
``in_flight``, one entry per task) and ``events.jsonl`` (every applied update with its
``start`` and ``finish``). Used by ``fedforge reproduce fedast`` and usable on any run.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from fedforge.experiment.rundir import save_figure
from fedforge.study.styles import wrap_to_width


def task_names(records: Sequence[dict]) -> list[str]:
    """Task names in task-index order, from the records that name them."""
    names: dict[int, str] = {}
    for r in records:
        if "task" in r:
            names.setdefault(int(r.get("task_index", len(names))), r["task"])
    return [names[k] for k in sorted(names)]


def time_to_target(records: Sequence[dict], targets: Mapping[str, float | None],
                   key: str = "test_accuracy") -> dict[str, float | None]:
    """Per task: the simulated time of its first evaluation with ``key >= target`` (None if
    never or no target)."""
    out: dict[str, float | None] = {name: None for name in targets}
    for r in records:
        name, target = r.get("task"), targets.get(r.get("task", ""))
        if target is not None and out.get(name) is None and r.get(key, -1.0) >= target:
            out[name] = float(r["sim_time_s"])
    return out


def requests_over_time(records: Sequence[dict],
                       key: str = "requests") -> dict[str, tuple[list[float], list[int]]]:
    """Per task: (simulated times, its ``R_m`` (or ``in_flight``) at each evaluation)."""
    names = task_names(records)
    out: dict[str, tuple[list[float], list[int]]] = {n: ([], []) for n in names}
    for r in records:
        if key in r:
            for name, value in zip(names, r[key]):
                out[name][0].append(float(r["sim_time_s"]))
                out[name][1].append(int(value))
    return out


def idle_share(events: Iterable[dict], capacity: int, t_end: float) -> float:
    """``1 - (client time spent on applied updates) / (capacity * t_end)``.

    ``capacity`` is the number of clients that may work at once (``max_busy``). Time spent
    on updates that were never applied (a synchronous round's discarded stragglers, a
    finished task's cancelled requests) counts as idle: it moved no model."""
    if capacity < 1 or t_end <= 0:
        raise ValueError(f"idle_share: capacity and t_end must be > 0, got {capacity}, {t_end}")
    busy = sum(max(0.0, min(e["finish"], t_end) - e["start"]) for e in events)
    return 1.0 - busy / (capacity * t_end)


def read_jsonl(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()
            if line.strip()]


def run_diagnostics(run_dir: Path, capacity: int) -> dict:
    """``summary.json`` plus ``idle_share`` (from ``events.jsonl``) of one finished run."""
    summary = json.loads((run_dir / "summary.json").read_text(encoding="utf-8"))
    t_end = float(summary.get("sim_time_s") or 0.0)
    events = read_jsonl(run_dir / "events.jsonl")
    summary["idle_share"] = idle_share(events, capacity, t_end) if t_end > 0 else None
    return summary


def plot_requests(records: Sequence[dict], path: Path, title: str = "",
                  key: str = "requests") -> Path:
    """Step plot of each task's ``R_m`` (or ``in_flight``) against simulated time."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt


    fig, ax = plt.subplots(figsize=(6.5, 3.6))
    for name, (xs, ys) in requests_over_time(records, key).items():
        if xs:
            ax.step(xs, ys, where="post", label=name)
    ax.set_xlabel("simulated time (s)")
    ax.set_ylabel(f"{key} per task")
    if title:  # wrapped to the figure's width: a long title is never clipped
        ax.set_title(wrap_to_width(fig, title, 0.95 * fig.bbox.width, fontsize=9), fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        return save_figure(path.parent, path.name, fig, dpi=100)  # the run folder's writer
    finally:
        plt.close(fig)
