"""Exact checks of FedNAR's clipped SGD (src/fedforge/client/nar.py) that the Lemma/Theorem
tests in test_nar.py leave open: defaults, the momentum path, error names, and the
coefficients of Eqs. (21)-(22) at the clip's edges. Written to kill the mutants the mutation
run left (docs/testing.md).
"""

import pytest
import torch

from fedforge.client.nar import DEFAULT_MAX_GRAD_NORM, clipped_sgd, nar, nar_coefficients
from fedforge.client.transforms import RoundContext

F64 = torch.float64
X = torch.tensor([3.0, -4.0], dtype=F64)


def _ctx(x):
    return RoundContext(x, {"round": torch.tensor(1.0, dtype=F64)}, {}, {})


def _steps(tx, grads, x0=X):
    """Apply ``tx`` to fixed gradients from x0; returns the iterates and the state."""
    x = {"w": x0.clone()}
    c = _ctx(x)
    st = tx.init(x, c)
    out = []
    for g in grads:
        upd, st = tx.update({"w": torch.tensor(g, dtype=F64)}, st, x, c)
        x = {"w": x["w"] + upd["w"]}
        out.append(x["w"])
    return out, st


def test_defaults_are_plain_sgd():
    """clipped_sgd(lr): no decay, no clip, no momentum, not NAR: x - lr g exactly."""
    tx = clipped_sgd(0.5)
    (x1,), st = _steps(tx, [[100.0, 0.0]])
    torch.testing.assert_close(x1, X - 0.5 * torch.tensor([100.0, 0.0], dtype=F64))
    assert set(st) == {"lr"}
    assert DEFAULT_MAX_GRAD_NORM == 10.0  # the FedNAR code's A


def test_nar_without_a_norm_uses_a_equal_10():
    """nar=True alone clips g + λx at A = 10: g = (0, 0), λ = 1, x = (3, -4) has norm 5 (no
    clip); g = (30, 40) + x = (33, 36) is clipped to norm 10."""
    tx = clipped_sgd(1.0, 1.0, nar=True)
    (x1,), st = _steps(tx, [[0.0, 0.0]])
    torch.testing.assert_close(x1, torch.zeros(2, dtype=F64), atol=1e-6, rtol=0)
    assert list(st) == ["weight_decay", "clip", "lr"]  # decay inside the clip
    (x1,), _ = _steps(tx, [[30.0, 40.0]])
    v = torch.tensor([33.0, 36.0], dtype=F64)
    torch.testing.assert_close(x1, X - 10 * v / v.norm(), rtol=1e-6, atol=0)
    vanilla = clipped_sgd(1.0, 1.0, 10.0)
    assert list(_steps(vanilla, [[0.0, 0.0]])[1]) == ["clip", "weight_decay", "lr"]


@pytest.mark.parametrize("nesterov", [False, True])
def test_momentum_after_the_clip(nesterov):
    """Heavy ball on the clipped direction: d1 = clip(g1), m = β m + d, step -lr m (Nesterov:
    -lr (d + β m)). A = 5, g = (6, 8) -> clip (3, 4); then g = (0.3, 0.4) -> unchanged."""
    beta, lr = 0.5, 0.1
    tx = clipped_sgd(lr, 0.0, 5.0, beta, nesterov=True) if nesterov else clipped_sgd(
        lr, 0.0, 5.0, beta)  # heavy ball (not Nesterov) by default
    (x1, x2), st = _steps(tx, [[6.0, 8.0], [0.3, 0.4]])
    d1, d2 = torch.tensor([3.0, 4.0], dtype=F64), torch.tensor([0.3, 0.4], dtype=F64)
    m1, m2 = d1, beta * d1 + d2
    s1, s2 = (d1 + beta * m1, d2 + beta * m2) if nesterov else (m1, m2)
    torch.testing.assert_close(x1, X - lr * s1, rtol=1e-6, atol=0)
    torch.testing.assert_close(x2, X - lr * s1 - lr * s2, rtol=1e-6, atol=0)
    torch.testing.assert_close(st["momentum"]["m"]["w"], m2, rtol=1e-6, atol=0)
    assert list(st) == ["clip", "momentum", "lr"]


def test_nar_transform_is_clipped_sgd_with_nar():
    (x1,), _ = _steps(nar(1.0, 1.0, 2.0), [[0.0, 0.0]])
    torch.testing.assert_close(x1, X - 2 * X / 5, rtol=1e-6, atol=0)
    (y1,), _ = _steps(nar(1.0, 1.0), [[0.0, 0.0]])  # default A = 10 > ||x|| = 5
    torch.testing.assert_close(y1, torch.zeros(2, dtype=F64), atol=1e-6, rtol=0)


def test_bad_schedules_name_the_field():
    with pytest.raises(ValueError, match="^weight_decay:"):
        clipped_sgd(0.1, weight_decay=True)
    with pytest.raises(ValueError, match="^max_grad_norm:"):
        clipped_sgd(0.1, max_grad_norm=True)


def test_nar_coefficients_at_the_edges():
    """Eqs. (21)-(22): (λ, μ) = (l, l u/l)·min(1, A/||g + λx||)."""
    g, x = {"w": torch.tensor([3.0, 4.0], dtype=F64)}, {"w": torch.zeros(2, dtype=F64)}
    lam, mu = nar_coefficients(g, x, 0.5, 0.2, 10.0)  # norm 5 < A: no clip, factor exactly 1
    assert lam.item() == 0.5 and mu.item() == pytest.approx(0.1, rel=1e-15)
    lam, mu = nar_coefficients(g, x, 0.5, 0.2, 1.0)  # clipped: factor 1/5
    assert lam.item() == pytest.approx(0.1, rel=1e-7) and mu.item() == pytest.approx(0.02,
                                                                                    rel=1e-7)
    zero = {"w": torch.zeros(2, dtype=F64)}
    lam, mu = nar_coefficients(zero, zero, 0.5, 0.2, 10.0)  # zero vector: no division blow-up
    assert lam.item() == 0.5 and mu.item() == pytest.approx(0.1, rel=1e-15)
