"""Personalisation is declared, not probed: every algorithm has a typed ``personal`` field
(None or a :class:`Personal` spec), and a personalised method declares exactly the needs its
round shows (its personal parts keep client state and upload nothing, unless, as FedProto,
it sends no model and uploads what it sends instead)."""

from __future__ import annotations

import torch

from fedforge.algorithms import ALGORITHMS, build_algorithm
from fedforge.algorithms.personal import Personal
from fedforge.core.store import ClientStore
from fedforge.engine import LoopEngine
from fedforge.engine.draw import RoundDraw
from fedforge.engine.round import RoundSetup, federated_round
from fedforge.protocol.algorithm import Algorithm

PARAMS = {"net.0.weight": torch.full((2, 2), 0.1), "net.0.bias": torch.zeros(2),
          "net.2.weight": torch.full((2, 2), -0.2), "net.2.bias": torch.full((2,), 0.3)}


def loss(params, x, y, w):
    del y
    h = torch.tanh(x @ params["net.0.weight"].T + params["net.0.bias"])
    out = h @ params["net.2.weight"].T + params["net.2.bias"]
    per = 0.5 * (out ** 2).sum(-1)
    return (per * w).sum() / w.sum().clamp_min(1.0)


def _personalised() -> list[Algorithm]:
    algs = []
    for name in sorted(ALGORITHMS):
        alg = build_algorithm(name)
        assert alg.personal is None or isinstance(alg.personal, Personal), name
        if alg.personal is not None:
            algs.append(alg)
    return algs


def test_personalised_methods_declare_what_their_round_uses():
    algs = _personalised()
    assert len(algs) >= 10  # the registry's personalised methods are all here
    x = torch.randn(6, 2, generator=torch.Generator().manual_seed(0))
    idx = torch.tensor([[[0, 1], [2, 3]], [[4, 5], [5, 4]]])
    for alg in algs:
        needs = alg.needs(PARAMS)
        if not alg.sends_model:  # FedProto: prototypes instead of a delta, from the run's model
            assert {"uploads", "model"} <= needs, alg.name
            continue
        assert "uploads" not in needs, alg.name
        store = ClientStore(2, alg.client_init(PARAMS))
        setup = RoundSetup(alg, LoopEngine(), loss, store, x, torch.zeros(6, dtype=torch.long))
        _, _, cohort = federated_round(setup, PARAMS, alg.server_init(PARAMS),
                                       RoundDraw(torch.tensor([0, 1]), idx, torch.ones(2, 2, 2)))
        assert not cohort.mean_uploads, alg.name  # nothing besides the delta is sent
        assert ("client_state" in needs) == (not store.empty), alg.name


def test_a_part_that_uploads_still_declares_it():
    scaffold = build_algorithm("scaffold")
    assert "uploads" in scaffold.needs(PARAMS) and scaffold.personal is None
