"""What the Flower rows of the benchmarks share: Flower's simulation API, imported here
once behind the extra's check, and which Flower node holds which client.

Flower's simulation engine numbers its nodes itself; each node knows only its
``partition-id`` (the client it simulates). A server that trains chosen clients asks every
node once (a QUERY message) and keeps the answers. Imported only when a Flower row runs
(``pip install "fedforge[bench]"``).
"""

from __future__ import annotations

import time

try:
    from flwr.app import (
        ArrayRecord,
        ConfigRecord,
        Context,
        Message,
        MessageType,
        MetricRecord,
        RecordDict,
    )
    from flwr.clientapp import ClientApp
    from flwr.serverapp import Grid, ServerApp
    from flwr.serverapp.strategy import FedAvg
    from flwr.simulation import run_simulation
except ImportError as e:  # pragma: no cover - optional extra
    raise ImportError('the Flower rows need pip install "fedforge[bench]"') from e

__all__ = ["ArrayRecord", "ClientApp", "ConfigRecord", "Context", "FedAvg", "Grid", "Message",
           "MessageType", "MetricRecord", "RecordDict", "ServerApp", "node_of_partition",
           "partition_reply", "simulate"]


def partition_reply(msg: Message, context: Context) -> Message:
    """A node's answer to the start-up query: the client (partition) it simulates."""
    pid = int(context.node_config["partition-id"])
    return Message(RecordDict({"config": ConfigRecord({"partition-id": pid})}), reply_to=msg)


def node_of_partition(grid: Grid, count: int, timeout: float | None = None) -> dict[int, int]:
    """client id -> Flower node id, once ``count`` nodes are up (or ``timeout`` seconds
    have passed; ``None`` waits for them all). The query's replies wait ten times as long."""
    nodes: list[int] = []
    end = None if timeout is None else time.monotonic() + timeout
    while len(nodes) < count and (end is None or time.monotonic() < end):
        nodes = sorted(grid.get_node_ids())
        time.sleep(0.05)
    ask = [Message(RecordDict({"config": ConfigRecord({})}), dst_node_id=n,
                   message_type=MessageType.QUERY) for n in nodes]
    replies = grid.send_and_receive(ask, timeout=None if timeout is None else timeout * 10)
    return {int(m.content["config"]["partition-id"]): m.metadata.src_node_id
            for m in replies if not m.has_error()}


def simulate(server_app: ServerApp, client_app: ClientApp, nodes: int) -> None:
    """Flower's simulation engine with ``nodes`` supernodes, one CPU per client actor."""
    run_simulation(server_app=server_app, client_app=client_app, num_supernodes=nodes,
                   backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0}})
