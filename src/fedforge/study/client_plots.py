"""The per-client distribution of a comparison: an ECDF per method and its worst clients.

Drawn from each run's ``client_metrics.npz`` (:mod:`fedforge.experiment.client_metrics`) at
its last evaluated round, on the per-client column the ranked metric is taken over (the
personalised model's accuracy for ``personal_accuracy_*``, the global model's for
``global_accuracy_*``). A method's seeds are pooled: each (seed, client) is one point.
"""

from __future__ import annotations

from dataclasses import dataclass

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure

from fedforge.experiment.client_metrics import (
    column_of,
    last_round,
    load_client_metrics,
    worst_share_mean,
)
from fedforge.study.labels import metric
from fedforge.study.plots import (
    Run,
    _method_key,
    group_runs,
    place_legend,
    plain_text,
    set_title,
)
from fedforge.study.styles import styles_for


@dataclass
class ClientSpread:
    """One method's per-client values (seeds pooled) and what they summarise to."""

    method: str
    values: np.ndarray
    seeds: int

    def summary(self) -> dict[str, float]:
        v = self.values
        return {"clients": float(len(v)), "mean": float(v.mean()),
                "p10": float(np.percentile(v, 10)), "worst": float(v.min()),
                "worst10_mean": worst_share_mean(v, 0.1)}


def per_client_column(main: str) -> str:
    """The per-client column drawn for the ranked metric ``main`` (the personalised
    model's accuracy for a metric without per-client rows, such as the pooled test one)."""
    return column_of(main) or "personal_accuracy"


def client_spreads(runs: list[Run], column: str, held_out: bool = False
                   ) -> list[ClientSpread]:
    """Each method's last-round ``column`` over its clients, for the methods whose runs
    all have per-client files (in the runs' order)."""
    out = []
    for label, group in group_runs(runs).items():
        found = [load_client_metrics(r.path) for r in group]
        if any(f is None for f in found):
            continue
        values = np.concatenate([last_round(f, held_out)[column] for f in found])
        if len(values):
            out.append(ClientSpread(_method_key(label), values, len(group)))
    return out


def ecdf_figure(spreads: list[ClientSpread], column: str, title: str | None) -> Figure:
    """Share of clients at or below each value, one step line per method in its colours;
    the legend placed where it hides no line."""
    fig, ax = plt.subplots(figsize=(6.4, 4.2), dpi=150, layout="constrained")
    styles = styles_for(s.method for s in spreads)
    for s in spreads:
        v = np.sort(s.values)
        y = np.arange(1, len(v) + 1) / len(v)
        style = styles[s.method]
        pooled = f" ({s.seeds} seeds pooled)" if s.seeds > 1 else ""
        ax.step(np.concatenate([[v[0]], v]), np.concatenate([[0.0], y]), where="post",
                color=style.color, linestyle=style.linestyle, linewidth=1.5,
                label=plain_text(f"{s.method}{pooled}"), zorder=3)
        worst = max(1, int(np.ceil(0.1 * len(v))))  # the worst 10 %, marked
        ax.plot(v[:worst], y[:worst], linestyle="none", marker=style.marker, markersize=4,
                color=style.color, zorder=4)
    described = metric(column)
    low, high = described.bounds or (None, None)
    if low is not None and high is not None:  # a margin: steps at the bounds stay visible
        pad = 0.02 * (high - low)
        ax.set_xlim(low - pad, high + pad)
    ax.set_ylim(0.0, 1.0)
    ax.axhline(0.1, color="0.6", linewidth=0.8, linestyle=":", zorder=1)
    ax.set_xlabel(plain_text(described.label if described.source is None
                             else f"{described.label}\n{described.source}"))
    ax.set_ylabel("share of clients at or below")
    ax.grid(alpha=0.3)
    set_title(fig, title, note="per client, last evaluated round; markers: the worst 10 %")
    if spreads:
        place_legend(fig, ax, "best")
    return fig
