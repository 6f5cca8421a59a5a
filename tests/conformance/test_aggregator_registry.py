"""Conformance over every registered robust aggregator (a new one is covered without editing
this file): under a sign-flip attack, a run stopped after round 1 and resumed equals an
uninterrupted run bit for bit; float64 deltas give a float64 aggregate; a cohort smaller than
the rule's bound is refused in one line when the run is built."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from fedforge.experiment.config import load_config
from fedforge.experiment.runner import run_experiment
from fedforge.robust import AGGREGATORS, build_aggregator
from tests.conformance.test_registry import _final_tensors, _metrics, _no_wall

ROOT = Path(__file__).resolve().parents[2]
CLIENTS = 8
NAMES = sorted(AGGREGATORS)


def _cfg(name: str, *extra: str):
    return load_config(ROOT / "examples/quickstart.toml", [
        "rounds=3", "eval.every=1", "checkpoint.every=1", f"data.options.num_clients={CLIENTS}",
        "server.clients_per_round=7", "client.batch_size=5", "client.local_epochs=null",
        "client.local_steps=2", "eval.per_client=false", "attack.kind=sign_flip",
        "attack.fraction=0.25", "attack.scale=4", f"server.aggregator={name}", *extra])


@pytest.mark.parametrize("name", NAMES)
def test_attacked_resume_equals_uninterrupted_bit_for_bit(tmp_path, name):
    whole, parts = tmp_path / "whole", tmp_path / "parts"
    run_experiment(_cfg(name), whole, progress=False)
    run_experiment(_cfg(name, "rounds=1"), parts, progress=False)
    run_experiment(_cfg(name), parts, resume=True, progress=False)
    assert _no_wall(_metrics(parts)) == _no_wall(_metrics(whole))
    a, b = _final_tensors(whole), _final_tensors(parts)
    assert list(a) == list(b)
    assert all(torch.equal(a[k], b[k]) for k in a), name


@pytest.mark.parametrize("name", NAMES)
def test_float64_in_float64_out(name):
    gen = torch.Generator().manual_seed(0)
    deltas = {"w": torch.randn(7, 3, 2, generator=gen, dtype=torch.float64),
              "b": torch.randn(7, 2, generator=gen, dtype=torch.float64)}
    out, info = build_aggregator(name).aggregate(deltas, torch.full((7,), 1 / 7,
                                                                    dtype=torch.float64))
    assert {k: v.dtype for k, v in out.items()} == {"w": torch.float64, "b": torch.float64}
    assert {k: v.shape for k, v in out.items()} == {"w": (3, 2), "b": (2,)}


@pytest.mark.parametrize("name", [n for n in NAMES if build_aggregator(n).min_clients > 1])
def test_too_small_a_cohort_is_refused_when_the_run_is_built(tmp_path, name):
    needed = build_aggregator(name).min_clients
    cfg = _cfg(name, f"server.clients_per_round={needed - 1}")
    with pytest.raises(ValueError, match=rf"^server\.clients_per_round: {name} with these "
                                         rf"server\.aggregator_options needs at least "
                                         rf"{needed} clients per round, got {needed - 1}$"):
        run_experiment(cfg, tmp_path / "run", progress=False)
