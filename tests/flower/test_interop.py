"""fedforge and Flower's own code, both ways, in-process (fake Grid; ``test_deployment.py``
repeats both on a localhost SuperLink).

* fedforge's ClientApp, unchanged, under Flower's ``FedAvg`` strategy (Message API): it
  answers Flower's standard messages, so the run equals fedforge's own server speaking them.
* a plain Flower ClientApp of the quickstart kind (``interop_app.plain_client``) under
  fedforge's ServerApp (``protocol="flower"``): the FedAvg run equals Flower's ``FedAvg``
  with the same clients, and the FedAvg family's server optimizers apply.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("flwr", reason="the Flower bridge needs `pip install 'fedforge[flower]'`")

from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, RecordDict  # noqa: E402
from flwr.serverapp.strategy import FedAvg, FedMedian, FedTrimmedAvg, Krum  # noqa: E402

from fedforge.flower import ServerOptions, client_app, run_server  # noqa: E402
from fedforge.flower.common import experiment  # noqa: E402

from . import interop_app  # noqa: E402
from .fakegrid import FakeGrid  # noqa: E402
from .test_bridge import NUM_CLIENTS, assert_close, tiny_cfg  # noqa: E402

FLOWER = ServerOptions(protocol="flower")


def flower_fedavg(grid, cfg, *, evaluate: bool = False, strategy=FedAvg, **options):
    """Flower's own FedAvg (or ``strategy``) over every node of ``grid``, from fedforge's
    initial model."""
    strategy = strategy(fraction_train=1.0, fraction_evaluate=1.0 if evaluate else 0.0,
                        min_train_nodes=NUM_CLIENTS, min_evaluate_nodes=NUM_CLIENTS,
                        min_available_nodes=NUM_CLIENTS, **options)
    init = ArrayRecord(experiment(cfg)[0].initial_params())
    return strategy.start(grid=grid, initial_arrays=init, num_rounds=cfg.rounds, timeout=60)


def all_clients_cfg(*overrides: str):
    """Every node every round, weighted by num-examples: what Flower's FedAvg does."""
    return tiny_cfg("server.clients_per_round=6", "server.aggregation=num_samples", *overrides)


def test_fedforge_client_runs_under_flowers_fedavg():
    cfg = all_clients_cfg()
    result = flower_fedavg(FakeGrid(client_app(cfg), NUM_CLIENTS), cfg, evaluate=True)
    seen = []
    ours = run_server(FakeGrid(client_app(cfg), NUM_CLIENTS), cfg, FLOWER,
                      on_round=lambda t, p, info: seen.append(info))
    assert all(not i["rejected"] and len(i["accepted"]) == NUM_CLIENTS for i in seen)
    assert_close(result.arrays.to_torch_state_dict(), ours)
    assert not torch.equal(ours["linear.weight"],
                           experiment(cfg)[0].initial_params()["linear.weight"])
    evaluated = result.evaluate_metrics_clientapp[cfg.rounds]  # fedforge's evaluate handler
    assert 0.0 <= evaluated["eval_acc"] <= 1.0 and evaluated["eval_loss"] > 0
    assert result.train_metrics_clientapp[1]["loss"] > 0


def test_fedforge_client_refuses_standard_messages_for_stateful_algorithms():
    """SCAFFOLD's control variates cannot travel in Flower's standard messages: the client
    says so (an error reply), rather than training something else."""
    cfg = tiny_cfg("algorithm.name=scaffold")
    grid = FakeGrid(client_app(cfg), NUM_CLIENTS)
    msg = Message(content=RecordDict({
        "arrays": ArrayRecord(experiment(cfg)[0].initial_params()),
        "config": ConfigRecord({"server-round": 1})}), dst_node_id=100,
        message_type=MessageType.TRAIN)
    (reply,) = grid.send_and_receive([msg])
    assert reply.has_error() and "needs fedforge's own protocol" in reply.error.reason
    with pytest.raises(ValueError, match="protocol 'flower': algorithm 'scaffold'"):
        run_server(grid, cfg, FLOWER)


def test_plain_flower_client_runs_under_fedforge_server():
    cfg = all_clients_cfg()
    seen = []
    ours = run_server(FakeGrid(interop_app.plain_client, NUM_CLIENTS), cfg, FLOWER,
                      on_round=lambda t, p, info: seen.append(info))
    assert all(not i["rejected"] and len(i["accepted"]) == NUM_CLIENTS for i in seen)
    flower = flower_fedavg(FakeGrid(interop_app.plain_client, NUM_CLIENTS), cfg)
    assert_close(ours, flower.arrays.to_torch_state_dict())


def test_plain_flower_clients_with_a_server_optimizer_and_a_median():
    """The FedAvg family's server side (FedAdam here) and a robust aggregator work with
    plain Flower clients too; a plain client that sends garbage is rejected like any other."""
    cfg = all_clients_cfg("algorithm.name=fedadam", "server.aggregator=median")
    grid = FakeGrid(interop_app.plain_client, NUM_CLIENTS, {
        103: lambda c: RecordDict({**c, "arrays": ArrayRecord(
            {k: v * 1e6 for k, v in c["arrays"].to_torch_state_dict().items()})})})
    seen = []
    got = run_server(grid, cfg, FLOWER, on_round=lambda t, p, info: seen.append(info))
    assert all(103 not in i["accepted"] and len(i["accepted"]) == 5 for i in seen)
    assert "median norm" in seen[0]["rejected"][0]["reason"]
    assert all(bool(torch.isfinite(v).all()) for v in got.values())


@pytest.mark.parametrize("ours, strategy, options", [
    (["server.aggregator=median"], FedMedian, {}),
    (["server.aggregator=trimmed_mean", "server.aggregator_options.beta=0.2"], FedTrimmedAvg,
     {"beta": 0.2}),
    (["server.aggregator=krum", "server.aggregator_options.f=1"], Krum,
     {"num_malicious_nodes": 1}),
], ids=["median", "trimmed_mean", "krum"])
def test_robust_aggregators_equal_flowers_strategies(ours, strategy, options):
    """fedforge's median / trimmed mean / Krum (on deltas) over plain Flower clients give
    Flower's FedMedian / FedTrimmedAvg / Krum (on models) to float32 rounding."""
    cfg = all_clients_cfg(*ours)
    got = run_server(FakeGrid(interop_app.plain_client, NUM_CLIENTS), cfg, FLOWER)
    flower = flower_fedavg(FakeGrid(interop_app.plain_client, NUM_CLIENTS), cfg,
                           strategy=strategy, **options)
    assert_close(got, flower.arrays.to_torch_state_dict(), tol=1e-6)


def test_bulyan_equals_flowers_message_api_bulyan():
    """Flower's Message-API ``Bulyan`` selects by one Multi-Krum scoring (no removal); ours
    with ``selection = "multi_krum"`` gives it on seven plain Flower clients (4f + 3 for f = 1).
    The paper's selection with removal is checked against Flower's ``aggregate_bulyan`` in
    ``tests/robust/test_bulyan_meamed.py``."""
    from flwr.serverapp.strategy import Bulyan  # noqa: PLC0415

    cfg = all_clients_cfg("data.options.num_clients=7", "server.clients_per_round=7",
                          "server.aggregator=bulyan", "server.aggregator_options.f=1",
                          "server.aggregator_options.selection=multi_krum")
    got = run_server(FakeGrid(interop_app.plain_client, 7), cfg, FLOWER)
    flower = flower_fedavg(FakeGrid(interop_app.plain_client, 7), cfg, strategy=Bulyan,
                           num_malicious_nodes=1)
    assert_close(got, flower.arrays.to_torch_state_dict(), tol=1e-6)
