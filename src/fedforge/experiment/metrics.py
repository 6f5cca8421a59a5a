"""JSON-lines logs (``metrics.jsonl``, ``events.jsonl``): whole lines, flushed and fsynced.

Every run writes its logs through :class:`MetricsWriter`, so a killed run leaves at most one
torn last line, and a resumed run first truncates the log to what its checkpoint covers, so
the file never holds a round (or an event) twice.

A synchronous run records every round; only evaluated rounds carry the test metrics, so
readers that want evaluations go through :func:`evaluated`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from fedforge.experiment.client_metrics import ClientMetricsFile

if TYPE_CHECKING:
    from fedforge.experiment.config import RunConfig

TEST_METRIC = "test_accuracy"
"""The key every evaluation writes (fedforge.engine.evaluate): it marks evaluated records."""

PER_CLIENT = "per_client"
"""A record's per-client columns (fedforge.experiment.personal_eval), moved out of the log."""

Keep = Callable[[dict, int], bool]
"""``keep(record, kept_so_far)``: whether a resumed run keeps this record of the old log."""


class MetricsError(ValueError):
    """A log that a resumed run cannot read back (one line naming the file and line)."""


class MetricsWriter:
    """Appends records; on resume keeps only the records of rounds ``<= truncate_after``.

    Args:
      truncate_after: the last round the checkpoint covers (0: start an empty log).
      keep: another rule for what a resumed run keeps (e.g. ``updates <= c``, or the first
        ``n`` events); it replaces ``truncate_after``. Reading stops at a torn line.
      remember: keep written records in ``records`` too (off for long event logs; the records
        read back on resume are always there).
      clients: the per-client file of the records' :data:`PER_CLIENT` columns
        (:mod:`fedforge.experiment.client_metrics`; None: such columns are dropped). It keeps
        the rows of the rounds the log keeps.
    """

    def __init__(self, path: Path, truncate_after: int = 0, *, keep: Keep | None = None,
                 remember: bool = True, clients: Path | None = None) -> None:
        self.path = path
        self.remember = remember
        self.records: list[dict] = []
        self.clients: ClientMetricsFile | None = None
        if keep is None and truncate_after > 0:
            def keep(rec: dict, _: int) -> bool:
                return rec.get("round", 0) <= truncate_after
        if path.is_file() and keep is not None:
            for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError:
                    break  # a torn last line from a killed run
                if self._kept(rec, keep, number):
                    self.records.append(rec)
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_text("".join(json.dumps(r) + "\n" for r in self.records), encoding="utf-8")
        os.replace(tmp, path)
        if clients is not None:
            rounds = {r["round"] for r in self.records if "round" in r}
            self.clients = ClientMetricsFile(clients, rounds if keep is not None else None)

    def _kept(self, rec: object, keep: Keep, number: int) -> bool:
        """``keep(rec)`` for a well-formed record; MetricsError naming the line otherwise."""
        problem = None
        if not isinstance(rec, dict):
            problem = f"is a JSON {type(rec).__name__}, not an object"
        elif "round" in rec and type(rec["round"]) is not int:
            problem = f"has round {rec['round']!r}, not an integer"
        else:
            try:
                return bool(keep(rec, len(self.records)))
            except (KeyError, TypeError, ValueError) as exc:
                problem = f"cannot be read back ({type(exc).__name__}: {exc})"
        raise MetricsError(f"{self.path}: line {number} {problem}; fix or delete that line to "
                           "resume, or start again with --overwrite")

    def write(self, record: dict) -> None:
        self.write_many([record])

    def write_many(self, records: Iterable[dict]) -> None:
        """Append ``records`` as whole lines with one flush and fsync; their per-client
        columns (:data:`PER_CLIENT`) go to the per-client file first. The caller's records
        keep their columns (the progress line shows them); the log's lines and ``records``
        hold the rest."""
        given = list(records)
        if not given:
            return
        for record in given:
            columns = record.get(PER_CLIENT)
            if columns is not None and self.clients is not None:
                self.clients.append(record["round"], columns)
        records = [{k: v for k, v in r.items() if k != PER_CLIENT} for r in given]
        if self.remember:
            self.records.extend(records)
        with open(self.path, "a", encoding="utf-8") as f:
            f.write("".join(json.dumps(r) + "\n" for r in records))
            f.flush()
            os.fsync(f.fileno())


def is_evaluated(record: dict, key: str = TEST_METRIC) -> bool:
    """Whether ``record`` is of an evaluated round (it carries the test metric ``key``)."""
    return key in record


def evaluated(records: Iterable[dict], key: str = TEST_METRIC) -> list[dict]:
    """The records of evaluated rounds, in order.

    A synchronous run writes one record per round and adds the test metrics on evaluated
    rounds only; files written before every round was recorded, and multi-task runs, hold
    evaluations only, and come back whole."""
    return [r for r in records if is_evaluated(r, key)]


def run_summary(cfg: RunConfig, history: list[dict], out: Path) -> str | None:
    """What ``fedforge run`` prints after ``done``: the method and its last evaluation (a
    multi-task run: its ``summary.json``), or None where there is nothing to report (the
    ranks > 0 of a torchrun job write no summary and hold no evaluations)."""
    if cfg.multitask:
        summary = out / "summary.json"
        if not summary.is_file():
            return None
        return (f"{cfg.method_name} on {len(cfg.tasks)} tasks -> {out}\n"
                f"{summary.read_text()}")
    evals = evaluated(history)
    if not evals:
        return None
    last = evals[-1]
    return (f"{cfg.algorithm.name} on {cfg.data.dataset}: round {last.get('round')} "
            f"test_accuracy={last.get('test_accuracy', float('nan')):.4f} "
            f"test_loss={last.get('test_loss', float('nan')):.4f}{_privacy_note(last)}  -> "
            f"{out}")


def _privacy_note(record: dict) -> str:
    """`` ε=… σ=…`` for a differentially private run's record, else nothing."""
    if "dp_epsilon" not in record:
        return ""
    return (f" ε={record['dp_epsilon']:.3f} "
            f"σ={record.get('dp_noise_multiplier', float('nan')):.4g}")
