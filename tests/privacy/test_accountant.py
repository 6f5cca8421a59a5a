"""The accountant against an independent implementation and a published value."""

from __future__ import annotations

import math

import numpy as np
import pytest

pytest.importorskip("dp_accounting", reason="needs the privacy extra (dp-accounting)")

from fedforge.privacy.accountant import (  # noqa: E402
    RunEvents,
    calibrate_sigma,
    delta_multiplier,
    epsilon,
    make_accountant,
    rounds_within,
)

# TF Privacy's MNIST DP-SGD tutorial (tensorflow/privacy, tutorials/README.md, "Select
# Parameters"): 60,000 examples, batch 256, noise multiplier 1.12, 60 epochs, δ = 1e-5:
# ε = 2.92. That table converts RDP to (ε, δ) with ε = min_α RDP(α) + log(1/δ)/(α - 1) over
# the orders 1.1..10.9 (step 0.1) and 12..63.
TUTORIAL_ORDERS = [1 + x / 10.0 for x in range(1, 100)] + list(range(12, 64))
Q, SIGMA, STEPS = 256 / 60000, 1.12, 60 * 60000 // 256


def test_rdp_matches_the_published_tf_privacy_mnist_setting():
    events = RunEvents("central", Q, 1)  # one Poisson-subsampled Gaussian per step
    from dp_accounting.rdp import rdp_privacy_accountant

    acc = rdp_privacy_accountant.RdpAccountant(TUTORIAL_ORDERS)
    acc.compose(events.event(SIGMA, STEPS))
    orders, rdp = np.array(TUTORIAL_ORDERS), np.array(acc._rdp)
    classic = float(np.min(rdp + math.log(1 / 1e-5) / (orders - 1)))
    assert classic == pytest.approx(2.92, abs=0.005)
    # the library's tighter conversion can only lower it
    assert epsilon(events, SIGMA, STEPS, 1e-5, "rdp") < classic


@pytest.mark.parametrize(("q", "sigma", "steps"), [(256 / 60000, 1.1, 14062), (0.01, 1.0, 100),
                                                   (0.05, 1.5, 300)])
def test_rdp_agrees_with_opacus(q, sigma, steps):
    opacus = pytest.importorskip("opacus.accountants", reason="needs opacus (privacy extra)")
    acc = opacus.RDPAccountant()
    acc.history = [(sigma, q, steps)]
    want = acc.get_epsilon(1e-5)
    got = epsilon(RunEvents("central", q, 1), sigma, steps, 1e-5, "rdp")
    assert got == pytest.approx(want, rel=1e-3)


def test_pld_agrees_with_opacus_prv_and_is_below_rdp():
    opacus = pytest.importorskip("opacus.accountants", reason="needs opacus (privacy extra)")
    acc = opacus.PRVAccountant()  # privacy random variables: an independent numerical method
    acc.history = [(1.0, 0.01, 200)]
    events = RunEvents("central", 0.01, 1)
    pld = epsilon(events, 1.0, 200, 1e-5, "pld")
    assert pld == pytest.approx(acc.get_epsilon(1e-5), rel=0.02)
    assert pld < epsilon(events, 1.0, 200, 1e-5, "rdp")


def test_modes_compose_as_documented():
    # local: T Gaussians with multiplier σ/2; sample: T·E Gaussians with multiplier σ
    local = epsilon(RunEvents("local", 1.0, 1), 4.0, 10, 1e-5, "rdp")
    acc = make_accountant("rdp")
    import dp_accounting

    acc.compose(dp_accounting.GaussianDpEvent(2.0), 10)
    assert local == pytest.approx(acc.get_epsilon(1e-5), rel=1e-9)
    sample = epsilon(RunEvents("sample", 1.0, 3), 2.0, 5, 1e-5, "rdp")
    acc = make_accountant("rdp")
    acc.compose(dp_accounting.GaussianDpEvent(2.0), 15)
    assert sample == pytest.approx(acc.get_epsilon(1e-5), rel=1e-9)


def test_calibration_meets_the_target_and_is_tight():
    events = RunEvents("central", 0.02, 1)
    sigma = calibrate_sigma(events, 100, 1e-5, 4.0, "rdp")
    assert epsilon(events, sigma, 100, 1e-5, "rdp") <= 4.0
    assert epsilon(events, 0.98 * sigma, 100, 1e-5, "rdp") > 4.0


def test_rounds_within_is_the_last_round_under_the_target():
    events = RunEvents("central", 0.05, 1)
    t = rounds_within(events, 1.0, 500, 1e-5, 2.0, "rdp")
    assert 0 < t < 500
    assert epsilon(events, 1.0, t, 1e-5, "rdp") <= 2.0 < epsilon(events, 1.0, t + 1, 1e-5, "rdp")


def test_adaptive_split_costs_exactly_sigma():
    # Andrew et al. 2021: 1/σ² = 1/σ_Δ² + 1/(2σ_b)²
    s_delta = delta_multiplier(1.0, 2.0)
    assert 1 / s_delta**2 + 1 / 4.0**2 == pytest.approx(1.0)
    with pytest.raises(ValueError, match="privacy.count_noise"):
        delta_multiplier(1.0, 0.5)


@pytest.mark.parametrize(("sigma", "count_noise", "want"), [
    # by hand: (0.7⁻² − 4⁻²)^(−½) = (2.0408163 − 0.0625)^(−½) = 0.7109714
    # (σ⁻⁴ in place of σ⁻² gives 0.4937; (2σ_b)⁻¹ in place of (2σ_b)⁻² gives 0.7473)
    (0.7, 2.0, 0.7109714025666358),
    # (2⁻² − 4⁻²)^(−½) = 0.1875^(−½) = 2.3094011; σ⁻⁴ would leave nothing (0.0625 − 0.0625)
    (2.0, 2.0, 2.309401076758503),
])
def test_adaptive_split_at_sigma_other_than_one(sigma, count_noise, want):
    """At σ = 1, σ⁻² and σ⁻⁴ agree: only σ ≠ 1 tells the formula from a wrong exponent."""
    assert delta_multiplier(sigma, count_noise) == pytest.approx(want, rel=1e-12)
