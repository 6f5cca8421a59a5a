"""Hostile and broken Flower nodes against the bridge's server (in-process, fake Grid).

Each test has honest nodes 100..105 holding partitions 0..5 and one or more nodes that
misbehave. The promise: the server never crashes, logs the node (and partition) of every
refused claim or rejected reply, and the model equals an honest run without the offenders
(exactly: same replies, same order, same weights) or, for attacks the checks cannot see,
stays finite.
"""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch

pytest.importorskip("flwr", reason="the Flower bridge needs `pip install 'fedforge[flower]'`")

from flwr.app import (  # noqa: E402
    Array,
    ArrayRecord,
    ConfigRecord,
    Context,
    Message,
    MetricRecord,
    RecordDict,
)

from fedforge.flower import ServerOptions, client_app, run_server  # noqa: E402
from fedforge.flower.checks import norm_outliers  # noqa: E402
from fedforge.flower.common import experiment  # noqa: E402
from tests.flower.conftest import one_torch_thread  # noqa: E402, F401 (autouse fixture)
from tests.flower.fakegrid import FakeGrid  # noqa: E402
from tests.flower.test_bridge import NUM_CLIENTS, assert_close, tiny_cfg  # noqa: E402

LOGGER = "fedforge.flower"


def every_client(*overrides: str):
    """Every client every round: a hostile node is always in the cohort."""
    return tiny_cfg("server.clients_per_round=6", *overrides)


def run(cfg, grid, options=None):
    seen: list[dict] = []
    params = run_server(grid, cfg, options, on_round=lambda t, p, info: seen.append(
        {**info, "finite": all(bool(torch.isfinite(v).all()) for v in p.values())}))
    return params, seen


def honest_without(cfg, nodes: set[int], options=None):
    """The reference: the same run where ``nodes`` never answer."""
    return run(cfg, FakeGrid(client_app(cfg), NUM_CLIENTS, silent=nodes), options)[0]


def rewrite_delta(fn):
    def tamper(content: RecordDict) -> RecordDict:
        flat = content["delta"].to_torch_state_dict()
        return RecordDict({**content, "delta": ArrayRecord({k: fn(v) for k, v in flat.items()})})

    return tamper


def rewrite_metrics(**metrics):
    def tamper(content: RecordDict) -> RecordDict:
        return RecordDict({**content, "metrics": MetricRecord(
            {**dict(content["metrics"]), **metrics})})

    return tamper


# --- 1. finite but huge replies ---------------------------------------------------------------
@pytest.mark.parametrize("attack", [lambda v: v * 1e6, lambda v: torch.full_like(v, 1e30)],
                         ids=["scaled_1e6", "filled_1e30"])
def test_huge_finite_reply_rejected_by_the_norm_bound(attack, caplog):
    cfg = every_client()
    grid = FakeGrid(client_app(cfg), NUM_CLIENTS, {103: rewrite_delta(attack)})
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        got, seen = run(cfg, grid)
    assert all(i["accepted"] == [0, 1, 2, 4, 5] for i in seen)
    why = seen[0]["rejected"][0]
    assert why["node"] == 103 and why["client"] == 3 and "median norm" in why["reason"]
    assert "node 103 (partition 3): delta norm" in caplog.text
    assert_close(got, honest_without(cfg, {103}), tol=0)


def test_absolute_norm_bound_catches_a_lone_reply():
    """With one reply a round there is no median to compare with: ``max_norm`` still holds."""
    cfg = tiny_cfg("server.clients_per_round=1")
    grid = FakeGrid(client_app(cfg), NUM_CLIENTS,
                    {100 + i: rewrite_delta(lambda v: v * 1e6) for i in range(NUM_CLIENTS)})
    got, seen = run(cfg, grid, ServerOptions(max_norm=10.0))
    assert all(i["skipped"] and "max_norm 10" in i["rejected"][0]["reason"] for i in seen)
    assert_close(got, experiment(cfg)[0].initial_params(), tol=0)


def test_norm_outliers_rules():
    reasons = norm_outliers([1.0, 1.2, 0.9, 50.0], 10.0, None)
    assert reasons[:3] == [None] * 3 and "10 x the round's median norm 1" in reasons[3]
    assert norm_outliers([1.0, 3e38], None, None) == [None, None]  # both bounds off
    assert "max_norm" in norm_outliers([5.0], 10.0, 4.0)[0]
    assert norm_outliers([0.0, 0.0, 1.0], 10.0, None) == [None] * 3  # zero median: no ratio


# --- 2. overflow: the global model never becomes non-finite ------------------------------------
def _overflow(v):
    return torch.full_like(v, 3e38)


def overflow_attack(content: RecordDict) -> RecordDict:
    """3e38 everywhere, with plausible metrics (a careful attacker's reply)."""
    return rewrite_metrics(loss=1.0)(rewrite_delta(_overflow)(content))


def test_overflowing_replies_are_rejected_by_default():
    cfg = every_client("rounds=3")
    grid = FakeGrid(client_app(cfg), NUM_CLIENTS, {100: overflow_attack, 101: overflow_attack})
    got, seen = run(cfg, grid)
    assert all(i["accepted"] == [2, 3, 4, 5] and i["finite"] for i in seen)
    assert_close(got, honest_without(cfg, {100, 101}), tol=0)


def test_non_finite_server_step_is_rolled_back(caplog):
    """Norm bounds off: every node sends 3e38 (so the mean is 3e38 whatever the weights) and
    the server step (server_lr 4) overflows; it is rolled back every round and the model
    stays the last finite one."""
    cfg = every_client("rounds=3", "algorithm.server_lr=4.0")
    grid = FakeGrid(client_app(cfg), NUM_CLIENTS,
                    {100 + i: overflow_attack for i in range(NUM_CLIENTS)})
    off = ServerOptions(max_norm_ratio=None, max_upload_ratio=None)
    with caplog.at_level(logging.ERROR, logger=LOGGER):
        got, seen = run(cfg, grid, off)
    assert all(i["finite"] and i["rolled_back"] for i in seen)
    assert "rolled back to the previous model" in caplog.text
    assert_close(got, experiment(cfg)[0].initial_params(), tol=0)


def test_rollback_guards_the_server_state_too():
    """FedAdam's second moment overflows on a 3e38 pseudo-gradient (Δ² = inf) while the model
    update stays finite; the step is still rolled back, so later rounds are not poisoned."""
    cfg = every_client("algorithm.name=fedadam")
    grid = FakeGrid(client_app(cfg), NUM_CLIENTS,
                    {100 + i: overflow_attack for i in range(NUM_CLIENTS)})
    got, seen = run(cfg, grid, ServerOptions(max_norm_ratio=None, max_upload_ratio=None))
    assert all(i["rolled_back"] for i in seen)
    assert_close(got, experiment(cfg)[0].initial_params(), tol=0)


# --- 3. a bounded-norm attack needs a robust aggregator ----------------------------------------
def deviation(cfg, scale: float) -> tuple[float, list[dict]]:
    """How far node 103's sign-flipped, ``scale``-boosted update (within the 10x norm bound)
    moves the model from the honest run's."""
    grid = FakeGrid(client_app(cfg), NUM_CLIENTS, {103: rewrite_delta(lambda v: scale * v)})
    got, seen = run(cfg, grid)
    ref = honest_without(cfg, set())
    assert all(not i["rejected"] for i in seen)  # the norm bound cannot see it
    return sum(float((got[k] - ref[k]).norm()) for k in got), seen


def test_bounded_poisoning_moves_the_mean_not_a_robust_aggregator():
    """With the plain mean the attacker's pull grows with its boost; the coordinate median's
    does not (one client moves each coordinate by at most one order statistic), and Krum
    never selects the poisoned update."""
    mean = every_client()
    pulls = [deviation(mean, s)[0] for s in (-2.0, -6.0)]
    assert pulls[1] > 2 * pulls[0] > 0
    median = every_client("server.aggregator=median")
    pulls = [deviation(median, s)[0] for s in (-2.0, -6.0)]
    assert pulls[1] < 1.3 * pulls[0]
    _, seen = deviation(every_client("server.aggregator=krum"), -6.0)
    assert all(i["accepted"][3] == 3 and 3 not in i["robust_selected"] for i in seen)


# --- 4. every field of every reply is validated ------------------------------------------------
def hostile_query(content_fn):
    """A node whose QUERY answer is ``content_fn()`` and whose training is honest."""
    honest = None

    def app(msg: Message, context: Context) -> Message:
        if msg.metadata.message_type == "query":
            return Message(content=content_fn(), reply_to=msg)
        return honest(msg, context)

    def bind(real):
        nonlocal honest
        honest = real
        return app

    return bind


@pytest.mark.parametrize("content, reason", [
    (lambda: RecordDict({"config": ConfigRecord({"partition-id": "abc"})}), "not an integer"),
    (lambda: RecordDict(), "without a 'config' record"),
    (lambda: RecordDict({"config": ConfigRecord({"other": 1})}), "without 'partition-id'"),
    (lambda: RecordDict({"config": ConfigRecord({"partition-id": 99})}), "outside [0, 6)"),
    (lambda: RecordDict({"config": ConfigRecord({"partition-id": True})}), "not an integer"),
    (lambda: RecordDict({"config": MetricRecord({"partition-id": 1.0})}), "'config' record"),
], ids=["string", "no_config", "no_id", "out_of_range", "bool", "wrong_record_type"])
def test_hostile_query_reply_is_refused(content, reason, caplog):
    """Node 103's QUERY answer is junk: it is refused and logged, the run goes on without
    partition 3."""
    cfg = every_client()
    grid = FakeGrid(client_app(cfg), NUM_CLIENTS)
    grid.apps = {103: hostile_query(content)(client_app(cfg))}
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        got, seen = run(cfg, grid)
    refused = seen[0]["refused_nodes"]
    assert refused[0]["node"] == 103 and reason in refused[0]["reason"]
    assert "refused node 103" in caplog.text
    assert all(i["accepted"] == [0, 1, 2, 4, 5] for i in seen)
    assert_close(got, honest_without(cfg, {103}), tol=0)


def _wrong_names(content):
    flat = content["delta"].to_torch_state_dict()
    return RecordDict({**content, "delta": ArrayRecord({k + "x": v for k, v in flat.items()})})


def _wrong_dtype(content):
    return rewrite_delta(lambda v: v.double())(content)


def _int_delta(content):
    return rewrite_delta(lambda v: v.to(torch.int32))(content)


def _garbage_bytes(content):
    """An array whose bytes are not a NumPy file (np.load without pickles refuses them)."""
    flat = content["delta"].to_torch_state_dict()
    bad = {k: Array(dtype="float32", shape=tuple(v.shape), stype="numpy.ndarray",
                    data=b"\x80\x04pickle?") for k, v in flat.items()}
    return RecordDict({**content, "delta": ArrayRecord(bad)})


def _string_array(content):
    flat = content["delta"].to_torch_state_dict()
    return RecordDict({**content, "delta": ArrayRecord(
        {k: Array(np.array(["a"] * v.numel())) for k, v in flat.items()})})


def _no_metrics(content):
    return RecordDict({k: v for k, v in content.items() if k != "metrics"})


def _extra_record(content):
    return RecordDict({**content, "config": ConfigRecord({"x": 1})})


def _metrics_as_config(content):
    return RecordDict({**_no_metrics(content), "metrics": ConfigRecord({"num-examples": 5})})


@pytest.mark.parametrize("tamper, reason", [
    (_wrong_names, "unexpected keys"),
    (rewrite_delta(lambda v: v.reshape(-1)), "shape"),
    (_wrong_dtype, "dtype torch.float64"),
    (_int_delta, "dtype torch.int32"),
    (_garbage_bytes, "cannot decode arrays"),
    (_string_array, "cannot decode arrays"),
    (_no_metrics, "missing record 'metrics'"),
    (_metrics_as_config, "missing record 'metrics'"),
    (_extra_record, "unexpected records ['config']"),
    (rewrite_metrics(**{"num-examples": -5}), "not a non-negative integer"),
    (rewrite_metrics(**{"num-examples": float("nan")}), "not a finite number"),
    (rewrite_metrics(**{"num-examples": 2.5}), "not a non-negative integer"),
    (rewrite_metrics(**{"num-examples": 10**9}), "but the partition holds"),
    (rewrite_metrics(**{"num-examples": [1, 2]}), "not a non-negative integer"),
    (rewrite_metrics(loss=float("inf")), "metrics/loss: not a finite number"),
    (lambda c: RecordDict({**c, "metrics": MetricRecord({"loss": 1.0})}), "missing 'num-examples'"),
], ids=["names", "shape", "float64", "int32", "garbage_bytes", "string_array", "no_metrics",
        "metrics_wrong_type", "extra_record", "negative_examples", "nan_examples",
        "fractional_examples", "lying_examples", "list_examples", "inf_metric",
        "no_num_examples"])
def test_hostile_train_reply_is_rejected(tamper, reason, caplog):
    cfg = every_client()
    grid = FakeGrid(client_app(cfg), NUM_CLIENTS, {102: tamper})
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        got, seen = run(cfg, grid)
    assert all(i["accepted"] == [0, 1, 3, 4, 5] for i in seen)
    why = seen[0]["rejected"][0]
    assert why["node"] == 102 and reason in why["reason"], why
    assert "rejected reply of node 102 (partition 2)" in caplog.text
    assert_close(got, honest_without(cfg, {102}), tol=0)


def test_crashing_client_is_an_error_reply_not_a_server_crash(caplog):
    cfg = every_client()
    grid = FakeGrid(client_app(cfg), NUM_CLIENTS)

    def boom(msg, context):
        raise RuntimeError("out of memory on the device")

    grid.apps = {104: boom}
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        got, seen = run(cfg, grid)
    assert "refused node 104: query failed: out of memory" in caplog.text
    assert all(4 not in i["accepted"] for i in seen)
    assert_close(got, honest_without(cfg, {104}), tol=0)


# --- 5. one node per partition -----------------------------------------------------------------
def test_second_node_claiming_a_partition_is_refused(caplog):
    """Node 999 says it holds partition 0 (held by node 100): refused, node 100 keeps it."""
    cfg = every_client()
    impostor = {999: {"partition-id": 0, "num-partitions": NUM_CLIENTS}}
    grid = FakeGrid(client_app(cfg), NUM_CLIENTS, extra=impostor)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        got, seen = run(cfg, grid)
    assert seen[0]["refused_nodes"] == [
        {"node": 999, "reason": "claims partition 0, held by node 100"}]
    assert "refused node 999: claims partition 0, held by node 100" in caplog.text
    assert not any(m.metadata.dst_node_id == 999 for m in grid.sent
                   if m.metadata.message_type == "train")
    assert_close(got, honest_without(cfg, set()), tol=0)


def test_partition_is_released_when_its_node_leaves(caplog):
    """After node 100 disconnects, its partition is free; a node that joins later and claims
    it trains partition 0 from then on (with Flower's SuperNode authentication only a
    registered node can)."""
    cfg = every_client("rounds=3")
    grid = FakeGrid(client_app(cfg), NUM_CLIENTS)
    newcomer = Context(run_id=1, node_id=777, state=RecordDict(), run_config={},
                       node_config={"partition-id": 0, "num-partitions": NUM_CLIENTS})

    def on_round(t, params, info):
        seen.append(info)
        if t == 1:
            del grid.ctx[100]
            grid.ctx[777] = newcomer

    seen: list[dict] = []
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        run_server(grid, cfg, on_round=on_round)
    assert "node 100 (partition 0) left" in caplog.text
    assert [i["accepted"] for i in seen] == [list(range(6))] * 3
    trained = [m.metadata.dst_node_id for m in grid.sent if m.metadata.message_type == "train"]
    assert trained.count(100) == 1 and trained.count(777) == 2


# --- 6. silent nodes: round timeout and minimum replies ----------------------------------------
def test_silent_node_does_not_stall_the_round(caplog):
    cfg = every_client()
    grid = FakeGrid(client_app(cfg), NUM_CLIENTS, silent={105})
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        got, seen = run(cfg, grid, ServerOptions(round_timeout=7.0, query_timeout=3.0,
                                                 min_replies=5))
    assert grid.timeouts == [3.0, 7.0, 7.0]  # the query, then each round
    assert all(m.metadata.ttl == 7.0 for m in grid.sent if m.metadata.message_type == "train")
    assert all(i["accepted"] == [0, 1, 2, 3, 4] and not i["skipped"] for i in seen)
    assert "refused node 105" not in caplog.text  # silent is not refused: just unmapped
    assert_close(got, honest_without(cfg, {105}), tol=0)


def test_round_without_min_replies_is_skipped(caplog):
    cfg = every_client()
    grid = FakeGrid(client_app(cfg), NUM_CLIENTS, {101: rewrite_delta(_overflow)})
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        got, seen = run(cfg, grid, ServerOptions(min_replies=6))
    assert all(i["skipped"] == "5 valid replies of 6 asked (min_replies 6)" for i in seen)
    assert "the round is skipped and the model is unchanged" in caplog.text
    assert_close(got, experiment(cfg)[0].initial_params(), tol=0)


def test_deployable_app_passes_its_timeouts():
    """``fedforge.flower.app:server`` reads the guards from the Flower run config; by default
    a round waits at most an hour (Flower's own strategies' default), not the 12 h TTL."""
    from fedforge.flower.app import options_from_run, server

    assert options_from_run({}) == ServerOptions()
    assert ServerOptions().round_timeout == 3600.0
    opts = options_from_run({"fedforge-round-timeout": 30, "fedforge-max-norm": 0,
                             "fedforge-min-replies": "2", "fedforge-protocol": "flower"})
    assert (opts.round_timeout, opts.max_norm, opts.min_replies, opts.protocol) == (
        30.0, None, 2, "flower")
    for bad, msg in [({"fedforge-round-timeout": -1}, "fedforge-round-timeout: expected a"),
                     ({"fedforge-min-replies": "x"}, "fedforge-min-replies: expected int"),
                     ({"fedforge-max-norm-ratio": 0.5}, "fedforge-max-norm-ratio: expected >="),
                     ({"fedforge-protocol": "grpc"}, "fedforge-protocol: expected one of")]:
        with pytest.raises(ValueError, match=msg):
            options_from_run(bad)
    grid = FakeGrid(client_app(tiny_cfg("rounds=1")), NUM_CLIENTS)
    run_config = {"fedforge-config": "examples/quickstart.toml", "fedforge-round-timeout": 45,
                  "fedforge-overrides": f"rounds=1 data.options.num_clients={NUM_CLIENTS} "
                                        "server.clients_per_round=3 client.local_steps=3 "
                                        "client.local_epochs=null"}
    server(grid, Context(run_id=1, node_id=1, state=RecordDict(), node_config={},
                         run_config=run_config))
    assert grid.timeouts == [120.0, 45.0]
