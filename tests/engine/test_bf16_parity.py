"""bf16 compute with fp32 master weights (engine.precision = "bf16"): the loop, the vmapped
engine and worker processes agree to bf16 tolerance, weights and server state stay fp32, and
the run really computed in bf16 (it differs from the fp32 run)."""

import pytest
import torch

from fedforge.algorithms import build_algorithm
from fedforge.core.store import ClientStore
from fedforge.engine import LoopEngine, ProcessEngine, VmapEngine, classification_loss
from fedforge.engine.draw import RoundDraw
from fedforge.engine.round import RoundSetup, federated_round
from fedforge.models import build_model
from tests.engine.test_parity import CLIENTS, NUM_CLASSES, _data, assert_same_run

MODELS = {"cnn": ((1, 12, 12), {"channels": (4, 8), "fc": 16}),
          "pfl_simple_cnn": ((3, 8, 8), {})}  # dropout: keyed masks in every engine


def _run(engine, model, algorithm, precision, rounds=2):
    x, y, idx, w = _data("image", model.input_shape)
    params = {k: v.detach().clone() for k, v in model.named_parameters()}
    loss_fn = classification_loss(model, precision)
    state = algorithm.server_init(params)
    store = ClientStore(CLIENTS + 2, algorithm.client_init(params))
    for r in range(1, rounds + 1):
        info = algorithm.round_info(CLIENTS, torch.Generator().manual_seed(r))
        params, state, _ = federated_round(
            RoundSetup(algorithm, engine, loss_fn, store, x, y), params, state,
            RoundDraw(torch.arange(CLIENTS), idx, w, info=info, round=r))
    return params, state, store


def _model(name):
    shape, kwargs = MODELS[name]
    torch.manual_seed(0)
    model = build_model(name, shape, NUM_CLASSES, **kwargs)
    model.input_shape = shape  # what _run draws data for
    return model


@pytest.mark.parametrize("algo", ["fedavg", "fedprox"])
@pytest.mark.parametrize("name", list(MODELS))
def test_loop_and_vmap_agree_in_bf16_and_keep_fp32_weights(name, algo):
    model = _model(name)
    algorithm = build_algorithm(algo, local_lr=0.05)
    ref = _run(LoopEngine(), model, algorithm, "bf16")
    got = _run(VmapEngine(chunk_size=3), model, algorithm, "bf16")
    assert all(v.dtype == torch.float32 for v in ref[0].values())
    assert all(v.dtype == torch.float32 for v in got[0].values())
    assert_same_run(ref, got, rtol=2e-2, atol=5e-3)  # bf16: about 3 significant digits
    fp32 = _run(LoopEngine(), model, algorithm, "fp32")
    assert any(not torch.equal(ref[0][k], fp32[0][k]) for k in fp32[0])  # really bf16
    assert_same_run(fp32, ref, rtol=5e-2, atol=5e-3)  # ... and still the same training


def test_worker_processes_agree_with_the_loop_in_bf16():
    model = _model("pfl_simple_cnn")
    algorithm = build_algorithm("fedavg", local_lr=0.05)
    ref = _run(LoopEngine(), model, algorithm, "bf16")
    with ProcessEngine(workers=2) as engine:
        got = _run(engine, model, algorithm, "bf16")
    assert_same_run(ref, got, rtol=2e-2, atol=2e-3)


def test_fp32_is_unchanged_by_the_precision_switch():
    """The default precision is fp32 and runs no autocast: bit-equal to the loss without it."""
    model = _model("cnn")
    algorithm = build_algorithm("fedavg", local_lr=0.05)
    a = _run(LoopEngine(), model, algorithm, "fp32")
    assert classification_loss(model).precision == "fp32"
    b = _run(LoopEngine(), model, algorithm, "fp32")
    assert_same_run(a, b, rtol=0, atol=0)


def test_stochastic_rounding_agrees_across_engines_and_reruns():
    model = _model("pfl_simple_cnn")
    algorithm = build_algorithm("fedavg", local_lr=0.05)
    ref = _run(LoopEngine(), model, algorithm, "bf16_sr")
    assert_same_run(ref, _run(LoopEngine(), model, algorithm, "bf16_sr"), rtol=0, atol=0)
    got = _run(VmapEngine(chunk_size=3), model, algorithm, "bf16_sr")
    assert_same_run(ref, got, rtol=2e-2, atol=5e-3)  # a weight's rounding may flip by 1 gap
    bf16 = _run(LoopEngine(), model, algorithm, "bf16")
    assert any(not torch.equal(ref[0][k], bf16[0][k]) for k in bf16[0])  # weights rounded
