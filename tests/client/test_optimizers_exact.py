"""Exact checks of the named local optimizers (src/fedforge/client/optimizers.py): every
default, every branch and every error, on one or two steps with fixed gradients, so a
changed default or a swapped branch moves a hand-computed number (docs/testing.md).
"""

import math

import pytest
import torch

from fedforge.client.optimizers import LOCAL_OPTIMIZERS, local_optimizer
from fedforge.client.transforms import RoundContext

F64 = torch.float64
X = torch.tensor([3.0, -4.0], dtype=F64)


def _steps(tx, grads, x0=X):
    """Apply ``tx`` to fixed gradients from x0; returns the iterates and the final state."""
    x = {"w": x0.clone()}
    ctx = RoundContext(x, {"round": torch.tensor(1.0, dtype=F64)}, {}, {})
    state = tx.init(x, ctx)
    out = []
    for g in grads:
        upd, state = tx.update({"w": torch.tensor(g, dtype=F64)}, state, x, ctx)
        x = {"w": x["w"] + upd["w"]}
        out.append(x["w"])
    return out, state


def _close(a, b):
    torch.testing.assert_close(a, torch.as_tensor(b, dtype=F64), rtol=1e-9, atol=1e-12)


def test_names():
    assert LOCAL_OPTIMIZERS == ("sgd", "momentum", "adam", "amsgrad")


def test_default_is_plain_sgd_with_lr_001():
    """No argument: x - 0.01 g, no decay (g = 0 does not move x), no clip, no momentum."""
    (x1, x2), state = _steps(local_optimizer(), [[100.0, 0.0], [0.0, 0.0]])
    _close(x1, [2.0, -4.0])
    _close(x2, [2.0, -4.0])  # no momentum, no decay
    assert list(state) == ["lr"]


def test_momentum_default_beta_09():
    """Heavy ball m = 0.9 m + g: g = (1, 0) twice -> steps 0.1·1 and 0.1·1.9."""
    (x1, x2), state = _steps(local_optimizer("momentum", 0.1), [[1.0, 0.0], [1.0, 0.0]])
    _close(x1, [2.9, -4.0])
    _close(x2, [2.9 - 0.19, -4.0])
    assert list(state) == ["momentum", "lr"]
    (y1, y2), _ = _steps(local_optimizer("momentum", 0.1, momentum=0.5),
                         [[1.0, 0.0], [1.0, 0.0]])
    _close(y2, [2.9 - 0.15, -4.0])


def test_weight_decay_and_clip_are_passed_on():
    """wd = 0.5 with g = 0: x - lr·0.5 x; max_grad_norm = 5 clips g = (30, 40) to (3, 4)."""
    (x1,), _ = _steps(local_optimizer("sgd", 0.1, weight_decay=0.5), [[0.0, 0.0]])
    _close(x1, X - 0.05 * X)
    (y1,), state = _steps(local_optimizer("sgd", 0.1, max_grad_norm=5.0), [[30.0, 40.0]])
    _close(y1, X - 0.1 * torch.tensor([3.0, 4.0], dtype=F64))
    assert list(state) == ["clip", "lr"]
    (z1,), state = _steps(local_optimizer("momentum", 0.1, max_grad_norm=5.0),
                          [[30.0, 40.0]])
    _close(z1, X - 0.1 * torch.tensor([3.0, 4.0], dtype=F64))
    assert list(state) == ["clip", "momentum", "lr"]


def test_nar_puts_the_decay_inside_the_clip():
    """nar=True: clip(g + λx) at 2; g = 0, λ = 1, x = (3, -4): step lr·2·x/5."""
    (x1,), state = _steps(local_optimizer("sgd", 1.0, weight_decay=1.0, max_grad_norm=2.0,
                                          nar=True), [[0.0, 0.0]])
    _close(x1, X - 2 * X / 5)
    assert list(state) == ["weight_decay", "clip", "lr"]
    (y1,), state = _steps(local_optimizer("momentum", 1.0, weight_decay=1.0,
                                          max_grad_norm=2.0, nar=True), [[0.0, 0.0]])
    _close(y1, X - 2 * X / 5)
    assert list(state) == ["weight_decay", "clip", "momentum", "lr"]


def _adam_reference(grads, lr, b1=0.9, b2=0.999, eps=1e-8, amsgrad=False):
    """Bias-corrected Adam (AMSGrad: max of the raw v) on one coordinate, by hand."""
    x, m, v, vmax, out = 3.0, 0.0, 0.0, 0.0, []
    for t, g in enumerate(grads, start=1):
        m, v = b1 * m + (1 - b1) * g, b2 * v + (1 - b2) * g * g
        vmax = max(vmax, v)
        den = vmax if amsgrad else v
        x -= lr * (m / (1 - b1**t)) / (math.sqrt(den / (1 - b2**t)) + eps)
        out.append(x)
    return out


@pytest.mark.parametrize("name", ["adam", "amsgrad"])
def test_adam_defaults_b1_09_b2_0999_eps_1e8(name):
    """Three steps g = 10, 0, 0 (v falls, so AMSGrad's max matters) at the defaults."""
    grads = [10.0, 0.0, 0.0]
    xs, state = _steps(local_optimizer(name, 0.1), [[g, 0.0] for g in grads])
    ref = _adam_reference(grads, 0.1, amsgrad=name == "amsgrad")
    for x, r in zip(xs, ref):
        _close(x[0], r)
    assert ("vhat" in state["adam"]) == (name == "amsgrad")
    # eps = 1e-8 is visible on a tiny gradient: g/(|g| + eps) = 1e-8 / 2e-8
    (y1,), _ = _steps(local_optimizer(name, 1.0), [[1e-8, 0.0]])
    _close(y1[0], 3.0 - 0.5)


def test_adam_arguments_are_passed_on():
    grads = [10.0, 0.0, 0.0]
    xs, _ = _steps(local_optimizer("adam", 0.1, b1=0.5, b2=0.9, eps=0.1),
                   [[g, 0.0] for g in grads])
    ref = _adam_reference(grads, 0.1, 0.5, 0.9, 0.1)
    for x, r in zip(xs, ref):
        _close(x[0], r)
    (y1,), state = _steps(local_optimizer("adam", 0.1, weight_decay=0.5), [[0.0, 0.0]])
    # g + 0.5 x = 0.5 x; Adam's first step is lr·sign
    _close(y1, X - 0.1 * torch.sign(X))
    assert list(state) == ["weight_decay", "adam", "lr"]


def test_adam_with_a_clip_clips_first():
    """(30, 40) clipped to norm 5 -> m = 0.1·(3, 4) after one step."""
    _, state = _steps(local_optimizer("adam", 0.1, max_grad_norm=5.0), [[30.0, 40.0]])
    assert list(state) == ["clip", "chain"]
    _close(state["chain"]["adam"]["m"]["w"], [0.3, 0.4])
    _, state = _steps(local_optimizer("adam", 0.1), [[30.0, 40.0]])
    _close(state["adam"]["m"]["w"], [3.0, 4.0])


def test_errors_name_the_field():
    for lr in (0.0, -1.0):
        with pytest.raises(ValueError, match=r"^client\.lr: expected a positive learning "
                                             rf"rate, got {lr}$"):
            local_optimizer("sgd", lr)
    with pytest.raises(ValueError, match=r"^local_lr: expected a number or a schedule"):
        local_optimizer("sgd", True)
    for name in ("adam", "amsgrad"):
        with pytest.raises(ValueError, match=r"^nar: FedNAR needs an SGD-family client "
                                             rf"optimizer, got '{name}'$"):
            local_optimizer(name, 0.1, nar=True)
    with pytest.raises(ValueError, match=r"^client\.optimizer: unknown 'rmsprop'; expected "
                                         r"one of \['sgd', 'momentum', 'adam', 'amsgrad'\]$"):
        local_optimizer("rmsprop", 0.1)
