"""Memory stays flat over many rounds: RSS growth after warm-up is bounded.

The run is the embedded LEAF Synthetic dataset with SCAFFOLD (per-client state in the store),
evaluation every 5 rounds and a checkpoint every 10, so every part of the loop that could
accumulate (metrics history, checkpoints, client store, compiled vmap functions, the
robust-aggregation path) is exercised. RSS is read from ``/proc/self/statm`` at every round.
Bound: after a 50-round warm-up, RSS may grow by at most ``BOUND_MB`` (allocator noise is a
few MB; a leak of one model copy per round would be tens of MB over 500 rounds, and a leak of
one cohort's deltas per round hundreds).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import fedforge.experiment.drivers as drivers
import fedforge.experiment.runner as runner
from fedforge.experiment.config import apply_overrides, validate
from fedforge.experiment.metrics import evaluated

STATM = Path("/proc/self/statm")
BOUND_MB = 16.0
BASE = {
    "seed": 0,
    "data": {"dataset": "synthetic", "partition": "natural",
             "options": {"num_clients": 30, "alpha": 1.0, "beta": 1.0}},
    "model": {"name": "mlp", "options": {"hidden": [32]}},
    "algorithm": {"name": "scaffold", "local_lr": 0.02},
    "client": {"batch_size": 10, "local_steps": 2},
    "server": {"clients_per_round": 10, "aggregator": "median"},
    "eval": {"every": 5, "per_client": False},
    "checkpoint": {"every": 10, "keep": 2},
}


def _rss_mb() -> float:
    return int(STATM.read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _soak(tmp_path, monkeypatch, rounds: int, warmup: int = 50) -> list[float]:
    samples: list[float] = []
    original = drivers.federated_round

    def measured(*args, **kwargs):
        out = original(*args, **kwargs)
        samples.append(_rss_mb())
        return out

    monkeypatch.setattr(drivers, "federated_round", measured)
    cfg = validate(apply_overrides(BASE, [f"rounds={rounds}"]))
    history = runner.run_experiment(cfg, tmp_path / "soak", progress=False)
    assert len(history) == len(samples) == rounds  # one record per round
    assert len(evaluated(history)) == rounds // 5
    growth = max(samples[warmup:]) - samples[warmup]
    assert growth < BOUND_MB, f"RSS grew {growth:.1f} MB from round {warmup} to {rounds}"
    return samples


@pytest.mark.skipif(not STATM.is_file(), reason="needs /proc/self/statm (Linux)")
def test_rss_flat_short(tmp_path, monkeypatch):
    """CI variant: 120 rounds."""
    _soak(tmp_path, monkeypatch, rounds=120)


@pytest.mark.slow
@pytest.mark.skipif(not STATM.is_file(), reason="needs /proc/self/statm (Linux)")
def test_rss_flat_500_rounds(tmp_path, monkeypatch):
    _soak(tmp_path, monkeypatch, rounds=500)
