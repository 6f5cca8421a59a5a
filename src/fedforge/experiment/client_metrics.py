"""Per-client results as data: ``client_metrics.npz`` beside ``metrics.jsonl``.

Each evaluated round of the personalised protocol adds one row per client: ``round``,
``client``, ``held_out``, ``samples`` (its held-out test samples), and the accuracy and mean
cross-entropy of its personalised model (``personal_accuracy``, ``personal_loss``) and of the
global model (``global_accuracy``, ``global_loss``) on them; a clustered method (IFCA, CFL)
adds ``cluster``, each client's cluster at that round (-1: none yet, and held-out clients);
FedProto adds ``prototype_accuracy``, its personal model's accuracy by the nearest global
prototype; next-token data adds ``personal_perplexity`` and ``global_perplexity`` (exp of the
mean token NLL, the loss columns' token accuracy and NLL being over scored tokens).
The file is columnar (one numpy
array per column, ``numpy.load`` reads it) and rewritten whole, atomically, at each
evaluated round by the run's log writer, which on resume keeps the rows of the rounds the
log keeps. ``metrics.jsonl``'s ``personal_accuracy_mean``, ``_p10`` and ``_worst`` are these
rows' summaries (clients with test samples).
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np

from fedforge.experiment.rundir import write_bytes

FILE = "client_metrics.npz"
COLUMNS = ("round", "client", "held_out", "samples", "personal_accuracy", "personal_loss",
           "global_accuracy", "global_loss")
OPTIONAL = ("cluster", "prototype_accuracy", "personal_perplexity", "global_perplexity")
"""Columns only some runs have: a clustered method's cluster of each client (-1: none),
FedProto's nearest-prototype accuracy, next-token data's perplexities (exp of the loss)."""


class ClientColumns(dict):
    """One evaluation's per-client columns (name -> numpy array), as a record carries them
    until the log writer moves them out; two are equal when every column is
    (``numpy.array_equal``, NaN equal to NaN), so records compare as plain numbers do."""

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, dict) or set(self) != set(other):
            return False
        return all(np.array_equal(self[k], other[k], equal_nan=self[k].dtype.kind == "f")
                   for k in self)

    __hash__ = None  # mutable, as a dict


class ClientMetricsFile:
    """The rows written so far, kept in memory and rewritten at each :meth:`append`.

    Args:
      path: the file (in the run folder).
      keep_rounds: rounds whose rows an existing file keeps (a resumed run); None: start
        empty (the file, if any, is removed)."""

    def __init__(self, path: Path, keep_rounds: set[int] | None = None) -> None:
        self.path = path
        self.columns: dict[str, list[np.ndarray]] = {k: [] for k in COLUMNS}
        if keep_rounds and path.is_file():
            old = read_columns(path)
            kept = np.isin(old["round"], sorted(keep_rounds))
            for k in (*COLUMNS, *(k for k in OPTIONAL if k in old)):
                self.columns.setdefault(k, []).append(old[k][kept])
            self._write()
        elif path.is_file() and not path.is_symlink():
            path.unlink()

    def append(self, round_: int, columns: dict[str, np.ndarray]) -> None:
        """Add one evaluated round's rows (``columns``: every column but ``round``)."""
        missing = sorted(set(COLUMNS) - {"round"} - set(columns))
        if missing:
            raise ValueError(f"{self.path.name}: round {round_} lacks columns {missing}")
        n = len(columns["client"])
        self.columns["round"].append(np.full(n, round_, dtype=np.int64))
        for k in (*COLUMNS[1:], *(k for k in OPTIONAL if k in columns)):
            self.columns.setdefault(k, []).append(np.asarray(columns[k]))
        self._write()

    def _write(self) -> None:

        buf = io.BytesIO()
        np.savez(buf, **{k: np.concatenate(v) if v else np.zeros(0) for k, v in
                         self.columns.items()})
        write_bytes(self.path.parent, self.path.name, buf.getvalue())


def read_columns(path: Path) -> dict[str, np.ndarray]:
    """The columns of a ``client_metrics.npz`` (ValueError naming the file if damaged)."""
    try:
        with np.load(path, allow_pickle=False) as f:
            got = {k: f[k] for k in f.files}
    except (OSError, ValueError, EOFError) as exc:
        raise ValueError(f"{path}: not a readable per-client file ({exc})") from None
    missing = [k for k in COLUMNS if k not in got]
    if missing or len({len(v) for v in got.values()}) > 1:
        raise ValueError(f"{path}: expected equally long columns {', '.join(COLUMNS)}")
    return got


def load_client_metrics(run_dir: str | Path) -> dict[str, np.ndarray] | None:
    """A run folder's per-client columns, or None for a run without them."""
    path = Path(run_dir) / FILE
    return read_columns(path) if path.is_file() else None


def last_round(columns: dict[str, np.ndarray], held_out: bool = False
               ) -> dict[str, np.ndarray]:
    """The rows of the last evaluated round (of the clients that train, or of the held-out
    ones), clients without test samples left out, as the summaries leave them out."""
    if not len(columns["round"]):
        return {k: v[:0] for k, v in columns.items()}
    rows = ((columns["round"] == columns["round"].max()) & (columns["held_out"] == held_out)
            & (columns["samples"] > 0))
    return {k: v[rows] for k, v in columns.items()}


def column_of(metric_key: str) -> str | None:
    """The per-client column a summary metric is taken over (``personal_accuracy_mean`` ->
    ``personal_accuracy``); None for a metric without per-client rows (the pooled test set)."""
    key = metric_key.removeprefix("held_out_")
    for column in ("personal_accuracy", "global_accuracy"):
        if key.startswith(column + "_"):
            return column
    return None


def worst_share_mean(values: np.ndarray, share: float = 0.1) -> float:
    """The mean of the worst ``share`` of ``values`` (at least one value)."""
    if not len(values):
        return float("nan")
    k = max(1, int(np.ceil(share * len(values))))
    return float(np.sort(values)[:k].mean())
