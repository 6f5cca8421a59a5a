"""Accuracy against ε: the privacy-utility table and figure of a grid of private runs."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path

from fedforge.experiment.metrics import evaluated
from fedforge.experiment.rundir import save_figure


def final_record(run_dir: str | Path) -> dict:
    """The last evaluated record of a run's ``metrics.jsonl`` (it carries ``dp_epsilon``)."""
    path = Path(run_dir) / "metrics.jsonl"
    records = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    evals = evaluated(records)
    if not evals:
        raise ValueError(f"{path}: no evaluated records")
    return evals[-1]


def accuracy_table(runs: Mapping[float, Sequence[str | Path]], metric: str = "test_accuracy"
                   ) -> list[dict]:
    """One row per target ε (``math.inf`` = no privacy): mean and sample std of the final
    ``metric`` over the seeds' run folders, and the ε the accountant reported at the end."""
    rows = []
    for target, dirs in sorted(runs.items()):
        recs = [final_record(d) for d in dirs]
        vals = [float(r[metric]) for r in recs]
        mean = sum(vals) / len(vals)
        std = (math.sqrt(sum((v - mean) ** 2 for v in vals) / (len(vals) - 1))
               if len(vals) > 1 else 0.0)
        spent = [r.get("dp_epsilon", math.inf) for r in recs]
        rows.append({"target_epsilon": target, "epsilon": max(spent), metric: mean,
                     f"{metric}_std": std, "seeds": len(vals),
                     "round": min(int(r["round"]) for r in recs)})
    return rows


def table_markdown(rows: list[dict], metric: str = "test_accuracy") -> str:
    out = ["| target ε | ε spent | rounds | " + metric + " (mean ± std) | seeds |",
           "|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r['target_epsilon']:g} | {r['epsilon']:.3g} | {r['round']} | "
                   f"{r[metric]:.4f} ± {r[metric + '_std']:.4f} | {r['seeds']} |")
    return "\n".join(out) + "\n"


def plot_accuracy_vs_epsilon(rows: list[dict], path: str | Path,
                             metric: str = "test_accuracy") -> Path:
    """Error-bar plot of ``metric`` against ε (log axis; the non-private runs as a line)."""
    import matplotlib  # noqa: PLC0415
    import matplotlib.ticker  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    fig, ax = plt.subplots(figsize=(4.5, 3.2))
    private = [r for r in rows if math.isfinite(r["target_epsilon"])]
    ax.errorbar([r["epsilon"] for r in private], [r[metric] for r in private],
                yerr=[r[f"{metric}_std"] for r in private], marker="o", capsize=3,
                label="central DP")
    for r in rows:
        if not math.isfinite(r["target_epsilon"]):
            ax.axhline(r[metric], color="gray", ls="--", label="no privacy (ε = ∞)")
    ax.set_xscale("log")
    eps = [r["epsilon"] for r in private]
    ax.set_xticks(eps, [f"{e:.3g}" for e in eps])  # the spent ε, not log-axis minor labels
    ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.set_xlabel("ε (δ = 1e-5)")
    ax.set_ylabel(metric.replace("_", " "))
    ax.legend(loc="best")  # framed: a legend over an error bar must not blend into it
    fig.tight_layout()
    path = Path(path)
    try:
        return save_figure(path.parent, path.name, fig, dpi=150)  # the run folder's writer
    finally:
        plt.close(fig)
