"""FedAMS-style floor on the server Adam denominator, with and without AMSGrad."""

import torch


def test_server_adam_floor_without_amsgrad_has_no_nan():
    """A zero coordinate of Δ with a floor: the step is 0 there, not 0/0."""
    from fedforge.server.optimizers import server_adam

    opt = server_adam(lr=0.1, b1=0.0, b2=0.5, floor=1e-6, amsgrad=False)
    params = {"w": torch.zeros(2, dtype=torch.float64)}
    delta = {"w": torch.tensor([0.0, 2.0], dtype=torch.float64)}
    updates, _ = opt.update(delta, opt.init(params), params)
    # v = 0.5 Δ² = (0, 2); step = -η m / sqrt(max(v, floor)) = (0, -0.1 * 2 / sqrt(2))
    torch.testing.assert_close(updates["w"], torch.tensor([0.0, -0.2 / 2**0.5],
                                                          dtype=torch.float64))
