"""FedProx's proximal term at values where a wrong formula gives another number: with
mu = 0.1 and x - x^t = 3, mu (x - x^t) = 0.3, while (x - x^t) / mu = 30, mu / (x - x^t) =
0.033 and mu (x^t - x) = -0.3 (at mu = 0.5 and a difference of 1, mu / d equals mu d)."""

import torch

from fedforge.client.transforms import RoundContext, add_prox

F64 = torch.float64


def test_prox_term_is_mu_times_the_distance_to_the_broadcast_model():
    x_t = torch.tensor([0.5, 0.25, -1.0], dtype=F64)
    x = x_t + torch.tensor([3.0, -2.0, 0.5], dtype=F64)
    g = torch.tensor([1.0, -2.0, 3.0], dtype=F64)
    c = RoundContext({"w": x_t}, {"round": torch.tensor(1.0, dtype=F64)}, {}, {})
    tx = add_prox(0.1)
    out, _ = tx.update({"w": g}, tx.init({"w": x}, c), {"w": x}, c)
    torch.testing.assert_close(out["w"], g + torch.tensor([0.3, -0.2, 0.05], dtype=F64))
