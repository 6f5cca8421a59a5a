"""Clipping bounds, the central noise scale, DP-SGD's gradient and adaptive clipping."""

from __future__ import annotations

import math

import pytest
import torch

pytest.importorskip("dp_accounting", reason="needs the privacy extra (dp-accounting)")

from fedforge.privacy.accountant import RunEvents  # noqa: E402
from fedforge.privacy.algorithm import KEY, Mechanism  # noqa: E402
from fedforge.privacy.config import PrivacyConfig  # noqa: E402
from fedforge.privacy.mechanisms import clip_tree, dp_sgd_grad  # noqa: E402
from fedforge.server.chain import Aggregate  # noqa: E402


def _mech(mode="central", sigma=1.0, clip=1.0, rate=0.1, n=100, **kw) -> Mechanism:
    cfg = PrivacyConfig(mode=mode, noise_multiplier=sigma, clip=clip, **kw)
    return Mechanism(cfg, sigma, rate, n, RunEvents(mode, rate, 1), seed=3)


def test_clip_bounds_each_client_delta():
    mech = _mech(clip=0.5)
    bc = {"privacy": {"clip": torch.tensor(0.5)}}
    big = {"w": torch.tensor([3.0, 4.0]), "b": torch.tensor([0.0])}  # norm 5
    out, _ = mech.client_delta(big, bc, {})
    torch.testing.assert_close(out["w"], torch.tensor([0.3, 0.4]))  # 0.5 · (3, 4) / 5
    small = {"w": torch.tensor([0.1, 0.2]), "b": torch.tensor([0.2])}  # norm 0.3
    out, _ = mech.client_delta(small, bc, {})
    torch.testing.assert_close(out["w"], small["w"])
    _, norm = clip_tree(big, 0.5)
    assert float(norm) == pytest.approx(5.0)


def test_central_noise_std_is_sigma_c_over_expected_cohort():
    """Clients send fixed deltas; over 400 rounds × 250 coordinates the aggregate's noise has
    std σC/(qN) = 1.5 · 0.8 / 10 = 0.12. Two-sided χ² test on the sample variance at
    α = 1e-4 (the false-failure rate; fixed seed, so the test is deterministic)."""
    from scipy.stats import chi2

    mech = _mech(sigma=1.5, clip=0.8, rate=0.1, n=100)
    stage = mech.stage()
    d = 250
    params = {"w": torch.zeros(d, dtype=torch.float64)}
    state = stage.init(params)
    deltas = torch.full((7, d), 1.0, dtype=torch.float64)  # 7 clients, norm sqrt(d) > C
    bc = {"privacy": {"clip": state["clip"]}}
    clipped = torch.stack([mech.client_delta({"w": x}, bc, {})[0]["w"] for x in deltas])
    weights = mech.aggregation_weights(torch.full((7,), 1 / 7, dtype=torch.float64))
    mean = weights @ clipped  # Σ clip(Δ_i) / (qN)
    assert float(weights[0]) == pytest.approx(1 / 10)
    noise = []
    for t in range(1, 401):
        _, agg, _ = stage.update(params, Aggregate({"w": mean}, {}, 7, 100, t), state)
        noise.append(agg.delta["w"] - mean)
    x = torch.cat(noise)
    n = x.numel()
    stat = float((x - x.mean()).pow(2).sum()) / 0.12**2  # (n-1) s² / σ² ~ χ²(n - 1)
    lo, hi = chi2.ppf(0.5e-4, n - 1), chi2.ppf(1 - 0.5e-4, n - 1)
    assert lo < stat < hi, (stat / (n - 1), lo / (n - 1), hi / (n - 1))
    assert abs(float(x.mean())) < 4 * 0.12 / math.sqrt(n)


def test_dp_sgd_clips_every_example_and_divides_by_the_batch():
    """σ = 0: the step's gradient is (Σ_b clip(g_b)) / B, each g_b clipped to C (hand check
    for a linear least-squares loss: g_b = (w·x_b - y_b) x_b)."""

    def loss_fn(params, x, y, w):
        per = 0.5 * (x @ params["w"] - y) ** 2
        return (per * w).sum() / w.sum().clamp_min(1.0)

    x = torch.tensor([[3.0, 4.0], [0.1, 0.0], [1.0, 1.0]])
    y = torch.tensor([0.0, 0.0, 0.0])
    w = torch.tensor([1.0, 1.0, 0.0])  # third row is padding: contributes 0, counts in B
    params = {"w": torch.tensor([1.0, 1.0])}
    grads, _ = dp_sgd_grad(loss_fn, 1.0, 0.0)(params, x, y, w, torch.tensor(5), 0)
    g0 = torch.tensor([21.0, 28.0])  # (3 + 4) (3, 4), norm 35 -> clipped to (0.6, 0.8)
    g1 = torch.tensor([0.01, 0.0])  # 0.1 · (0.1, 0) unclipped
    want = (g0 / 35.0 + g1) / 3
    torch.testing.assert_close(grads["w"], want)


def test_dp_sgd_noise_is_sigma_c_per_step_and_keyed():
    def loss_fn(params, x, y, w):
        return ((x @ params["w"] - y) * w).sum() * 0.0

    params = {"w": torch.zeros(20000)}
    x, y, w = torch.zeros(4, 20000), torch.zeros(4), torch.ones(4)
    fn = dp_sgd_grad(loss_fn, 2.0, 0.5)
    g, _ = fn(params, x, y, w, torch.tensor(11), 0)
    std = float(g["w"].std())
    assert std == pytest.approx(0.5 * 2.0 / 4, rel=0.03)  # σC / B
    g2, _ = fn(params, x, y, w, torch.tensor(11), 0)
    g3, _ = fn(params, x, y, w, torch.tensor(11), 1)
    torch.testing.assert_close(g["w"], g2["w"])  # same key and step: same noise
    assert not torch.allclose(g["w"], g3["w"])


def test_adaptive_clip_tracks_the_target_quantile():
    """Clients' update norms are log-normal(0, 0.5); with γ = 0.3 the clip must settle near
    the 30 % quantile exp(0.5 · Φ⁻¹(0.3)) = 0.769 (within 10 % on the last 100 rounds)."""
    from statistics import NormalDist

    mech = _mech(sigma=1.0, clip=3.0, rate=0.5, n=200, adaptive=True, target_quantile=0.3,
                 clip_lr=0.2, count_noise=5.0)
    stage = mech.stage()
    params = {"w": torch.zeros(1, dtype=torch.float64)}
    state = stage.init(params)
    gen = torch.Generator().manual_seed(0)
    clips = []
    for t in range(1, 401):
        norms = torch.exp(0.5 * torch.randn(100, generator=gen, dtype=torch.float64))
        bits = (norms <= state["clip"]).double()
        agg = Aggregate({"w": torch.zeros(1, dtype=torch.float64)},
                        {"privacy": {"unclipped": bits.mean()}}, 100, 200, t)
        _, _, state = stage.update(params, agg, state)
        clips.append(float(state["clip"]))
    want = math.exp(0.5 * NormalDist().inv_cdf(0.3))
    late = sum(clips[-100:]) / 100
    assert late == pytest.approx(want, rel=0.1)
    assert clips[0] < 3.0  # it moved from the start


def test_client_side_noise_depends_only_on_the_key():
    mech = _mech(mode="local", sigma=1.0, clip=1.0)
    bc = {"privacy": {"clip": torch.tensor(1.0)}}
    d = {"w": torch.zeros(1000)}
    a, _ = mech.client_delta(d, bc, {KEY: torch.tensor(7)})
    b, _ = mech.client_delta(d, bc, {KEY: torch.tensor(7)})
    c, _ = mech.client_delta(d, bc, {KEY: torch.tensor(8)})
    torch.testing.assert_close(a["w"], b["w"])
    assert not torch.allclose(a["w"], c["w"])
    assert float(a["w"].std()) == pytest.approx(1.0, rel=0.1)
