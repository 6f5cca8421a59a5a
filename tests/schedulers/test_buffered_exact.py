"""Exact checks of the per-task asynchronous server (src/fedforge/schedulers/buffered.py) beyond
the hand examples of test_buffered.py: what the server step is told (S, N, t), FedAsync's
default exponent, the server optimizer's state across steps and the checkpoint round trip
(docs/testing.md).
"""

import pytest
import torch

from fedforge.algorithms import build_algorithm
from fedforge.client.optimizers import local_optimizer
from fedforge.protocol.algorithm import Algorithm
from fedforge.schedulers.buffered import BufferedServer
from fedforge.server.chain import ServerTransform

F64 = torch.float64


def _w(*values):
    return {"w": torch.tensor(values, dtype=F64)}


def _recording_algorithm(seen):
    """A server stage that records every aggregate and applies x - mean delta."""

    def update(params, agg, state):
        seen.append(agg)
        return {k: params[k] - agg.delta[k] for k in params}, agg, state

    stage = ServerTransform("opt", lambda params: {}, update)
    return Algorithm("recorder", local_optimizer("sgd", 0.1), stage)


def test_the_step_sees_the_buffer_mean_size_population_and_round():
    seen = []
    s = BufferedServer(_recording_algorithm(seen), _w(1.0, 2.0), 2.0, 7)
    assert (s.round, s.b, s.buf_count, s.num_clients) == (0, 2, 0, 7)
    assert s.buf_sum["w"].tolist() == [0.0, 0.0]
    assert not s.receive(_w(1.0, 0.0), weight=2.0)
    assert s.buf_count == 1 and s.buf_sum["w"].tolist() == [2.0, 0.0]
    assert s.receive(_w(0.0, 4.0))
    assert s.receive(_w(3.0, 3.0)) is False and s.receive(_w(1.0, 1.0)) is True
    assert [a.num_sampled for a in seen] == [2, 2]
    assert [a.num_clients for a in seen] == [7, 7]
    assert [a.round for a in seen] == [1, 2]
    assert [a.uploads for a in seen] == [{}, {}]
    assert seen[0].delta["w"].tolist() == [1.0, 2.0]  # (2·(1, 0) + (0, 4)) / 2
    assert seen[1].delta["w"].tolist() == [2.0, 2.0]
    assert s.params["w"].tolist() == [-2.0, -2.0]
    assert s.round == 2


def test_fedasync_default_exponent_is_one_half():
    """alpha 0.6, staleness 3, default a = 0.5: a_t = 0.6 / 2 = 0.3 (as test_buffered);
    staleness 0: a_t = alpha."""
    s = BufferedServer(build_algorithm("fedavg"), _w(1.0, 2.0), 1, 10)
    assert s.mix(_w(0.0, 0.0), _w(1.0, 1.0), 0.6, 3) is True
    torch.testing.assert_close(s.params["w"], torch.tensor([0.4, 1.1], dtype=F64))
    assert s.round == 1
    s.mix(_w(0.0, 0.0), _w(0.0, 0.0), 0.5, 0, a=2.0)  # x <- x - 0.5 x
    torch.testing.assert_close(s.params["w"], torch.tensor([0.2, 0.55], dtype=F64))
    assert s.round == 2


def _momentum_server(b=2):
    alg = build_algorithm("fedavg_server_momentum", server_lr=1.0, server_momentum=0.5)
    return BufferedServer(alg, _w(0.0, 0.0), b, 4)


def test_server_momentum_carries_across_steps_and_through_a_checkpoint():
    """Heavy ball m = 0.5 m + Δ, x -= m: buffers of mean (1, 0) then (0, 2) give
    m = (1, 0), x = (-1, 0); m = (0.5, 2), x = (-1.5, -2)."""
    s = _momentum_server()
    for d in [(2.0, 0.0), (0.0, 0.0)]:
        s.receive(_w(*d))
    assert s.params["w"].tolist() == [-1.0, 0.0]
    s.receive(_w(0.0, 4.0))  # half a buffer before the checkpoint
    tensors, meta = s.state_dict(), s.meta()
    assert meta == {"round": 1, "b": 2, "buf_count": 1}
    assert set(tensors) == {"params", "server", "buf_sum"}
    assert tensors["buf_sum"]["w"].tolist() == [0.0, 4.0]
    fresh = _momentum_server(b=5)
    fresh.load(tensors, meta)
    assert (fresh.round, fresh.b, fresh.buf_count) == (1, 2, 1)
    assert fresh.params["w"].tolist() == [-1.0, 0.0]
    assert fresh.buf_sum["w"].tolist() == [0.0, 4.0]
    for srv in (s, fresh):
        assert srv.receive(_w(0.0, 0.0))
        torch.testing.assert_close(srv.params["w"], torch.tensor([-1.5, -2.0], dtype=F64))


def test_fedasync_uses_the_sent_model():
    """x = (1, 2), sent (2, 0), delta (1, 1): x_i = sent - delta = (1, -1);
    a_t = 0.5 (staleness 0, alpha 0.5): x <- (x + x_i) / 2 = (1, 0.5)."""
    s = BufferedServer(build_algorithm("fedavg"), _w(1.0, 2.0), 1, 10)
    s.mix(_w(2.0, 0.0), _w(1.0, 1.0), 0.5, 0)
    torch.testing.assert_close(s.params["w"], torch.tensor([1.0, 0.5], dtype=F64))


def test_load_names_what_does_not_match_and_needs_no_server_tree():
    s = BufferedServer(build_algorithm("fedavg"), _w(1.0, 2.0), 2, 10)
    s.receive(_w(1.0, 1.0))
    tensors = s.state_dict()
    fresh = BufferedServer(build_algorithm("fedavg"), _w(0.0, 0.0), 2, 10)
    fresh.load({k: v for k, v in tensors.items() if k != "server"}, s.meta())
    assert fresh.buf_sum["w"].tolist() == [1.0, 1.0] and fresh.buf_count == 1
    bad = {"v": torch.zeros(2, dtype=F64)}
    with pytest.raises(ValueError, match=r"^checkpoint params state does not match"):
        fresh.load({**tensors, "params": bad}, s.meta())
    with pytest.raises(ValueError, match=r"^checkpoint buffer state does not match"):
        fresh.load({**tensors, "buf_sum": bad}, s.meta())
