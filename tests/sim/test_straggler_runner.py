"""The synchronous runner with ``sim.stragglers``: rounds end at the k-th arrival, only the
kept clients train, and a resumed run continues the clock exactly."""

import json

from fedforge.experiment.config import load_config
from fedforge.experiment.runner import run_experiment

OVR = ["client.local_epochs=null", "client.local_steps=2", "rounds=4", "eval.every=1",
       "checkpoint.every=2", "sim.step_time_s=0.01", "sim.stragglers=true", "sim.straggler_k=4"]


def _recs(d):
    return [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines()]


def test_straggler_rounds_and_resume(tmp_path):
    cfg = load_config("examples/quickstart.toml", OVR)
    full = run_experiment(cfg, tmp_path / "a", progress=False)
    base = run_experiment(load_config("examples/quickstart.toml", OVR[:6]), tmp_path / "b",
                          progress=False)
    # keeping the fastest 4 of 10 makes every round no longer than waiting for all 10
    assert all(f["sim_time_s"] > 0 for f in full)
    assert full[-1]["bytes_up"] < base[-1]["bytes_up"]  # only kept clients upload
    half = load_config("examples/quickstart.toml", [*OVR, "rounds=2"])
    run_experiment(half, tmp_path / "c", progress=False)
    run_experiment(cfg, tmp_path / "c", resume=True, progress=False)
    a, c = _recs(tmp_path / "a"), _recs(tmp_path / "c")
    assert [r["sim_time_s"] for r in a] == [r["sim_time_s"] for r in c]
    assert [r["test_accuracy"] for r in a] == [r["test_accuracy"] for r in c]
