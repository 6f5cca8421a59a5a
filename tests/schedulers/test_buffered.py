"""Buffer semantics with hand numbers (FedAST Alg. 2 lines 7-11, FedAsync mixing)."""

import pytest
import torch

from fedforge.algorithms import build_algorithm
from fedforge.schedulers.buffered import BufferedServer


def _server(b, server_lr):
    alg = build_algorithm("fedavg", local_lr=0.1, server_lr=server_lr)
    return BufferedServer(alg, {"w": torch.tensor([1.0, 2.0], dtype=torch.float64)}, b, 10)


def test_step_exactly_when_buffer_full():
    """b = 3, eta_s = 0.5: deltas (1,2), (3,0), (-1,1) -> mean (1, 1);
    x = (1, 2) - 0.5 * (1, 1) = (0.5, 1.5) after the third arrival, not before."""
    s = _server(3, 0.5)
    deltas = [[1.0, 2.0], [3.0, 0.0], [-1.0, 1.0]]
    stepped = [s.receive({"w": torch.tensor(d, dtype=torch.float64)}) for d in deltas]
    assert stepped == [False, False, True]
    assert s.params["w"].tolist() == [0.5, 1.5]
    assert s.round == 1 and s.buf_count == 0 and s.buf_sum["w"].abs().sum() == 0
    # the next buffer starts empty: two more arrivals do not step
    assert not s.receive({"w": torch.ones(2, dtype=torch.float64)})
    assert s.params["w"].tolist() == [0.5, 1.5]


def test_no_buffer_and_weights():
    s = _server(1, 0.1)
    assert s.receive({"w": torch.tensor([10.0, -10.0], dtype=torch.float64)}, weight=0.5)
    assert s.params["w"].tolist() == pytest.approx([0.5, 2.5])  # 1 - 0.1*5, 2 + 0.1*5


def test_fedasync_mixing_hand_numbers():
    """x = (1,2), sent (0,0), delta (1,1) so x_i = (-1,-1); staleness 3, alpha 0.6, a 0.5:
    a_t = 0.6 / 2 = 0.3; x <- 0.7 x + 0.3 x_i = (0.4, 1.1)."""
    s = _server(1, 1.0)
    zero = {"w": torch.zeros(2, dtype=torch.float64)}
    s.mix(zero, {"w": torch.ones(2, dtype=torch.float64)}, 0.6, 3, 0.5)
    assert s.params["w"].tolist() == pytest.approx([0.4, 1.1])
