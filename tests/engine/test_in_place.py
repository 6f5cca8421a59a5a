"""The loop's in-place local update gives the out-of-place numbers bit for bit.

The loop updates a round's own copy of the parameters in place where neither a transform of
the local optimizer nor a stage of the local round keeps a step's parameters
(``Transform.keeps_params``, ``Stage.keeps_params``). Every registered algorithm is run both
ways; a transform that keeps a step's parameters, and the padding stage, force the
out-of-place update, and declaring such a transform safe would change its numbers.
"""

from dataclasses import replace

import pytest
import torch

import fedforge.engine.local as local
from fedforge.algorithms import ALGORITHMS, build_algorithm
from fedforge.client.transforms import (
    Transform,
    chain,
    local_step,
    scale_by_learning_rate,
    sgd,
    step_in_place,
    steps_in_place,
)
from fedforge.core.tree import flatten_dict
from fedforge.engine import LoopEngine, classification_loss, local_update_of
from fedforge.models import build_model
from tests.engine.test_parity import MODELS, NUM_CLASSES, _data, _hparams, _run


@pytest.fixture
def in_place_steps(monkeypatch):
    """How many local steps ran in place."""
    seen = []

    def counted(*args):
        seen.append(1)
        return step_in_place(*args)

    monkeypatch.setattr(local, "step_in_place", counted)
    return seen


def _assert_bit_equal(ref, got) -> None:
    for a, b in zip(ref[:2], got[:2], strict=True):
        fa, fb = flatten_dict(a), flatten_dict(b)
        assert fa.keys() == fb.keys()
        for k in fa:
            assert torch.equal(fa[k], fb[k]), k
    for k, v in ref[2].state_dict().items():
        assert torch.equal(v, got[2].state_dict()[k]), k


@pytest.mark.parametrize("model_name", ["mlp", "simple_cnn"])
@pytest.mark.parametrize("algo_name", sorted(ALGORITHMS))
def test_every_algorithm_is_bit_equal_in_place(algo_name, model_name, in_place_steps):
    shape, kwargs, kind = MODELS[model_name]
    torch.manual_seed(0)
    model = build_model(model_name, shape, NUM_CLASSES, **kwargs)
    x, y, sample_idx, weights = _data(kind, shape)
    weights[3, 0] = 0.0  # client 3's first step is padding: its round runs out of place
    algorithm = build_algorithm(algo_name, **_hparams(algo_name))
    off = _run(algorithm, LoopEngine(in_place=False), model, x, y, sample_idx, weights)
    assert not in_place_steps
    on = _run(algorithm, LoopEngine(), model, x, y, sample_idx, weights)
    _assert_bit_equal(off, on)
    # every optimizer that can steps in place (the unpadded clients), so that the test
    # cannot pass by never updating in place
    assert bool(in_place_steps) == steps_in_place(algorithm.local_optimizer)


def _remembering(declared_keeps: bool) -> Transform:
    """``g -> g + (x - x_prev)``: its state holds the step's own parameters."""

    def init(params, ctx):
        return {"prev": params}

    def update(g, state, params, ctx):
        return {k: g[k] + params[k] - state["prev"][k] for k in g}, {"prev": params}

    return Transform("remember", init, update, keeps_params=declared_keeps)


def _round(optimizer: Transform, in_place: bool, masked: bool = False):
    torch.manual_seed(0)
    model = build_model("mlp", (1, 6, 6), NUM_CLASSES, hidden=(8,))
    algorithm = replace(build_algorithm("fedavg", local_lr=0.5), local_optimizer=optimizer)
    fn = local_update_of(algorithm, classification_loss(model), masked=masked,
                         functional=False, in_place=in_place)
    params = {k: v.detach().clone() for k, v in model.named_parameters()}
    g = torch.Generator().manual_seed(1)
    xs, ys = torch.randn(4, 3, 1, 6, 6, generator=g), torch.randint(0, 5, (4, 3), generator=g)
    ws = torch.ones(4, 3)
    before = {k: v.clone() for k, v in params.items()}
    out = fn(params, {"round": torch.tensor(1.0)}, {}, {}, xs, ys, ws)
    assert all(torch.equal(before[k], params[k]) for k in params)  # x^t is never written
    return out.delta


def test_a_transform_keeping_the_steps_parameters_forces_the_out_of_place_update(
        in_place_steps):
    ref = _round(chain(_remembering(True), scale_by_learning_rate(0.5)), in_place=False)
    got = _round(chain(_remembering(True), scale_by_learning_rate(0.5)), in_place=True)
    assert not in_place_steps and all(torch.equal(ref[k], got[k]) for k in ref)
    # declared safe, its remembered parameters move with the update: other numbers
    wrong = _round(chain(_remembering(False), scale_by_learning_rate(0.5)), in_place=True)
    assert in_place_steps and not all(torch.equal(ref[k], wrong[k]) for k in ref)


def test_sgd_steps_in_place_to_the_same_bits_and_padding_forces_out_of_place(in_place_steps):
    ref = _round(sgd(0.5, momentum=0.9, weight_decay=0.01), in_place=False)
    got = _round(sgd(0.5, momentum=0.9, weight_decay=0.01), in_place=True)
    assert len(in_place_steps) == 4 and all(torch.equal(ref[k], got[k]) for k in ref)
    in_place_steps.clear()
    padded = _round(sgd(0.5, momentum=0.9), in_place=True, masked=True)
    assert not in_place_steps and all(torch.isfinite(v).all() for v in padded.values())


def test_which_transforms_step_in_place():
    lr = scale_by_learning_rate(0.1)
    assert steps_in_place(lr) and steps_in_place(sgd(0.1, momentum=0.9))
    assert not steps_in_place(chain(_remembering(True), lr))
    # a fused step without its in-place twin would round otherwise: not in place
    assert not steps_in_place(lr._replace(in_place=None))
    assert steps_in_place(lr._replace(step=None, in_place=None))  # update, then add_
    p = {"w": torch.tensor([1.0, 2.0])}
    g = {"w": torch.tensor([0.3, -0.7])}
    ctx = local.RoundContext({}, {"round": torch.tensor(1.0)}, {}, {})
    want, _ = local_step(lr, g, {}, p, ctx)
    step_in_place(lr, g, {}, p, ctx)
    assert torch.equal(p["w"], want["w"])
    torch.testing.assert_close(p["w"], torch.tensor([0.97, 2.07]))  # x - 0.1 g
