"""Batched convolution and pooling for vmapped clients equal torch's to float tolerance.

Each strategy (grouped, loop, bmm) is checked forward and backward against a per-client
``F.conv2d`` on shapes with padding, stride, dilation, groups and no bias; the engine runs
every registered algorithm on LeNet-5-like and CNN shapes with the batched kernels and must
agree with the loop (the reference).
"""

import pytest
import torch
import torch.nn.functional as F
from torch.func import grad, vmap

from fedforge.algorithms import ALGORITHMS, build_algorithm
from fedforge.engine import LoopEngine, VmapEngine
from fedforge.engine.batched_conv import (
    STRATEGIES,
    BatchedConvMode,
    ConvPlans,
)
from fedforge.models import build_model
from tests.engine.test_parity import _data, _hparams, _run, assert_same_run

CASES = {  # name: (x shape [C, N, Ci, H, W], w shape [C, O, Ci/g, k, k], conv kwargs, bias)
    "pad": ((3, 2, 2, 7, 7), (3, 4, 2, 3, 3), {"padding": 1}, True),
    "stride_dil": ((2, 3, 3, 9, 8), (2, 5, 3, 3, 2), {"stride": 2, "dilation": (2, 1)}, True),
    "groups": ((2, 2, 4, 6, 6), (2, 6, 2, 3, 3), {"groups": 2}, True),
    "nobias": ((3, 2, 1, 5, 5), (3, 2, 1, 5, 5), {"padding": 2}, False),
}


def _loss(conv):
    def loss(x, w, b):
        out = conv(x, w, b)
        return (out * torch.linspace(-1, 1, out.numel()).view(out.shape)).sum()
    return loss


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("case", CASES)
def test_each_strategy_equals_conv2d_forward_and_backward(strategy, case):
    xs, ws, kw, bias = CASES[case]
    if strategy == "bmm" and kw.get("groups", 1) > 1:
        strategy = "loop"  # bmm serves groups == 1 only; ConvPlans falls back to loop
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(xs, generator=g), torch.randn(ws, generator=g)
    b = torch.randn(ws[:2], generator=g) if bias else None

    def ref(x, w, b):
        return F.conv2d(x, w, b, **kw)

    plans = ConvPlans(strategy)

    def got(x, w, b):
        with BatchedConvMode(plans):
            return F.conv2d(x, w, b, **kw)

    dims = (0, 0, 0 if bias else None)
    torch.testing.assert_close(vmap(got, in_dims=dims)(x, w, b), vmap(ref, in_dims=dims)(x, w, b),
                               rtol=1e-5, atol=1e-5)
    argnums = (0, 1, 2) if bias else (0, 1)
    g_ref = vmap(grad(_loss(ref), argnums=argnums), in_dims=dims)(x, w, b)
    g_got = vmap(grad(_loss(got), argnums=argnums), in_dims=dims)(x, w, b)
    for a, e in zip(g_got, g_ref):
        torch.testing.assert_close(a, e, rtol=1e-4, atol=1e-4)


def test_auto_plans_pick_a_measured_strategy_per_shape_and_reload():
    plans = ConvPlans("auto", repeats=1)
    x, w, b = torch.randn(2, 3, 2, 6, 6), torch.randn(2, 4, 2, 3, 3), torch.randn(2, 4)

    def f(x, w, b):
        with BatchedConvMode(plans):
            return F.conv2d(x, w, b).sum()

    vmap(grad(f, argnums=(0, 1)))(x, w, b)
    assert len(plans.plans) == 2  # one forward and one backward shape
    assert set(plans.plans.values()) <= set(STRATEGIES)
    assert all(set(t) == set(STRATEGIES) for t in plans.timings.values())
    again = ConvPlans("auto")
    again.load_state_dict(plans.state_dict())
    assert again.plans == plans.plans
    with pytest.raises(ValueError, match="unknown strategy"):
        again.load_state_dict({"k": "fft"})
    with pytest.raises(ValueError, match="conv strategy"):
        ConvPlans("fft")


LENET_LIKE = ("cnn", (1, 12, 12), {"channels": (3, 5), "fc": 8})


@pytest.mark.parametrize("strategy", ["auto", *STRATEGIES])
def test_engine_with_batched_conv_agrees_with_loop(strategy):
    algo_name = "scaffold"
    name, shape, kwargs = LENET_LIKE
    torch.manual_seed(0)
    model = build_model(name, shape, 5, **kwargs)
    x, y, sample_idx, weights = _data("image", shape)
    algorithm = build_algorithm(algo_name, **_hparams(algo_name))
    ref = _run(algorithm, LoopEngine(), model, x, y, sample_idx, weights)
    fast = _run(algorithm, VmapEngine(chunk_size=3, conv=strategy), model, x, y, sample_idx,
                weights)
    assert_same_run(ref, fast, rtol=1e-4)


DEFAULT_SUITE = ("fadamgc", "fedavg", "scaffold")  # CI=true runs the whole registry


@pytest.mark.parametrize("algo_name", [
    a if a in DEFAULT_SUITE else pytest.param(a, marks=pytest.mark.slow)
    for a in sorted(ALGORITHMS)])
def test_every_algorithm_with_batched_conv(algo_name):
    """Each algorithm with one strategy (rotating by name, so every strategy meets several)."""
    strategy = STRATEGIES[sorted(ALGORITHMS).index(algo_name) % len(STRATEGIES)]
    name, shape, kwargs = LENET_LIKE
    torch.manual_seed(0)
    model = build_model(name, shape, 5, **kwargs)
    x, y, sample_idx, weights = _data("image", shape)
    algorithm = build_algorithm(algo_name, **_hparams(algo_name))
    ref = _run(algorithm, LoopEngine(), model, x, y, sample_idx, weights)
    fast = _run(algorithm, VmapEngine(chunk_size=3, conv=strategy), model, x, y, sample_idx,
                weights)
    assert_same_run(ref, fast, rtol=1e-4)


def test_unknown_conv_mode_names_the_field():
    with pytest.raises(ValueError, match="engine.conv"):
        VmapEngine(conv="fft")


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_bf16_autocast_runs_each_strategy_in_bf16_with_fp32_weight_grads(strategy):
    g = torch.Generator().manual_seed(0)
    x, w, b = (torch.randn(2, 3, 2, 6, 6, generator=g), torch.randn(2, 4, 2, 3, 3, generator=g),
               torch.randn(2, 4, generator=g))
    plans = ConvPlans(strategy)

    def loss(x, w, b, batched):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            if batched:
                with BatchedConvMode(plans):
                    out = F.conv2d(x, w, b, padding=1)
            else:
                out = F.conv2d(x, w, b, padding=1)
        assert out.dtype == torch.bfloat16  # no round trip through fp32 inside the layer
        return (out.float() * torch.linspace(-1, 1, out.numel()).view(out.shape)).sum()

    got = vmap(grad(lambda *a: loss(*a, True), argnums=(0, 1, 2)))(x, w, b)
    ref = vmap(grad(lambda *a: loss(*a, False), argnums=(0, 1, 2)))(x, w, b)
    for a, e in zip(got, ref):
        assert a.dtype == torch.float32
        torch.testing.assert_close(a, e, rtol=3e-2, atol=3e-2)
