"""Every engine is deterministic for a model with dropout and max-pooling.

The zoo's ``simple_cnn`` (two 5x5 convolutions with max-pooling, fc, dropout) on tiny
synthetic images, FedAvg, 2 rounds: the same config twice gives the same bits under the loop,
vmap and procs engines; the engines draw the same dropout masks (so they agree to float
rounding, where unkeyed masks would differ at once); a resumed run equals an uninterrupted
one; the procs engine combines its workers' results in shard order whichever finishes first;
a random layer that cannot be keyed is refused in one line naming the engine and the layer.
"""

from __future__ import annotations

import copy
import os
import time

import pytest
import torch
from torch import nn
from torch.func import vmap

from fedforge.algorithms import build_algorithm
from fedforge.core.store import ClientStore
from fedforge.engine import LoopEngine, ProcessEngine, VmapEngine, classification_loss
from fedforge.engine.draw import RoundDraw
from fedforge.engine.pooling import TiledMaxPool2d
from fedforge.engine.procs import WorkerPool
from fedforge.engine.randomness import KeyedRandomness, RandomLayerError, client_keys
from fedforge.engine.round import RoundSetup, federated_round
from fedforge.models import build_model

SHAPE, CLASSES, CLIENTS, STEPS, BATCH, SEED = (3, 16, 16), 10, 5, 2, 4, 11


def _model() -> nn.Module:
    torch.manual_seed(0)
    return build_model("simple_cnn", SHAPE, CLASSES, channels=(4, 8), fc=16)


def _data():
    g = torch.Generator().manual_seed(1)
    n = CLIENTS * STEPS * BATCH
    x = torch.randn((n, *SHAPE), generator=g)
    y = torch.randint(0, CLASSES, (n,), generator=g)
    return x, y, torch.arange(n).view(CLIENTS, STEPS, BATCH), torch.ones(CLIENTS, STEPS, BATCH)


def _rounds(engine, model, rounds=range(1, 3), start=None):
    """FedAvg rounds of ``model`` -> (params, server state, store); ``start`` resumes."""
    x, y, idx, w = _data()
    algorithm = build_algorithm("fedavg", local_lr=0.1)
    loss_fn = classification_loss(model)
    if start is None:
        params = {k: v.detach().clone() for k, v in model.named_parameters()}
        state = algorithm.server_init(params)
        store = ClientStore(CLIENTS, algorithm.client_init(params))
    else:
        params, state, store = start
    for t in rounds:
        torch.manual_seed(1000 + t)  # the global generator must not matter
        draw = RoundDraw(torch.arange(CLIENTS), idx, w, round=t).with_keys(SEED)
        params, state, _ = federated_round(RoundSetup(algorithm, engine, loss_fn, store, x, y),
                                           params, state, draw)
    return params, state, store


def _equal(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.fixture(scope="module")
def procs():
    with ProcessEngine(workers=2) as engine:
        yield engine


def _engine(name: str, procs_engine):
    return {"loop": LoopEngine, "vmap": lambda: VmapEngine(chunk_size=2)}[name]() \
        if name != "procs" else procs_engine


@pytest.mark.parametrize("name", ["loop", "vmap", "procs"])
def test_same_config_twice_gives_the_same_bits(name, procs):
    engine = _engine(name, procs)
    first = _rounds(engine, _model())[0]
    again = _rounds(engine, _model())[0]
    assert _equal(first, again)
    if name == "procs":
        assert engine.fallback is None and len(engine.processes) == 2  # it ran in workers


def test_engines_draw_the_same_masks(procs):
    """Unkeyed masks would move the weights by about the learning rate; the engines differ
    only by float rounding of their kernels and sums."""
    ref = _rounds(LoopEngine(), _model())[0]
    for engine in (VmapEngine(chunk_size=2), VmapEngine(chunk_size=CLIENTS), procs):
        got = _rounds(engine, _model())[0]
        for k in ref:
            torch.testing.assert_close(got[k], ref[k], rtol=0, atol=1e-6)


def test_masks_are_bit_identical_under_vmap_and_per_client():
    """The keyed masks themselves: a dropout layer under vmap over clients' keys gives each
    client exactly the output of the client run alone."""
    layer = nn.Dropout(0.5)
    keys = client_keys(SEED, 3, torch.tensor([0, 4, 9]))
    x = torch.randn(6, 7)

    def one(key):
        with KeyedRandomness(key, 2, "test"):
            return layer(x)

    batched = vmap(one)(keys)
    for i, key in enumerate(keys):
        assert torch.equal(batched[i], one(key))
    assert not torch.equal(batched[0], batched[1])  # clients' masks differ
    assert 0.3 < (batched == 0).float().mean() < 0.7


@pytest.mark.parametrize("name", ["loop", "vmap", "procs"])
def test_resumed_run_equals_uninterrupted(name, procs):
    full = _rounds(_engine(name, procs), _model())
    half = _rounds(_engine(name, procs), _model(), rounds=[1])
    torch.manual_seed(12345)  # a new process: another global generator state
    resumed = _rounds(_engine(name, procs), _model(), rounds=[2], start=half)
    assert _equal(full[0], resumed[0])


def _sleepy():
    """A worker's handler that sleeps the seconds it is sent, then names its process."""
    return lambda task, seconds: (time.sleep(seconds), (seconds, os.getpid()))[1]


def test_worker_replies_come_back_in_worker_order_whoever_finishes_first():
    with WorkerPool(2, _sleepy) as pool:
        pids = [p.pid for p in pool.processes]
        got = pool.call("sleep", [0.5, 0.0])  # worker 0 finishes last
    assert got == [(0.5, pids[0]), (0.0, pids[1])]


def test_max_pool_replacement_gives_torch_gradients_bit_for_bit():
    model = _model().eval()  # no dropout: both losses see the same network
    x, y, _, _ = _data()
    params = dict(model.named_parameters())
    reference = copy.deepcopy(model)  # nn.MaxPool2d's own kernels
    tiled, plain = classification_loss(model), classification_loss(reference)
    for m in reference.modules():
        if isinstance(m, TiledMaxPool2d):
            m.__class__ = nn.MaxPool2d
    assert tiled.tiled_pooling and not any(isinstance(m, TiledMaxPool2d)
                                           for m in reference.modules())

    def grads(loss):
        return torch.autograd.grad(loss(params, x[:8], y[:8], torch.ones(8)), list(params.values()))

    assert all(torch.equal(a, b) for a, b in zip(grads(tiled), grads(plain), strict=True))


class _RReLUNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Flatten(), nn.Linear(768, 8), nn.RReLU(), nn.Linear(8, 10))

    def forward(self, x):
        return self.body(x)


class _NoisyNet(nn.Module):
    """Draws noise in its forward pass, outside any layer (and has no dropout layer)."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(768, 10)

    def forward(self, x):
        return self.fc(x.flatten(1) + torch.randn_like(x.flatten(1)))


@pytest.mark.parametrize("name", ["loop", "vmap", "procs"])
def test_a_random_layer_that_cannot_be_keyed_is_refused_in_one_line(name, procs):
    with pytest.raises(RandomLayerError) as err:
        _rounds(_engine(name, procs), _RReLUNet())
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith(f"engine {name}: ") and "'body.2' (RReLU)" in msg


def test_vmap_refuses_noise_outside_layers_in_one_line():
    with pytest.raises(RandomLayerError) as err:
        _rounds(VmapEngine(chunk_size=2), _NoisyNet())
    assert "\n" not in str(err.value) and str(err.value).startswith("engine vmap: ")


def test_random_function_beside_dropout_is_refused_in_one_line():
    class DropNoisy(_NoisyNet):
        def __init__(self):
            super().__init__()
            self.drop = nn.Dropout(0.2)

        def forward(self, x):
            return self.drop(super().forward(x))

    with pytest.raises(RandomLayerError) as err:
        _rounds(LoopEngine(), DropNoisy())
    assert "\n" not in str(err.value) and "randn_like" in str(err.value)


def test_float64_run_aggregates_with_float64_weights():
    seen = []

    class Spy(LoopEngine):
        def run_cohort(self, algorithm, loss_fn, x_all, y_all, inputs):
            seen.append(inputs.agg_weights.dtype)
            return super().run_cohort(algorithm, loss_fn, x_all, y_all, inputs)

    model = build_model("logreg", (4,), 3).double()
    params = {k: v.detach().clone() for k, v in model.named_parameters()}
    algorithm = build_algorithm("fedavg", local_lr=0.1)
    x, y = torch.randn(12, 4, dtype=torch.float64), torch.randint(0, 3, (12,))
    idx, w = torch.arange(12).view(3, 2, 2), torch.ones(3, 2, 2, dtype=torch.float64)
    setup = RoundSetup(algorithm, Spy(), classification_loss(model),
                       ClientStore(3, algorithm.client_init(params)), x, y)
    federated_round(setup, params, algorithm.server_init(params),
                    RoundDraw(torch.arange(3), idx, w))
    assert seen == [torch.float64]


def test_evaluation_runs_without_dropout():
    from fedforge.engine.evaluate import predict

    model = _model()
    params = {k: v.detach() for k, v in model.named_parameters()}
    x = _data()[0][:6]
    assert torch.equal(predict(model, params, x), predict(model, params, x))
    assert model.training  # the training mode is left as it was


@pytest.mark.parametrize("int32_indices", [2**31, 10])  # int32 words, and the int64 path
def test_dropout_mask_bits_follow_the_documented_hash(int32_indices, monkeypatch):
    """Bit ``i`` is kept iff the top 24 bits of hash_u32(fmix32(key ^ stream), i) reach
    p * 2^24, in either word width."""
    from fedforge.comm import rng
    from fedforge.engine import randomness

    monkeypatch.setattr(randomness, "INT32_INDICES", int32_indices)
    key, stream, p = 0xDEADBEEF, (3 << 16) ^ 1, 0.25
    mask = randomness.dropout_mask(torch.tensor(key), stream, (4, 9), p, torch.device("cpu"))
    k = int(rng.mix32(torch.tensor(key ^ stream)))
    bits = rng.hash_u32(torch.tensor(k), torch.arange(36)) >> 8
    assert mask.shape == (4, 9) and mask.dtype == torch.bool
    assert mask.flatten().tolist() == (bits >= round(p * 2**24)).tolist()
    assert 0 < mask.sum() < 36
