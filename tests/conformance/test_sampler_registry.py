"""Conformance over every client sampler (``server.sampler``), with no hand-picked list.

For each sampler of :func:`fedforge.sim.samplers.sampler_names` (a new one is covered
without editing this file), composed with a stateless and a control-variate algorithm:

* a run stopped at a round and resumed equals an uninterrupted run bit for bit (metrics and
  final checkpoint, the sampler's state included), also on a straggler clock;
* rollback after an injected NaN completes, the sampler restored with the checkpoint;
* the sampler's state survives a checkpoint round trip exactly;
* a float64 run keeps every floating tensor of the sampler's state in float64.

``uniform`` is no sampler (the round's own draw); the algorithm suites cover it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from fedforge.core.checkpoint import load_checkpoint
from fedforge.core.tree import flatten_dict
from fedforge.experiment.config import load_config
from fedforge.experiment.drivers import RoundsDriver, RunFolder, read_checkpoint
from fedforge.experiment.runner import Experiment, run_experiment
from fedforge.sim.samplers import sampler_names
from fedforge.study.labels import without_wall_clock

from .test_registry import nan_once  # noqa: F401 (the fixture)

ROOT = Path(__file__).resolve().parents[2]
ROUNDS = 4
BASE = [
    f"rounds={ROUNDS}", "eval.every=1", "checkpoint.every=1", "checkpoint.keep=10",
    "data.options.num_clients=8", "server.clients_per_round=3", "client.batch_size=5",
    "client.local_epochs=null", "client.local_steps=2", "eval.per_client=false",
]
SAMPLERS = [n for n in sampler_names() if n != "uniform"]
CASES = [pytest.param(s, a, v, id=f"{s}-{a}-{v}",
                      marks=[] if (a, v) == ("scaffold", "plain") else [pytest.mark.slow])
         for s in SAMPLERS for a in ("fedavg", "scaffold") for v in ("plain", "stragglers")]
VARIANTS = {"plain": [], "stragglers": ["sim.stragglers=true", "sim.straggler_k=2"]}


def _cfg(sampler: str, algorithm: str = "scaffold", *extra: str):
    return load_config(ROOT / "examples/quickstart.toml",
                       [*BASE, f"algorithm.name={algorithm}", f"server.sampler={sampler}",
                        *extra])


def _metrics(run: Path) -> list[dict]:
    lines = (run / "metrics.jsonl").read_text().splitlines()
    return [without_wall_clock(json.loads(line)) for line in lines]


def _final(run: Path) -> dict:
    return flatten_dict(load_checkpoint(run / "checkpoints")[0])


@pytest.mark.parametrize(("sampler", "algorithm", "variant"), CASES)
def test_resume_equals_uninterrupted_bit_for_bit(tmp_path, sampler, algorithm, variant):
    extra = VARIANTS[variant]
    whole, parts = tmp_path / "whole", tmp_path / "parts"
    run_experiment(_cfg(sampler, algorithm, *extra), whole, progress=False)
    run_experiment(_cfg(sampler, algorithm, *extra, "rounds=2"), parts, progress=False)
    run_experiment(_cfg(sampler, algorithm, *extra), parts, resume=True, progress=False)
    assert _metrics(parts) == _metrics(whole)
    a, b = _final(whole), _final(parts)
    assert list(a) == list(b) and any(k.startswith("sampler/") for k in a)
    for key in a:
        assert torch.equal(a[key], b[key]), f"{sampler}: {key} differs after resume"


@pytest.mark.parametrize("sampler", SAMPLERS)
def test_rollback_after_injected_nan(tmp_path, sampler, nan_once):  # noqa: F811
    run = tmp_path / "run"
    records = run_experiment(_cfg(sampler, "scaffold", "divergence=rollback"), run,
                             progress=False)
    assert nan_once == [1]
    assert [r["round"] for r in records] == list(range(1, ROUNDS + 1))
    assert "rollback to round 2" in (run / "divergence.jsonl").read_text()


@pytest.mark.parametrize("sampler", SAMPLERS)
def test_checkpoint_round_trip_keeps_the_sampler_state(tmp_path, sampler):
    run = tmp_path / "run"
    run_experiment(_cfg(sampler, "scaffold", "rounds=2"), run, progress=False)
    exp = Experiment.from_config(_cfg(sampler))
    driver = RoundsDriver(exp, RunFolder(run, run / "checkpoints"), verbose=False)
    driver.load_state_dict(*read_checkpoint(driver))
    driver.start()
    state = driver.selection.sampler.state_dict()
    saved = _final(run)
    assert sorted(f"sampler/{k}" for k in state) == sorted(
        k for k in saved if k.startswith("sampler/"))
    for key, value in state.items():
        assert torch.equal(value, saved[f"sampler/{key}"]), key


@pytest.mark.parametrize("sampler", SAMPLERS)
def test_a_float64_run_keeps_the_sampler_state_in_float64(tmp_path, sampler):
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        run_experiment(_cfg(sampler, "scaffold", "rounds=2"), tmp_path / "run", progress=False)
    finally:
        torch.set_default_dtype(old)
    saved = _final(tmp_path / "run")
    floats = {k: v.dtype for k, v in saved.items() if v.is_floating_point()}
    assert floats and set(floats.values()) == {torch.float64}, floats
