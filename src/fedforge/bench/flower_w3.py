"""W3 (time to accuracy) on Flower's simulation engine (``pip install "fedforge[bench]"``).

The same experiment as the fedforge and plain rows (:mod:`fedforge.bench.plain_fl`): one
Flower node per fedforge client, each holding that client's samples (fedforge's loaders and
partition, loaded once per Ray actor); a ``ClientApp`` trains with the plain loop's
``torch.optim.SGD`` code; Flower's ``FedAvg`` strategy aggregates the replies weighted by
``num-examples`` (the client's training samples, as fedforge's FedAvg weights them). Only
the choice of nodes is changed: each round trains the nodes of the clients fedforge draws
for that round, and every train message carries the client's mini-batch order of that round,
so all three engines train the same clients on the same batches. The global model is
evaluated on the test set inside the ``ServerApp`` (``evaluate_fn``) every ``eval.every``
rounds; the run ends at the first evaluation at or above the target.

Timing is taken inside the ``ServerApp``, as in the W1 Flower row: the clock starts when the
strategy starts (its ``evaluate_fn`` call before round 1), after Ray has started and every
actor has loaded the data (a QUERY message to every node, which also tells the server each
node's client id). It covers each round's cohort draw, messages, Ray scheduling, local
training in the actors, aggregation and evaluation. Client resources: one CPU per actor and
one torch thread per actor; the server's evaluation runs in the calling process.
"""

from __future__ import annotations

import time

import torch

from fedforge.bench.plain_fl import (
    TargetWatch,
    W3Result,
    baseline_lr,
    build_network,
    draw_cohort,
    evaluates,
    load_federated,
    test_accuracy,
    train_client,
)
from fedforge.experiment.config import RunConfig

_ACTOR: dict = {}  # per Ray actor process: the config's data and model, loaded once


def actor_setup(cfg: RunConfig):
    """The data and network of ``cfg`` in this process (one torch thread), cached."""
    key = cfg.model_dump_json()
    if _ACTOR.get("key") != key:
        from fedforge.plugins import load_plugins

        torch.set_num_threads(1)
        load_plugins(cfg.plugins)
        data = load_federated(cfg, torch.device("cpu"))
        _ACTOR.update(key=key, data=data, net=build_network(cfg, data))
    return _ACTOR["data"], _ACTOR["net"]


def pack_batches(batches: list[torch.Tensor]) -> dict[str, bytes]:
    """A client's mini-batches (positions into its samples) as message bytes."""
    flat = torch.cat(batches) if batches else torch.zeros(0, dtype=torch.int64)
    lens = torch.tensor([b.numel() for b in batches], dtype=torch.int64)
    return {"pos": flat.to(torch.int64).numpy().tobytes(), "lens": lens.numpy().tobytes()}


def unpack_batches(conf) -> list[torch.Tensor]:
    pos = torch.frombuffer(bytearray(conf["pos"]), dtype=torch.int64)
    lens = torch.frombuffer(bytearray(conf["lens"]), dtype=torch.int64).tolist()
    return list(torch.split(pos, lens)) if lens else []


class _Reached(Exception):  # noqa: N818 - control flow, not an error
    """Raised by ``evaluate_fn`` to end the strategy at the target."""


def run_flower(cfg: RunConfig, target: float, *, node_timeout: float = 120.0) -> W3Result:
    """W3 on Flower's simulation engine; see the module docstring for what is timed.
    ``total_s`` is the whole call: data loading, Ray's start-up and shutdown included."""
    try:
        from fedforge.bench.flower_sim import simulate
    except ImportError as e:  # pragma: no cover - optional extra
        raise RuntimeError('the Flower baseline needs pip install "fedforge[bench]"') from e

    started = time.perf_counter()
    lr = baseline_lr(cfg)
    cfg = _with_data_root(cfg)
    data = load_federated(cfg, torch.device("cpu"))
    net = build_network(cfg, data)
    state: dict = {}
    server_app = _server_app(cfg, data, net, target, state, node_timeout)
    simulate(server_app, _client_app(cfg, lr), data.num_clients)
    if "watch" not in state:
        raise RuntimeError("flower: the strategy never started")
    return state["watch"].result("flower", started)


def _with_data_root(cfg: RunConfig) -> RunConfig:
    """``cfg`` with its data folder written out: Ray actors may not share this process's
    --data-root or current folder."""
    if cfg.data.root is not None:
        return cfg
    from fedforge.data.root import resolve_data_root

    root = str(resolve_data_root(None).path.resolve())
    return cfg.model_copy(update={"data": cfg.data.model_copy(update={"root": root})})


def _client_app(cfg: RunConfig, lr: float):
    """The nodes: each loads the data at the start-up query and trains its client with the
    plain loop's SGD on the batches the message names."""
    from fedforge.bench.flower_sim import (
        ArrayRecord,
        ClientApp,
        Context,
        Message,
        MetricRecord,
        RecordDict,
        partition_reply,
    )

    client_app = ClientApp()

    @client_app.query()
    def query(msg: Message, context: Context) -> Message:
        actor_setup(cfg)
        return partition_reply(msg, context)

    @client_app.train()
    def train(msg: Message, context: Context) -> Message:
        cdata, cnet = actor_setup(cfg)
        own = cdata.client_indices[int(context.node_config["partition-id"])]
        cnet.load_state_dict(msg.content["arrays"].to_torch_state_dict())
        batches = [own[b] for b in unpack_batches(msg.content["config"])]
        train_client(cnet, cdata.train_x, cdata.train_y, batches, lr)
        reply = RecordDict({"arrays": ArrayRecord(cnet.state_dict()),
                            "metrics": MetricRecord({"num-examples": int(own.numel())})})
        return Message(content=reply, reply_to=msg)

    return client_app


def _seeded_fedavg(cfg: RunConfig, sizes, state: dict):
    """Flower's FedAvg on the nodes of fedforge's cohort, with their batch orders; a round
    with a missing or failed reply is an error."""
    from fedforge.bench.flower_sim import ConfigRecord, FedAvg, Message, MessageType, RecordDict

    class SeededFedAvg(FedAvg):
        def configure_train(self, server_round, arrays, config, grid):
            msgs = []
            for cid, batches in draw_cohort(cfg, sizes, server_round):
                conf = ConfigRecord({"server-round": server_round, **pack_batches(batches)})
                msgs.append(Message(RecordDict({"arrays": arrays, "config": conf}),
                                    dst_node_id=state["node_of"][cid],
                                    message_type=MessageType.TRAIN))
            state["sent"] = len(msgs)
            return msgs

        def aggregate_train(self, server_round, replies):
            replies = list(replies)
            failed = [m.error.reason for m in replies if m.has_error()]
            if failed or len(replies) != state["sent"]:
                raise RuntimeError(f"flower round {server_round}: {len(replies)} of "
                                   f"{state['sent']} replies, errors: {failed[:1]}")
            return super().aggregate_train(server_round, replies)

    return SeededFedAvg(fraction_evaluate=0.0)


def _server_app(cfg: RunConfig, data, net: torch.nn.Module, target: float, state: dict,
                node_timeout: float):
    """The server: finds every client's node, then runs the strategy, evaluating the global
    model every ``eval.every`` rounds and stopping at the first at or above ``target``."""
    from fedforge.bench.flower_sim import (
        ArrayRecord,
        Context,
        Grid,
        MetricRecord,
        ServerApp,
        node_of_partition,
    )

    def evaluate_fn(server_round: int, arrays):
        if server_round == 0:  # the strategy starts: the clock starts
            state["watch"] = TargetWatch(target)
            return None
        if not evaluates(cfg, server_round):
            return None
        net.load_state_dict(arrays.to_torch_state_dict())
        acc = test_accuracy(net, data.test_x, data.test_y, cfg.eval.batch_size)
        if state["watch"].evaluated(server_round, acc):
            raise _Reached
        return MetricRecord({"accuracy": acc})

    server_app = ServerApp()

    @server_app.main()
    def main(grid: Grid, context: Context) -> None:
        state["node_of"] = node_of_partition(grid, data.num_clients, node_timeout)
        if len(state["node_of"]) != data.num_clients:
            raise RuntimeError(f"flower: {len(state['node_of'])} of {data.num_clients} "
                               "nodes answered the start-up query")
        strategy = _seeded_fedavg(cfg, data.client_sizes(), state)
        try:
            strategy.start(grid=grid, initial_arrays=ArrayRecord(net.state_dict()),
                           num_rounds=cfg.rounds, evaluate_fn=evaluate_fn)
        except _Reached:
            pass

    return server_app
