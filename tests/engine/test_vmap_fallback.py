"""No model in the zoo may hit functorch's slow per-example fallback under vmap.

A missing batching rule makes vmap loop over the batch in Python with only a warning; this
test turns that warning on and fails if any model triggers it (a silent 10-100x slowdown).
"""

import warnings

import pytest
import torch

from fedforge.algorithms import build_algorithm
from fedforge.core.store import ClientStore
from fedforge.engine import VmapEngine, classification_loss
from fedforge.engine.draw import RoundDraw
from fedforge.engine.round import RoundSetup, federated_round
from fedforge.models import MODELS, build_model
from tests.models.test_models import CASES as SMALL

CASES = {  # name: (input shape, classes, vocab); the zoo's other models run their small cases
    "cnn": ((1, 28, 28), 10, None),
    "lenet5": ((1, 28, 28), 10, None),
    "resnet18_gn": ((3, 32, 32), 10, None),
    "convnet": ((3, 32, 32), 10, None),
    "char_lstm": ((20,), 80, 80),
    "transformer_lm": ((20,), 80, 80),
    "text_classifier": ((20,), 2, 100),
}


SLOW = {"resnet18_gn"}  # ~4 s on 2 idle cores; runs with `pytest -m slow`


def _build(name: str):
    """-> (model, input shape, classes, vocab): defaults for ``CASES``, else the small case."""
    if name in CASES:
        shape, classes, vocab = CASES[name]
        kwargs = {"vocab_size": vocab} if vocab else {}
    else:
        shape, classes, kwargs, token, vocab = SMALL[name]
        vocab = vocab if token else None
    return build_model(name, shape, classes, **kwargs), shape, classes, vocab


@pytest.mark.parametrize("name", [
    pytest.param(n, marks=pytest.mark.slow) if n in SLOW else n for n in sorted(MODELS)])
def test_no_vmap_fallback(name):
    torch.manual_seed(0)
    model, shape, classes, vocab = _build(name)
    n = 8
    x = torch.randint(0, vocab, (n, *shape)) if vocab else torch.randn(n, *shape)
    y = torch.randint(0, classes, (n,))
    idx = torch.arange(n).view(2, 2, 2)
    algo = build_algorithm("fedavg")
    params = {k: v.detach().clone() for k, v in model.named_parameters()}
    torch._C._functorch._set_vmap_fallback_warning_enabled(True)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            setup = RoundSetup(algo, VmapEngine(), classification_loss(model), ClientStore(2, {}),
                               x, y)
            federated_round(setup, params, algo.server_init(params),
                            RoundDraw(torch.arange(2), idx, torch.ones(idx.shape)))
    finally:
        torch._C._functorch._set_vmap_fallback_warning_enabled(False)
    slow = [str(w.message) for w in caught if "performance drop" in str(w.message)]
    assert not slow, slow[0]
