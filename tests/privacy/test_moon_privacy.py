"""MOON under differential privacy: its local loss is its own (the contrastive term), so
DP-SGD, which clips and noises the run's loss per sample, is refused; client-level DP clips
the delta MOON's own gradient steps make."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("dp_accounting", reason="needs the privacy extra (dp-accounting)")

from fedforge.algorithms import build_algorithm  # noqa: E402
from fedforge.engine.local import classification_loss, local_update_of  # noqa: E402
from fedforge.privacy.algorithm import KEY  # noqa: E402
from fedforge.privacy.checks import check_algorithm  # noqa: E402
from fedforge.privacy.config import PrivacyConfig  # noqa: E402
from tests.privacy.test_personal_privacy import SEED_KEY, _norm, _private, _problem  # noqa: E402


def test_dp_sgd_is_refused_in_one_line_naming_the_field():
    cfg = PrivacyConfig(mode="sample", noise_multiplier=1.0, clip=1.0)
    with pytest.raises(ValueError, match=r"^privacy.mode: 'sample' is ill-defined for "
                                         r"algorithm 'moon': its local loss is its own"):
        check_algorithm(build_algorithm("moon"), None, cfg)


def _delta(algorithm, model, params, xs, ys, ws):
    """One client's delta in a round where it has a previous model (the term is on)."""
    algorithm.bind_model(model)
    state = algorithm.client_init(params)
    state["moon"] = {"prev": {k: v + 0.3 * torch.ones_like(v) for k, v in params.items()},
                     "trained": torch.ones(())}
    broadcast = {**algorithm.broadcast(algorithm.server_init(params)),
                 "round": torch.tensor(1.0)}
    info = {KEY: SEED_KEY} if algorithm.privacy is not None else {}
    update = local_update_of(algorithm, classification_loss(model), masked=True)
    return update(params, broadcast, state, info, xs, ys, ws).delta


def test_central_dp_clips_the_delta_of_moons_own_gradient():
    model, params, xs, ys, ws = _problem()
    plain = build_algorithm("moon", local_lr=0.1)
    delta = _delta(plain, model, params, xs, ys, ws)
    fedavg_like = _delta(build_algorithm("moon", local_lr=0.1, mu=0.0), model, params, xs, ys,
                         ws)
    assert not torch.allclose(_norm(delta), _norm(fedavg_like))  # the term moves the delta
    clip = float(_norm(delta)) / 2
    private = _private(plain, "central", clip, sigma=0.7)
    check_algorithm(private, params, private.privacy.cfg)  # not refused
    got = _delta(private, model, params, xs, ys, ws)
    for k in params:
        torch.testing.assert_close(got[k], delta[k] / 2, rtol=1e-5, atol=1e-7)
