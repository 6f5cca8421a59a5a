"""Conformance over the whole model zoo: every registered model under every in-process engine.

For each model of ``fedforge.models.MODELS`` (a new one is covered without editing this file;
its small test configuration is ``tests/models/test_models.py``'s ``CASES``, which must name
every model), two FedAvg rounds on a few clients:

* the loop engine and the vmapped engine each give the same bits when run twice, whatever
  the global generator holds (dropout masks are keyed by seed, round and client);
* the two engines agree to float tolerance (they draw the same masks).

Every algorithm on a few models is ``tests/engine/test_parity.py``; worker processes on a
model with dropout are ``tests/reliability/test_engine_determinism.py``.
"""

from __future__ import annotations

import pytest
import torch

from fedforge.algorithms import build_algorithm
from fedforge.core.store import ClientStore
from fedforge.engine import LoopEngine, VmapEngine, classification_loss
from fedforge.engine.draw import RoundDraw
from fedforge.engine.randomness import keyed_layers
from fedforge.engine.round import RoundSetup, federated_round
from fedforge.models import MODELS, build_model
from tests.models.test_models import CASES

CLIENTS, STEPS, BATCH = 3, 2, 2


def _case(name: str):
    shape, classes, kwargs, token, vocab = CASES[name]
    g = torch.Generator().manual_seed(0)
    n = CLIENTS * STEPS * BATCH
    x = (torch.randint(1, vocab, (n, *shape), generator=g) if token
         else torch.randn((n, *shape), generator=g))
    y = torch.randint(0, classes, (n,), generator=g)
    torch.manual_seed(0)
    model = build_model(name, shape, classes, **kwargs)
    return model, x, y


def _run(name: str, engine) -> dict:
    model, x, y = _case(name)
    params = {k: v.detach().clone() for k, v in model.named_parameters()}
    algorithm = build_algorithm("fedavg", local_lr=0.05)
    state = algorithm.server_init(params)
    store = ClientStore(CLIENTS, algorithm.client_init(params))
    idx = torch.arange(x.shape[0]).view(CLIENTS, STEPS, BATCH)
    w = torch.ones(CLIENTS, STEPS, BATCH)
    loss_fn = classification_loss(model)
    for t in (1, 2):
        torch.manual_seed(100 * t)  # the global generator must not matter
        draw = RoundDraw(torch.arange(CLIENTS), idx, w, round=t).with_keys(5)
        params, state, _ = federated_round(RoundSetup(algorithm, engine, loss_fn, store, x, y),
                                           params, state, draw)
    return params


def test_cases_name_every_model():
    assert set(CASES) == set(MODELS)


def test_the_zoo_has_a_model_with_dropout_and_max_pooling():
    with_both = [n for n in MODELS
                 if keyed_layers(m := _case(n)[0])
                 and any(isinstance(x, torch.nn.MaxPool2d) for x in m.modules())]
    assert with_both


@pytest.mark.parametrize("name", sorted(MODELS))
def test_each_engine_repeats_itself_and_they_agree(name):
    loop = [_run(name, LoopEngine()) for _ in range(2)]
    vmap = [_run(name, VmapEngine(chunk_size=2)) for _ in range(2)]
    for a, b in (loop, vmap):
        assert all(torch.equal(a[k], b[k]) for k in a), name
    for k in loop[0]:
        torch.testing.assert_close(vmap[0][k], loop[0][k], rtol=1e-4, atol=1e-5)
