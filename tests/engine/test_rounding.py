"""bf16 weights with stochastic rounding (engine.precision = "bf16_sr",
fedforge.engine.rounding): unbiased, keyed by (client, step, parameter), and a two-step SGD
round that round-to-nearest would not give."""

from __future__ import annotations

import torch
from torch import nn

from fedforge.algorithms import build_algorithm
from fedforge.engine import classification_loss
from fedforge.engine.local import local_update_of
from fedforge.engine.randomness import CLIENT_KEY
from fedforge.engine.rounding import nearest, random_bits, rounding_key, stochastic_round

ULP = 2.0**-7  # bf16's gap in [1, 2)


def _sr(x: torch.Tensor, key: int, step: int = 0, leaf: int = 0) -> torch.Tensor:
    k = rounding_key(torch.tensor(key, dtype=torch.int64), step, leaf)
    return stochastic_round(x, random_bits(k, x.shape, x.device))


def test_stochastic_rounding_is_unbiased_where_nearest_is_not():
    for frac, sign in ((0.3, 1.0), (0.8, -1.0)):
        v = sign * (1.0 + frac * ULP)
        x = torch.full((20000,), v)
        got = _sr(x, key=7)
        lo, hi = sign * 1.0, sign * (1.0 + ULP)
        assert set(got.tolist()) == {lo, hi}  # only the two bf16 neighbours
        assert abs(float(got.double().mean()) - v) < 1e-4  # std of the mean: 2.6e-5
        assert abs(float(nearest(x).double().mean()) - v) > 1e-3  # nearest: 0.3 or 0.2 ULP off
    exact = torch.tensor([1.0, -0.5, 3.0 + 2 * ULP * 2])  # already bf16: unchanged
    assert torch.equal(_sr(exact, key=1), exact)


def test_the_bits_are_a_function_of_key_step_and_parameter():
    x = torch.full((4096,), 1.0 + 0.5 * ULP)
    assert torch.equal(_sr(x, 3, step=2, leaf=1), _sr(x, 3, step=2, leaf=1))
    for other in (_sr(x, 3, step=3, leaf=1), _sr(x, 3, step=2, leaf=0), _sr(x, 4, 2, 1)):
        assert not torch.equal(other, _sr(x, 3, step=2, leaf=1))
    bits = random_bits(torch.tensor(5), torch.Size([3]), torch.device("cpu"))
    assert bits.dtype == torch.int32 and bool(((bits >= 0) & (bits < 2**16)).all())


G = torch.Generator().manual_seed(0)
XS = torch.randn(2, 1, 8, generator=G)  # 2 steps, batch 1, 8 features
YS = torch.tensor([[0], [2]])
START = {"weight": 1.0 + torch.rand(3, 8, generator=G) * 0.9,  # between bf16 values in [1, 2)
         "bias": torch.tensor([1.0, -1.0, 0.5])}


def _round(precision: str, lr: float, key: int):
    """One client's two local SGD steps on a linear model under ``precision``: (start,
    trained, loss)."""
    loss_fn = classification_loss(nn.Linear(8, 3), precision)
    local = local_update_of(build_algorithm("fedavg", local_lr=lr), loss_fn, masked=False)
    info = {CLIENT_KEY: torch.tensor(key, dtype=torch.int64)}
    out = local(START, {}, {}, info, XS, YS, torch.ones(2, 1))
    return START, {k: START[k] - out.delta[k] for k in START}, loss_fn


def _reference(start: dict, loss_fn, lr: float, key: int, rounding) -> dict:
    """x_0 = nearest(x^t); x_{k+1} = round(x_k - lr grad_k) with ``rounding(x, step, leaf)``."""
    p = {k: nearest(v) for k, v in start.items()}
    for step in range(2):
        g = torch.func.grad(loss_fn)(p, XS[step], YS[step], torch.ones(1))
        p = {k: rounding(v - lr * g[k], step, j) for j, (k, v) in enumerate(p.items())}
    return p


def test_two_sgd_steps_round_stochastically_under_the_client_key():
    lr, key = 0.001, 11  # steps of about 0.0005: below half of bf16's gap at 1 (0.0039)
    start, got, loss_fn = _round("bf16_sr", lr, key)
    want = _reference(start, loss_fn, lr, key, lambda x, s, j: _sr(x, key, s, j))
    for k in want:
        assert torch.equal(got[k], want[k]), k
        assert torch.equal(got[k], nearest(got[k]))  # on bf16's grid
    rtn = _reference(start, loss_fn, lr, key, lambda x, s, j: nearest(x))
    assert any(not torch.equal(got[k], rtn[k]) for k in want)  # nearest drops the steps
    assert all(torch.equal(rtn[k], nearest(start[k])) for k in want)
    assert not all(torch.equal(got[k], _round("bf16_sr", lr, key + 1)[1][k]) for k in want)
    bf16 = _round("bf16", lr, key)[1]  # bf16 compute alone keeps float32 weights
    assert any(not torch.equal(bf16[k], nearest(bf16[k])) for k in bf16)
