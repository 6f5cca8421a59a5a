"""Max-pooling by strided maxima equals ``F.max_pool2d`` bit for bit, gradients included."""

import pytest
import torch
import torch.nn.functional as F
from torch.func import grad, vmap

from fedforge.engine import classification_loss
from fedforge.engine.pooling import TiledMaxPool2d, first_max_index, max_pool2d_tiled


def _ties(*shape: int) -> torch.Tensor:
    """Small integers: most windows hold several equal maxima."""
    return torch.randint(0, 3, shape, generator=torch.Generator().manual_seed(0)).float()


CASES = {
    "relu": (torch.relu(torch.randn(4, 3, 8, 8, generator=torch.Generator().manual_seed(1))),
             2),
    "ties": (_ties(4, 3, 8, 8), 2),
    "odd sizes": (_ties(4, 3, 9, 7), 2),
    "3x3": (_ties(4, 3, 9, 9), 3),
    "3x3, odd": (_ties(2, 3, 10, 11), 3),
    "3-D input": (_ties(3, 9, 9), 3),
    "channels last": (_ties(4, 8, 8, 8).contiguous(memory_format=torch.channels_last), 2),
    "bf16": (_ties(4, 3, 8, 8).bfloat16(), 2),
}


@pytest.mark.parametrize("name", list(CASES))
def test_values_and_gradients_equal_max_pool2d(name):
    x, k = CASES[name]
    a, b = x.clone().requires_grad_(), x.clone().requires_grad_()
    ref, out = F.max_pool2d(a, k), max_pool2d_tiled(b, k)
    g = torch.randn(ref.shape, generator=torch.Generator().manual_seed(2)).to(x.dtype)
    ref.backward(g)
    out.backward(g)
    assert torch.equal(out, ref)
    assert torch.equal(b.grad, a.grad)  # ties: the same element gets the gradient


@pytest.mark.parametrize("name", ["ties", "3x3", "channels last"])
def test_index_is_torchs(name):
    x, k = CASES[name]
    ref, index = F.max_pool2d(x, k, return_indices=True)
    assert torch.equal(first_max_index(x, ref, k, k), index)


def test_other_windows_fall_back_to_torch():
    x = _ties(2, 3, 8, 8)
    for kwargs in ({"kernel_size": 3, "stride": 1}, {"kernel_size": 2, "padding": 1},
                   {"kernel_size": 2, "ceil_mode": True}, {"kernel_size": 2, "dilation": 2}):
        assert torch.equal(max_pool2d_tiled(x, **kwargs), F.max_pool2d(x, **kwargs))
    out, index = max_pool2d_tiled(x, 2, return_indices=True)
    assert torch.equal(index, F.max_pool2d(x, 2, return_indices=True)[1])


def test_under_vmap_and_grad_as_the_vmapped_engine_runs_it():
    w = torch.randn(5, 3, generator=torch.Generator().manual_seed(3))
    x = _ties(5, 4, 3, 8, 8)

    def loss(pool):
        return lambda wi, xi: (pool(xi * wi.view(1, 3, 1, 1), 2) ** 2).sum()

    assert torch.equal(vmap(grad(loss(max_pool2d_tiled)))(w, x),
                       vmap(grad(loss(F.max_pool2d)))(w, x))


def test_a_non_contiguous_slice_under_vmap_pools_as_torch_does():
    """Inside vmap, torch cannot say whether a client's slice is channels-last; a conv's
    output in the vmapped engine is such a slice (found by the pFL examples)."""
    x = _ties(5, 4, 8, 8, 3).permute(0, 1, 4, 2, 3)  # each client's batch is NHWC in memory
    assert torch.equal(vmap(lambda xi: max_pool2d_tiled(xi, 2))(x),
                       vmap(lambda xi: F.max_pool2d(xi, 2))(x))


def test_the_classification_loss_routes_the_models_pooling_layers(monkeypatch):
    """The loss makes a model's nn.MaxPool2d layers pool here (their class, not a mode
    around every operator); other layers and models are left as they are."""
    import fedforge.engine.pooling as pooling

    calls = []
    monkeypatch.setattr(pooling, "max_pool2d_tiled",
                        lambda *a, **k: calls.append(a[1]) or max_pool2d_tiled(*a, **k))
    model = torch.nn.Sequential(torch.nn.Conv2d(1, 2, 3), torch.nn.MaxPool2d(2),
                                torch.nn.Flatten(), torch.nn.Linear(2 * 3 * 3, 3))
    params = dict(model.named_parameters())
    x, y, w = _ties(4, 1, 8, 8), torch.tensor([0, 1, 2, 0]), torch.ones(4)
    with torch.no_grad():
        ref = F.cross_entropy(model(x), y)
    loss = classification_loss(model)
    assert type(model[1]) is TiledMaxPool2d and loss.tiled_pooling
    assert [type(m) for m in (model[0], model[2], model[3])] == [
        torch.nn.Conv2d, torch.nn.Flatten, torch.nn.Linear]
    torch.testing.assert_close(loss(params, x, y, w), ref)
    assert calls == [2]
    assert not classification_loss(torch.nn.Sequential(torch.nn.Flatten())).tiled_pooling


def test_a_compiled_forward_keeps_torchs_pooling(monkeypatch):
    """Under torch.compile the routed layer is nn.MaxPool2d again (inductor's kernels)."""
    import fedforge.engine.pooling as pooling

    monkeypatch.setattr(pooling, "max_pool2d_tiled", lambda *a, **k: pytest.fail("tiled"))
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    layer = TiledMaxPool2d(2)
    x = _ties(2, 3, 8, 8)
    assert torch.equal(layer(x), F.max_pool2d(x, 2))
