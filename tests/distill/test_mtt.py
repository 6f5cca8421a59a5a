"""Trajectory matching (MTT, FedPTR Algorithm 1) against a closed form and finite differences."""

import pytest
import torch
import torch.nn.functional as F

from fedforge.distill import (
    init_synthetic,
    match_trajectory,
    matching_loss,
    student_descent,
    synthetic_labels,
)
from fedforge.models import build_model


def location_loss(params, x, y, w):
    """``mean_b ½||w - x_b||²``: GD from w_0 with lr β gives ``x̄ + (1-β)^r (w_0 - x̄)``."""
    del y
    per = 0.5 * ((params["w"] - x) ** 2).sum(-1)  # [n]
    return (per * w).sum() / w.sum()


def test_student_descent_closed_form():
    x = torch.tensor([[1.0, 3.0], [3.0, -1.0]], dtype=torch.float64)  # mean (2, 1)
    w0 = {"w": torch.tensor([0.0, 0.0], dtype=torch.float64)}
    out = student_descent(location_loss, w0, x, torch.zeros(2, dtype=torch.long), 0.1, 5)
    a = 0.9**5
    torch.testing.assert_close(out["w"], torch.tensor([2.0, 1.0], dtype=torch.float64) * (1 - a))


def test_mtt_reaches_closed_form_optimum():
    """The optimal set has mean x̄* = (w_end - a w_start)/(1 - a), a = (1-β)^R: MTT finds it."""
    w_start = {"w": torch.tensor([0.5, 0.0], dtype=torch.float64)}
    w_end = {"w": torch.tensor([1.5, -2.0], dtype=torch.float64)}
    g = torch.Generator().manual_seed(0)
    x0 = torch.randn((3, 2), generator=g, dtype=torch.float64)
    y = torch.zeros(3, dtype=torch.long)
    res = match_trajectory(
        location_loss,
        w_start,
        w_end,
        x0,
        y,
        0.1,
        outer_steps=200,
        inner_steps=5,
        lr_img=3.0,
        lr_lr=1e-4,
    )
    assert res.losses[0] > 0.1 and res.losses[-1] < 1e-8
    w_hat = student_descent(location_loss, w_start, res.syn_x, y, res.syn_lr, 5)
    torch.testing.assert_close(w_hat["w"], w_end["w"], atol=1e-4, rtol=0)
    a = (1 - res.syn_lr) ** 5
    x_star = (w_end["w"] - a * w_start["w"]) / (1 - a)
    torch.testing.assert_close(res.syn_x.mean(0), x_star, atol=1e-4, rtol=0)
    assert res.syn_lr != 0.1  # β is learned too


def test_mtt_gradient_matches_finite_differences():
    """d L_MTT / d(syn_x, β) through R unrolled CE steps of an MLP == central differences."""
    torch.manual_seed(0)
    model = build_model("mlp", (1, 3, 3), 3, hidden=(5,)).double()

    def loss_fn(params, x, y, w):  # float64 throughout (classification_loss computes in fp32)
        logits = torch.func.functional_call(model, params, (x,))
        return (F.cross_entropy(logits, y, reduction="none") * w).sum() / w.sum()

    w_start = {k: v.detach().clone() for k, v in model.named_parameters()}
    w_end = {k: v + 0.1 * torch.randn_like(v) for k, v in w_start.items()}
    x = torch.randn((6, 1, 3, 3), dtype=torch.float64)
    y = synthetic_labels(3, 2)
    beta = torch.tensor(0.3, dtype=torch.float64)

    def f(sx, lr):
        return matching_loss(loss_fn, w_start, w_end, sx, y, lr, inner_steps=4)

    gx, gb = torch.func.grad(f, argnums=(0, 1))(x, beta)
    eps = 1e-6
    d = torch.randn_like(x)
    fd_x = (f(x + eps * d, beta) - f(x - eps * d, beta)) / (2 * eps)
    torch.testing.assert_close((gx * d).sum(), fd_x, rtol=1e-6, atol=1e-9)
    fd_b = (f(x, beta + eps) - f(x, beta - eps)) / (2 * eps)
    torch.testing.assert_close(gb, fd_b, rtol=1e-6, atol=1e-9)
    assert gx.abs().sum() > 0


def test_mtt_without_signal_returns_inputs_unchanged():
    w = {"w": torch.zeros(2)}
    x = torch.randn(2, 2)
    res = match_trajectory(location_loss, w, w, x, torch.zeros(2, dtype=torch.long), 0.01)
    assert torch.equal(res.syn_x, x) and res.losses == []


def test_init_synthetic_real_for_present_classes_noise_for_absent():
    x = torch.arange(4.0).view(4, 1, 1, 1) + 10  # values 10..13, far from N(0,1) noise
    y = torch.tensor([0, 0, 2, 2])
    out = init_synthetic(x, y, num_classes=3, ipc=3, generator=torch.Generator().manual_seed(0))
    assert out.shape == (9, 1, 1, 1)
    assert set(out[:3].flatten().tolist()) <= {10.0, 11.0}
    assert set(out[6:].flatten().tolist()) <= {12.0, 13.0}
    assert out[3:6].abs().max() < 6  # class 1 absent: noise
    with pytest.raises(ValueError, match="real-valued"):
        init_synthetic(torch.zeros(2, 3, dtype=torch.long), y[:2], 3, 1, torch.Generator())
