"""A Flower node that sends back its own reply from an earlier round is refused.

The server ties every reply to the message it answers: the reply-to message id (once the grid
has set ids, as Flower's grids do), the round (the message's group id) and, under fedforge's
protocol, the round the reply's metrics echo (``server-round``). A stale reply is rejected in
one logged line without using up the node's place, so the node's real reply still counts.
"""

from __future__ import annotations

import logging
from uuid import uuid4

import pytest

pytest.importorskip("flwr", reason="the Flower bridge needs `pip install 'fedforge[flower]'`")

from flwr.app import Message  # noqa: E402

from fedforge.flower import client_app  # noqa: E402
from tests.flower.conftest import one_torch_thread  # noqa: E402, F401 (autouse fixture)
from tests.flower.fakegrid import FakeGrid  # noqa: E402
from tests.flower.test_bridge import NUM_CLIENTS, assert_close  # noqa: E402
from tests.reliability.test_flower_hostile import LOGGER, every_client, run  # noqa: E402

NODE, PARTITION = 103, 3
HONEST = [0, 1, 2, 4, 5]


class IdGrid(FakeGrid):
    """A FakeGrid that gives every message an id when it is sent, as Flower's grids do."""

    def send_and_receive(self, messages, *, timeout=None):
        for m in messages:
            m.metadata.__dict__["_message_id"] = uuid4().hex
        return super().send_and_receive(messages, timeout=timeout)


def replaying(real, *, keep_envelope: bool, also_honest: bool = False):
    """Node 103: its round-1 TRAIN reply, sent again every later round, either as the same
    message (old reply-to id and round) or as its content under a fresh envelope; with
    ``also_honest`` the stale reply comes first and the real one after it."""
    first: list[Message] = []

    def app(msg: Message, context):
        reply = real(msg, context)
        if msg.metadata.message_type != "train":
            return reply
        if not first:
            first.append(reply)
            return reply
        stale = first[0] if keep_envelope else Message(content=first[0].content, reply_to=msg)
        return [stale, reply] if also_honest else stale

    return app


class TwoRepliesGrid(FakeGrid):
    """A FakeGrid where an app may answer with several messages (a node sending two)."""

    def send_and_receive(self, messages, *, timeout=None):
        out = []
        for reply in super().send_and_receive(messages, timeout=timeout):
            out.extend(reply if isinstance(reply, list) else [reply])
        return out


def _run(grid_cls, cfg, **kwargs):
    grid = grid_cls(client_app(cfg), NUM_CLIENTS)
    grid.apps = {NODE: replaying(client_app(cfg), **kwargs)}
    return run(cfg, grid)


def _stale_rejected(seen, caplog, reason: str) -> None:
    assert seen[0]["accepted"] == [0, 1, 2, 3, 4, 5]  # round 1: its reply is fresh
    for info in seen[1:]:
        assert info["accepted"] == HONEST
        assert [r["node"] for r in info["rejected"]] == [NODE]
        why = info["rejected"][0]
        assert why["client"] == PARTITION and reason in why["reason"], why
        assert "stale or replayed" in why["reason"]
    assert f"rejected reply of node {NODE} (partition {PARTITION})" in caplog.text


@pytest.mark.parametrize("grid_cls, reason", [
    (FakeGrid, "answers round '1''s message, not round"),
    (IdGrid, "not the one sent to it in round"),
], ids=["round", "message_id"])
def test_replayed_reply_message_is_rejected(grid_cls, reason, caplog):
    cfg = every_client("rounds=3")
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        _, seen = _run(grid_cls, cfg, keep_envelope=True)
    _stale_rejected(seen, caplog, reason)


def test_replayed_reply_content_is_rejected(caplog):
    """The round-1 content under a fresh envelope: its metrics echo round 1."""
    cfg = every_client("rounds=3")
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        _, seen = _run(IdGrid, cfg, keep_envelope=False)
    _stale_rejected(seen, caplog, "metrics/server-round: 1, but this is round")


def test_stale_reply_does_not_take_the_place_of_the_real_one(caplog):
    """A stale reply arriving before the node's real one is dropped; the real one counts, so
    the model is the honest run's."""
    cfg = every_client("rounds=3")
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        got, seen = _run(TwoRepliesGrid, cfg, keep_envelope=True, also_honest=True)
    assert all(info["accepted"] == [0, 1, 2, 3, 4, 5] for info in seen)
    assert [len(info["rejected"]) for info in seen] == [0, 1, 1]
    honest, _ = run(cfg, FakeGrid(client_app(cfg), NUM_CLIENTS))
    assert_close(got, honest, tol=0)
