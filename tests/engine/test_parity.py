"""LoopEngine (reference) and VmapEngine agree for every registered algorithm and model family.

Two rounds, four clients of unequal sizes (one client's later steps are padding, so the masked
path runs), vmap chunks of 3 so the last chunk is ragged. Parameters, server state and the
per-client store must agree to float tolerance.
"""

import pytest
import torch
from torch.utils._pytree import tree_leaves

from fedforge.algorithms import ALGORITHMS, algorithm_hparams, build_algorithm
from fedforge.core.store import ClientStore
from fedforge.core.tree import flatten_dict
from fedforge.engine import LoopEngine, VmapEngine, classification_loss
from fedforge.engine.draw import RoundDraw
from fedforge.engine.local import autograd_grad_and_value
from fedforge.engine.randomness import KeyedRandomness
from fedforge.engine.round import RoundSetup, federated_round
from fedforge.models import build_model

MODELS = {
    "mlp": ((1, 6, 6), {"hidden": (16,)}, "image"),
    "cnn": ((1, 12, 12), {"channels": (4, 8), "fc": 16}, "image"),
    "simple_cnn": ((1, 16, 16), {"channels": (4, 8), "fc": 16}, "image"),  # dropout, keyed
    "char_lstm": ((7,), {"vocab_size": 12, "embed_dim": 4, "hidden": 8, "layers": 2}, "tokens"),
}
NUM_CLASSES, CLIENTS, STEPS, BATCH = 5, 4, 3, 4


def _data(kind, shape, vocab=12):
    g = torch.Generator().manual_seed(0)
    n = CLIENTS * STEPS * BATCH
    if kind == "tokens":
        x = torch.randint(0, vocab, (n, *shape), generator=g)
    else:
        x = torch.randn((n, *shape), generator=g)
    y = torch.randint(0, NUM_CLASSES, (n,), generator=g)
    sample_idx = torch.arange(n).view(CLIENTS, STEPS, BATCH)
    weights = torch.ones(CLIENTS, STEPS, BATCH)
    weights[1, 2] = 0.0  # client 1 has only two steps of data: its last step is padding
    weights[2, 1, 2:] = 0.0  # client 2 has a partial batch
    return x, y, sample_idx, weights


def _run(algorithm, engine, model, x, y, sample_idx, weights, rounds=2):
    torch.manual_seed(0)
    params = {k: v.detach().clone() for k, v in model.named_parameters()}
    loss_fn = classification_loss(model)
    algorithm.bind_population(CLIENTS + 2)  # AFL's weight per client
    algorithm.bind_model(model)  # FedProto's features
    state = algorithm.server_init(params)
    store = ClientStore(CLIENTS + 2, algorithm.client_init(params))
    ids = torch.arange(CLIENTS)
    for r in range(rounds):
        gen = torch.Generator().manual_seed(r)
        info = algorithm.round_info(CLIENTS, gen)
        draw = RoundDraw(ids, sample_idx, weights, info=info,
                         counts=weights.sum((1, 2)))  # n_i: FedNova's weighted uploads
        params, state, _ = federated_round(RoundSetup(algorithm, engine, loss_fn, store, x, y),
                                           params, state, draw)
    return params, state, store


def _hparams(name):
    return {"local_lr": 0.05} if "local_lr" in algorithm_hparams(name) else {}


@pytest.mark.parametrize("model_name", MODELS)
@pytest.mark.parametrize("algo_name", sorted(ALGORITHMS))
def test_loop_and_vmap_agree(algo_name, model_name):
    shape, kwargs, kind = MODELS[model_name]
    torch.manual_seed(0)
    model = build_model(model_name, shape, NUM_CLASSES, **kwargs)
    x, y, sample_idx, weights = _data(kind, shape)
    algorithm = build_algorithm(algo_name, **_hparams(algo_name))
    ref = _run(algorithm, LoopEngine(), model, x, y, sample_idx, weights)
    fast = _run(algorithm, VmapEngine(chunk_size=3), model, x, y, sample_idx, weights)
    assert_same_run(ref, fast, rtol=1e-4)


class _UntrimmedLoop(LoopEngine):
    """The loop that runs every client for the cohort's longest schedule, padding included."""

    def trim_steps(self, idx, ws):
        return idx, ws


@pytest.mark.parametrize("algo_name", sorted(ALGORITHMS))
def test_loop_skips_trailing_padding_bit_for_bit(algo_name):
    """A padded step changes nothing, so skipping it (client 1's last step) is exact."""
    shape, kwargs, kind = MODELS["mlp"]
    torch.manual_seed(0)
    model = build_model("mlp", shape, NUM_CLASSES, **kwargs)
    x, y, sample_idx, weights = _data(kind, shape)
    algorithm = build_algorithm(algo_name, **_hparams(algo_name))
    assert LoopEngine().trim_steps(sample_idx[1:2], weights[1:2])[1].shape[1] == STEPS - 1
    ref = _run(algorithm, _UntrimmedLoop(), model, x, y, sample_idx, weights)
    got = _run(algorithm, LoopEngine(), model, x, y, sample_idx, weights)
    assert_same_run(ref, got, rtol=0, atol=0)


@pytest.mark.parametrize("algo_name", sorted(ALGORITHMS))
def test_channels_last_loop_agrees_and_returns_contiguous(algo_name):
    """The channels-last loop changes only the layout the convolutions run in: the run agrees
    with the plain loop to float tolerance (other kernels) and hands back ordinary tensors."""
    shape, kwargs, kind = MODELS["cnn"]
    torch.manual_seed(0)
    model = build_model("cnn", shape, NUM_CLASSES, **kwargs)
    x, y, sample_idx, weights = _data(kind, shape)
    algorithm = build_algorithm(algo_name, **_hparams(algo_name))
    ref = _run(algorithm, LoopEngine(), model, x, y, sample_idx, weights)
    engine = _RecordingLoop(channels_last=True)
    got = _run(algorithm, engine, model, x, y, sample_idx, weights)
    assert_same_run(ref, got, rtol=1e-4)
    params, state, store = got
    leaves = [*flatten_dict(params).values(), *flatten_dict(state).values(),
              *store.state_dict().values(), *tree_leaves(engine.outputs)]
    assert engine.outputs and all(t.is_contiguous() for t in leaves if torch.is_tensor(t))


class _RecordingLoop(LoopEngine):
    """The loop, keeping each client's output (delta, state, uploads, metrics) as it leaves
    the engine's chunk function, before chunks are concatenated."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.outputs = []

    def wrap(self, fn):
        chunk_fn = super().wrap(fn)

        def recorded(*args):
            self.outputs.append(out := chunk_fn(*args))
            return out

        return recorded


def assert_same_run(ref, got, rtol: float, atol: float = 1e-5) -> None:
    """``_run`` results agree: parameters, server state and every client's stored state."""
    for a, b in zip(ref[:2], got[:2]):
        fa, fb = flatten_dict(a), flatten_dict(b)
        assert fa.keys() == fb.keys()
        for k in fa:
            torch.testing.assert_close(fa[k], fb[k], rtol=rtol, atol=atol, msg=k)
    for k, v in ref[2].state_dict().items():
        torch.testing.assert_close(v, got[2].state_dict()[k], rtol=rtol, atol=atol, msg=k)


@pytest.mark.parametrize("model_name", MODELS)
def test_loop_gradients_equal_functorch_bit_for_bit(model_name):
    """The loop's plain-autograd gradients are torch.func's, and an unused parameter (here a
    spare one added to the dict) gets zeros as under torch.func."""
    shape, kwargs, kind = MODELS[model_name]
    torch.manual_seed(0)
    model = build_model(model_name, shape, NUM_CLASSES, **kwargs)
    x, y, sample_idx, weights = _data(kind, shape)
    loss_fn = classification_loss(model)
    params = {k: v.detach().clone() for k, v in model.named_parameters()}
    batch = (x[sample_idx[2, 1]], y[sample_idx[2, 1]], weights[2, 1])  # a partial batch
    with KeyedRandomness(torch.tensor(3), 0, "test"):  # dropout: the same mask both ways
        want_g, want_loss = torch.func.grad_and_value(loss_fn)(params, *batch)
    with KeyedRandomness(torch.tensor(3), 0, "test"):
        got_g, got_loss = autograd_grad_and_value(loss_fn)(params, *batch)
    assert torch.equal(got_loss, want_loss) and not got_loss.requires_grad
    assert got_g.keys() == want_g.keys()
    assert all(torch.equal(got_g[k], want_g[k]) for k in want_g)
    spare = {**params, "spare": torch.ones(3)}
    unused = autograd_grad_and_value(lambda p, *b: loss_fn(
        {k: v for k, v in p.items() if k != "spare"}, *b))(spare, *batch)[0]
    assert torch.equal(unused["spare"], torch.zeros(3))
