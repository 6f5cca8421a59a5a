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


def test_straggler_rounds_read_the_whole_delay_law_of_sim(tmp_path):
    """[sim] and [system] share one definition of a client's timing: shift and traces too."""
    from fedforge.sim.rounds import straggler_clock

    trace = tmp_path / "delays.txt"
    trace.write_text("0.5 1.5 2.5")
    shifted = load_config("examples/quickstart.toml", [*OVR, "sim.delay_shift=2.0"])
    assert straggler_clock(shifted.sim, 10, seed=0).delay.shift == 2.0
    traced = load_config("examples/quickstart.toml",
                         [*OVR, "sim.delay=trace", f"sim.delay_trace={trace}"])
    assert straggler_clock(traced.sim, 10, seed=0).delay.shared == [0.5, 1.5, 2.5]


def test_a_trace_delay_without_its_file_is_refused_in_one_line():
    import pytest

    from fedforge.experiment.config import ConfigError

    with pytest.raises(ConfigError) as err:
        load_config("examples/quickstart.toml", [*OVR, "sim.delay=trace"])
    assert "\n" not in str(err.value) and "sim" in str(err.value)
    assert "delay_trace" in str(err.value)
