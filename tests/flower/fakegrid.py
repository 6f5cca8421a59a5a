"""An in-process stand-in for Flower's Grid, for fast, deterministic bridge tests.

Node ``100 + i`` holds partition ``i`` and runs ``app`` (a Flower ClientApp) on each message
it gets, as a SuperNode would; ``extra`` adds nodes with their own node config (e.g. a second
node claiming partition 0). ``tamper[node]`` rewrites that node's TRAIN reply content (a
hostile node), ``silent`` nodes never answer, and an exception in the app becomes an error
reply, as with Flower. Every ``timeout`` the server passes is recorded.
"""

from __future__ import annotations

from collections.abc import Callable

from flwr.app import Context, Error, Message, RecordDict
from flwr.supercore.task_identity import TaskIdentity


class FakeGrid:
    def __init__(self, app, num_nodes: int, tamper: dict[int, Callable] | None = None, *,
                 silent: set[int] | None = None, extra: dict[int, dict] | None = None,
                 apps: dict[int, object] | None = None):
        TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 1, 1
        self.app, self.tamper, self.silent = app, tamper or {}, silent or set()
        self.apps = apps or {}
        configs = {100 + i: {"partition-id": i, "num-partitions": num_nodes}
                   for i in range(num_nodes)}
        configs.update(extra or {})
        self.ctx = {node: Context(run_id=1, node_id=node, state=RecordDict(), node_config=conf,
                                  run_config={}) for node, conf in configs.items()}
        self.timeouts: list[float | None] = []
        self.sent: list[Message] = []

    def get_node_ids(self) -> list[int]:
        return list(self.ctx)

    def send_and_receive(self, messages, *, timeout=None):
        self.timeouts.append(timeout)
        replies = []
        for m in messages:
            self.sent.append(m)
            node = m.metadata.dst_node_id
            if node in self.silent or node not in self.ctx:
                continue
            try:
                reply = self.apps.get(node, self.app)(m, self.ctx[node])
            except Exception as exc:  # as a SuperNode does: the error travels back
                replies.append(Message(error=Error(code=0, reason=str(exc)), reply_to=m))
                continue
            if node in self.tamper and m.metadata.message_type == "train":
                reply = Message(content=self.tamper[node](reply.content), reply_to=m)
            replies.append(reply)
        return replies
