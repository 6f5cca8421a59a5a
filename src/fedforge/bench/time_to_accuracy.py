"""W3: wall time (and rounds) until a run first reaches a test-accuracy target.

Runs an ordinary ``fedforge run`` config (FedAvg + CNN on FEMNIST by default) and reads
its ``metrics.jsonl``: the first evaluation at or above the target gives the round and the
wall time, so the number includes data loading, evaluation and checkpoints, as a user sees it.
"""

from __future__ import annotations

from pathlib import Path

from fedforge.experiment.config import load_config
from fedforge.experiment.metrics import evaluated
from fedforge.experiment.runner import run_experiment


def first_reaching(history: list[dict], target: float) -> dict | None:
    """The first evaluated record with ``test_accuracy >= target`` (None if never)."""
    return next((r for r in evaluated(history) if r["test_accuracy"] >= target), None)


def run_w3(config: str | Path, out: str | Path, target: float = 0.8,
           overrides: list[str] | None = None) -> list[object]:
    """Row ``[config, target, round reached, wall s to target, final accuracy, total wall s]``."""
    cfg = load_config(config, overrides or [])
    history = run_experiment(cfg, out, progress=False, overwrite=True)
    hit = first_reaching(history, target)
    return [Path(config).name, target, hit and hit["round"], hit and hit["wall_s"],
            evaluated(history)[-1]["test_accuracy"], history[-1]["wall_s"]]
