"""The Flower bridge: same model as the fedforge simulator, malformed replies rejected.

These tests drive the real ``ServerApp`` loop and ``ClientApp`` functions in-process through
a tiny fake Grid (``fakegrid.py``; Ray start-up would dominate the run time);
``test_simulation.py`` runs the same bridge on Flower's simulation engine.
"""

from __future__ import annotations

import logging

import pytest
import torch

pytest.importorskip("flwr", reason="the Flower bridge needs `pip install 'fedforge[flower]'`")

from flwr.app import ArrayRecord, RecordDict  # noqa: E402

from fedforge.core.checkpoint import load_checkpoint  # noqa: E402
from fedforge.experiment.config import load_config  # noqa: E402
from fedforge.experiment.runner import read_metrics, run_experiment  # noqa: E402
from fedforge.flower import client_app, run_server, validate_reply  # noqa: E402
from fedforge.flower.common import experiment  # noqa: E402

from .fakegrid import FakeGrid  # noqa: E402

NUM_CLIENTS = 6
TOL = 1e-5  # float32 summation order: the simulator's chunked tensordot vs our running sum


def tiny_cfg(*overrides: str):
    return load_config("examples/quickstart.toml", [
        "rounds=2", f"data.options.num_clients={NUM_CLIENTS}", "server.clients_per_round=3",
        "client.local_steps=3", "client.local_epochs=null", *overrides])


def simulator_params(cfg, tmp_path) -> dict:
    run_experiment(cfg, tmp_path / "sim", progress=False)
    return load_checkpoint(tmp_path / "sim" / "checkpoints")[0]["params"]


def assert_close(a: dict, b: dict, tol: float = TOL) -> None:
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=tol, atol=tol, msg=k)


@pytest.mark.parametrize("algo", ["fedavg", "scaffold", "safl", "fadamgc", "topk_ef"])
def test_bridge_equals_simulator(algo, tmp_path):
    """FedAvg; SCAFFOLD (c_i), FAdamGC (y_i, v_i) and top-k with error feedback (residual),
    whose state lives in context.state between rounds; SAFL, whose sketched delta travels as
    the compact sketch and is desketched by the server."""
    cfg = tiny_cfg(f"algorithm.name={algo}", "rounds=3")
    seen = []
    got = run_server(FakeGrid(client_app(cfg), NUM_CLIENTS), cfg,
                     on_round=lambda t, p, info: seen.append(info))
    assert all(not i["rejected"] and len(i["accepted"]) == 3 for i in seen)
    assert_close(got, simulator_params(cfg, tmp_path))


def _nan(content: RecordDict) -> RecordDict:
    flat = content["delta"].to_torch_state_dict()
    flat = {k: torch.full_like(v, float("nan")) for k, v in flat.items()}
    return RecordDict({**content, "delta": ArrayRecord(flat)})


def _wrong_shape(content: RecordDict) -> RecordDict:
    flat = content["delta"].to_torch_state_dict()
    flat = {k: torch.zeros(v.numel() + 1) for k, v in flat.items()}
    return RecordDict({**content, "delta": ArrayRecord(flat)})


def _missing(content: RecordDict) -> RecordDict:
    return RecordDict({"uploads": content["uploads"]})


def test_malicious_clients_rejected_in_a_run(tmp_path, caplog):
    """Every node but 2 attacks; the model equals an honest run restricted to node 2's rounds
    (client 2 trains alone whenever it is sampled, otherwise the model stays put)."""
    cfg = tiny_cfg("rounds=2", "server.clients_per_round=6")  # every client every round
    attacks = {100: _nan, 101: _wrong_shape, 103: _missing, 104: _nan, 105: _wrong_shape}
    seen = []
    with caplog.at_level(logging.WARNING, logger="fedforge.flower.bridge"):
        got = run_server(FakeGrid(client_app(cfg), NUM_CLIENTS, attacks), cfg,
                         on_round=lambda t, p, info: seen.append(info))
    assert [i["accepted"] for i in seen] == [[2], [2]]
    reasons = {r["node"]: r["reason"] for r in seen[0]["rejected"]}
    assert "NaN" in reasons[100] and "shape" in reasons[101] and "missing" in reasons[103]
    assert "node 101" in caplog.text
    # reference: the honest bridge with only node 2 present (weights renormalised to 1)
    honest = FakeGrid(client_app(cfg), NUM_CLIENTS)
    honest.ctx = {102: honest.ctx[102]}
    ref = run_server(honest, cfg)
    assert all(torch.isfinite(v).all() for v in got.values())
    assert_close(got, ref, tol=0)


def test_all_rejected_leaves_model_unchanged():
    cfg = tiny_cfg("rounds=1")
    grid = FakeGrid(client_app(cfg), NUM_CLIENTS, {100 + i: _nan for i in range(NUM_CLIENTS)})
    init = {}
    got = run_server(grid, cfg, on_round=lambda t, p, info: init.update(n=len(info["rejected"])))
    assert init["n"] == 3
    assert_close(got, experiment(cfg)[0].initial_params(), tol=0)


def test_validate_reply_directly():
    template = {"delta": {"w": torch.zeros(2, 3), "b": torch.zeros(3)},
                "uploads": {"p/c": torch.zeros(3)}}
    good = {"w": torch.ones(2, 3), "b": torch.ones(3)}

    def reply(delta, uploads=None):
        return RecordDict({"delta": ArrayRecord(delta),
                           "uploads": ArrayRecord(uploads or {"p/c": torch.ones(3)})})

    delta, uploads = validate_reply(reply(good), template)
    assert torch.equal(delta["w"], good["w"]) and torch.equal(uploads["p/c"], torch.ones(3))
    assert "NaN" in validate_reply(reply({**good, "b": torch.tensor([0, float("inf"), 0])}),
                                   template)
    assert "NaN" in validate_reply(reply({**good, "w": torch.full((2, 3), float("nan"))}),
                                   template)
    assert "shape" in validate_reply(reply({**good, "w": torch.ones(3, 2)}), template)
    assert "dtype" in validate_reply(reply({**good, "b": torch.ones(3, dtype=torch.float64)}),
                                     template)
    assert "missing keys ['b']" in validate_reply(reply({"w": good["w"]}), template)
    assert "unexpected" in validate_reply(reply({**good, "x": torch.ones(1)}), template)
    assert "missing record 'uploads'" in validate_reply(
        RecordDict({"delta": ArrayRecord(good)}), template)
    assert "shape" in validate_reply(reply(good, {"p/c": torch.ones(4)}), template)
    assert "unexpected records ['x']" in validate_reply(
        RecordDict({"delta": ArrayRecord(good), "uploads": ArrayRecord({"p/c": torch.ones(3)}),
                    "x": ArrayRecord(good)}), template)


@pytest.mark.parametrize("algo", ["fedavg", "safl"])
def test_round_bytes_match_the_simulator(algo, tmp_path):
    """Per-round uplink/downlink bytes equal the simulator's accounting (for SAFL: the
    sketch's encoded size, far below the model's), and the arrays that arrived are counted."""
    cfg = tiny_cfg(f"algorithm.name={algo}", "eval.every=1")
    if algo == "safl":
        cfg = tiny_cfg(f"algorithm.name={algo}", "eval.every=1", "algorithm.compression=10")
    seen = []
    run_server(FakeGrid(client_app(cfg), NUM_CLIENTS), cfg,
               on_round=lambda t, p, info: seen.append(info))
    run_experiment(cfg, tmp_path / "sim", progress=False)
    sim = read_metrics(tmp_path / "sim")
    assert [i["bytes_up"] for i in seen] == [r["bytes_up_round"] for r in sim]
    assert [i["bytes_down"] for i in seen] == [r["bytes_down_round"] for r in sim]
    assert seen[-1]["bytes_up_total"] == sim[-1]["bytes_up"]
    model_bytes = 4 * 61 * 10  # logreg 60 features + bias, 10 classes, float32
    per_client = seen[0]["bytes_up"] / 3
    if algo == "fedavg":
        assert per_client == model_bytes == seen[0]["array_bytes_up"] / 3
    else:
        assert per_client < model_bytes / 5 and seen[0]["array_bytes_up"] > 0


@pytest.mark.parametrize("aggregator", [
    "median", "trimmed_mean", "krum", "norm_clip"])
def test_robust_aggregator_equals_simulation(aggregator, tmp_path):
    """``server.aggregator`` (and its options) mean the same in a deployment as in simulation:
    the bridge's median / trimmed mean / Krum / norm clip over the same honest replies give
    the simulator's model."""
    options = {"trimmed_mean": ["server.aggregator_options.beta=0.2"],
               "krum": ["server.aggregator_options.f=1"],
               "norm_clip": ["server.aggregator_options.max_norm=0.05"]}.get(aggregator, [])
    cfg = tiny_cfg(f"server.aggregator={aggregator}", "server.clients_per_round=5", *options)
    seen = []
    got = run_server(FakeGrid(client_app(cfg), NUM_CLIENTS), cfg,
                     on_round=lambda t, p, info: seen.append(info))
    assert all(not i["rejected"] and len(i["accepted"]) == 5 for i in seen)
    if aggregator == "krum":
        assert all(len(i["robust_selected"]) == 1 for i in seen)
    if aggregator == "norm_clip":  # the bound bites
        assert all(i["robust_clipped"] > 0 for i in seen)
    if aggregator == "trimmed_mean":
        assert all(i["robust_trimmed"] == 1.0 for i in seen)
    assert_close(got, simulator_params(cfg, tmp_path))
