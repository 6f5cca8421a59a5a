"""Simulated run time (fedforge.sim.cost) against hand numbers, and its runner wiring."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from fedforge.algorithms import build_algorithm
from fedforge.experiment.config import ConfigError, SimConfig, load_config, validate
from fedforge.experiment.runner import read_metrics, run_experiment
from fedforge.sim.cost import (
    DEVICE_FLOPS,
    CostModel,
    build_cost_model,
    device_flops,
    model_train_flops,
    step_seconds,
    transfer_seconds,
)

REPO = Path(__file__).resolve().parents[2]
MBIT = 1e6 / 8  # bytes in one megabit


def test_transfer_and_client_seconds_by_hand():
    # 100 Mbit down over 100 Mbps = 1 s; 50 Mbit up = 0.5 s; 60 steps x 10 ms = 0.6 s
    assert transfer_seconds(100 * MBIT, 100.0) == pytest.approx(1.0)
    cm = CostModel(step_time_s=0.01)
    assert cm.client_seconds(60, 100 * MBIT, 50 * MBIT) == pytest.approx(2.1)
    # latency is paid once per message (down and up); a 2x faster client halves compute only
    cm = CostModel(step_time_s=0.01, latency_s=0.05)
    assert cm.client_seconds(60, 100 * MBIT, 50 * MBIT) == pytest.approx(2.2)
    assert cm.client_seconds(60, 100 * MBIT, 50 * MBIT, speed=2.0) == pytest.approx(1.9)
    # asymmetric links: 10 Mbps up makes the 50 Mbit upload 5 s
    cm = CostModel(step_time_s=0.0, bandwidth_up_mbps=10.0, bandwidth_down_mbps=100.0)
    assert cm.client_seconds(0, 100 * MBIT, 50 * MBIT) == pytest.approx(6.0)


def test_round_is_the_slowest_client():
    cm = CostModel(step_time_s=0.01)
    steps = np.array([10, 60, 0])
    assert cm.round_seconds(steps, 100 * MBIT, 50 * MBIT) == pytest.approx(2.1)
    # per-client bytes: a tracking client uploading twice as much sets the pace
    up = np.array([50, 100, 50]) * MBIT
    assert cm.round_seconds(steps, 100 * MBIT, up) == pytest.approx(2.6)
    # speeds: the 60-step client at 0.5x takes 1.2 s of compute
    assert cm.round_seconds(steps, 0, 0, speed=np.array([1, 0.5, 1])) == pytest.approx(1.2)
    assert cm.round_seconds([], 100, 100) == 0.0


def test_step_seconds_from_flops_and_presets():
    # 3 MFLOP per sample x 50 samples on an A100 (19.5 TFLOP/s fp32)
    assert step_seconds(3e6, 50, device_flops("a100")) == pytest.approx(1.5e8 / 19.5e12)
    assert DEVICE_FLOPS["a100_tf32"] == 156e12
    with pytest.raises(ValueError, match="sim.device"):
        device_flops("abacus")


def test_model_train_flops_counts_3x_forward():
    lin = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(10, 5))
    assert model_train_flops(lin, (10,)) == 3 * 2 * 10 * 5
    # conv 3x3, 1 -> 2 channels, 4x4 output (padding 1): 2 FLOPs x 16 x 2 x 9 MACs
    conv = torch.nn.Conv2d(1, 2, 3, padding=1, bias=False)
    assert model_train_flops(conv, (1, 4, 4)) == 3 * 2 * 16 * 2 * 9


@pytest.mark.slow  # importing torch's flop counter takes seconds
def test_model_train_flops_agrees_with_torch_counter():
    from torch.utils.flop_counter import FlopCounterMode

    from fedforge.models import build_model

    cnn = build_model("cnn", (1, 28, 28), 10)
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        cnn(torch.zeros(1, 1, 28, 28))
    assert model_train_flops(cnn, (1, 28, 28)) == 3 * counter.get_total_flops()


def test_paper_per_round_costs_from_message_sizes():
    """Table 2's image run times are 3.6 s per model-sized transfer (ResNet-18, 100 Mbps):
    FAdamGC (S~ = S/2) 3.5 transfers = 12.6 s/round, LocalAdam 2 = 7.2 s/round."""
    d = 11_250_000  # float32 parameters: 45 MB = 360 Mbit = 3.6 s at 100 Mbps
    params = {"w": torch.zeros(d)}
    cm = CostModel(step_time_s=0.0)
    per_round = {}
    for name in ("fadamgc", "localadam", "fa_nt"):
        algo = build_algorithm(name)
        down, up = algo.message_nbytes(params, algo.server_init(params))
        per_round[name] = cm.round_seconds(np.full(10, 60), down, up)
    assert per_round["localadam"] == pytest.approx(7.2)
    assert per_round["fadamgc"] == pytest.approx(12.6)
    assert per_round["fa_nt"] == pytest.approx(12.6)


def test_build_cost_model_prefers_step_time_then_flops():
    cm = build_cost_model(SimConfig(step_time_s=0.25, latency_s=0.1))
    assert (cm.step_time_s, cm.latency_s, cm.bandwidth_up_mbps) == (0.25, 0.1, 100.0)
    lin = torch.nn.Linear(10, 5)
    cm = build_cost_model(SimConfig(device_flops=300.0), lin, (10,), batch_size=4)
    assert cm.step_time_s == pytest.approx(300 * 4 / 300.0)  # 300 train FLOPs/sample
    with pytest.raises(ValueError, match="sim.step_time_s"):
        build_cost_model(SimConfig())


@pytest.mark.parametrize(("section", "field"), [
    ({"device": "abacus"}, "sim.device"),
    ({"bandwidth_up_mbps": 0}, "sim.bandwidth_up_mbps"),
    ({"latency_s": -1}, "sim.latency_s"),
    ({"step_time_s": -0.1}, "sim.step_time_s"),
    ({"bogus": 1}, "sim.bogus"),
])
def test_bad_sim_config_names_the_field(section, field):
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        validate({"sim": section})


def test_runner_writes_cumulative_sim_time_and_resumes_it(tmp_path):
    cfg = load_config(REPO / "examples" / "quickstart.toml", [
        "rounds=4", "eval.every=2", "checkpoint.every=2", "client.local_steps=3",
        "client.local_epochs=null", "sim.step_time_s=1.0", "sim.bandwidth_up_mbps=1.0",
        "sim.bandwidth_down_mbps=1.0",
    ])
    hist = run_experiment(cfg, tmp_path / "a", progress=False)
    per_client = hist[0]["bytes_up_round"] / cfg.server.clients_per_round  # logreg, fedavg
    per_round = 3 * 1.0 + 2 * 8 * per_client / 1e6  # 3 steps + down + up at 1 Mbps
    assert [r["sim_time_s"] for r in hist] == pytest.approx(
        [1 * per_round, 2 * per_round, 3 * per_round, 4 * per_round], abs=1e-3)
    # stop after round 2, resume to 4: the same cumulative numbers
    run_experiment(cfg.model_copy(update={"rounds": 2}), tmp_path / "b", progress=False)
    run_experiment(cfg, tmp_path / "b", resume=True, progress=False)
    assert [r["sim_time_s"] for r in read_metrics(tmp_path / "b")] == pytest.approx(
        [r["sim_time_s"] for r in hist])


def test_flop_count_accepts_token_models():
    """Token-id models (Embedding first) are counted from integer ids, not float zeros."""
    from fedforge.models import build_model
    from fedforge.sim.cost import model_train_flops

    model = build_model("text_classifier", (16,), 2, vocab_size=50)
    assert model_train_flops(model, (16,)) > 0
