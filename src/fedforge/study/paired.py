"""Paired differences between methods: by seed, or by client within a seed.

Methods of one comparison share each seed's partition and cohort draws, so a method's
final score minus the reference's, seed by seed, is a paired sample; with one seed, the
clients are the pairs: client i's accuracy under the method minus under the reference, from
the per-client files (:mod:`fedforge.experiment.client_metrics`), pairs ``(seed, client)``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from fedforge.experiment.client_metrics import column_of, last_round, load_client_metrics
from fedforge.experiment.metrics import evaluated
from fedforge.study.stats import Interval, paired_difference

PAIRINGS = ("auto", "seed", "client")


def seed_scores(hists: list[list[dict]], key: str) -> list[float] | None:
    """Each seed's final ``key`` (None if a run never recorded it)."""
    lasts = [next((r for r in reversed(evaluated(h)) if key in r), None) for h in hists]
    return None if any(r is None for r in lasts) else [float(r[key]) for r in lasts]


def client_scores(dirs: list[Path], key: str) -> dict[tuple[int, int], float] | None:
    """``(seed index, client) -> its last evaluated accuracy`` in the column ``key`` is taken
    over, from each run folder's per-client file (None: a run has none, or ``key`` is not
    a per-client metric such as the pooled test accuracy)."""
    column = column_of(key)
    if column is None:
        return None
    out: dict[tuple[int, int], float] = {}
    for s, d in enumerate(dirs):
        cols = load_client_metrics(d)
        if cols is None:
            return None
        rows = last_round(cols, held_out=key.startswith("held_out_"))
        out.update({(s, int(c)): float(v) for c, v in zip(rows["client"], rows[column])})
    return out


def choose_pairing(asked: str, seeds: int, has_clients: bool) -> str | None:
    """What ``auto`` pairs by: seeds when there are several, else clients where the
    per-client files allow; an explicit choice stays (None: nothing to pair)."""
    if asked not in PAIRINGS:
        raise ValueError(f"--paired: expected one of {', '.join(PAIRINGS)}, got {asked!r}")
    if asked == "auto":
        return "seed" if seeds >= 2 else "client" if has_clients else None
    if asked == "client" and not has_clients:
        raise ValueError("--paired client: needs per-client results (client_metrics.npz, "
                         "written by the personalised evaluation) of a per-client metric")
    return asked


def difference(method: dict, reference: dict) -> Interval | None:
    """The paired t-interval of ``method - reference`` over their common pairs (keys)."""
    common = [k for k in reference if k in method]
    if not common:
        return None
    return paired_difference([method[k] for k in common], [reference[k] for k in common])


def as_pairs(values: list[float] | dict | None) -> dict | None:
    if values is None or isinstance(values, dict):
        return values
    return dict(enumerate(values))


def interval_cell(iv: Interval | None) -> dict | None:
    """A :func:`fedforge.study.compare.summary`-shaped cell of a paired difference."""
    if iv is None or iv.n == 0:
        return None
    two = iv.n >= 2 and not np.isnan(iv.half)
    return {"mean": iv.mean, "std": iv.sd if two else None, "n": iv.n,
            "ci_low": iv.low if two else None, "ci_high": iv.high if two else None}
