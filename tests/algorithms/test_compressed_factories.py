"""The compressed algorithms' factories pass every argument to the right place
(src/fedforge/algorithms/compressed.py): each one's codec fields, local optimizer and server
optimizer next to the same pieces built directly, the cosine horizon and the errors
(docs/testing.md).
"""

from pathlib import Path

import pytest

from fedforge.algorithms.compressed import (
    SERVER_OPTS,
    _algorithm,
    _cosine,
    _server,
    fetchsgd,
    marina,
    onebit_adam,
    safl,
    topk_ef,
)
from fedforge.algorithms.uplink_diagnostics import UplinkDiagnostics
from fedforge.client.optimizers import local_optimizer
from fedforge.comm.codec import CompressCodec, FetchSGDCodec, MarinaCodec, SketchCodec
from fedforge.server.optimizers import server_adam, server_sgd
from tests.algorithms.factory_paths import local_path, same, server_path

MOMENTUM = local_path(local_optimizer("momentum", 0.05, weight_decay=0.3))


def test_server_choice():
    assert SERVER_OPTS == ("amsgrad", "adam", "sgd")
    same(server_path(_server("sgd", 0.7, 0.5, 0.8, 0.05)), server_path(server_sgd(0.7)))
    same(server_path(_server("adam", 0.7, 0.5, 0.8, 0.05)),
         server_path(server_adam(0.7, 0.5, 0.8, 0.05)))
    same(server_path(_server("amsgrad", 0.7, 0.5, 0.8, 0.05)),
         server_path(server_adam(0.7, 0.5, 0.8, 0.05, amsgrad=True)))
    with pytest.raises(ValueError, match=r"^algorithm\.optimizer: expected one of \('amsgrad', "
                                         r"'adam', 'sgd'\), got 'sgdm'$"):
        _server("sgdm", 0.7, 0.5, 0.8, 0.05)


def test_cosine_horizon():
    assert _cosine(0.1, None, 1e-5) == 0.1
    sched = {"kind": "step", "init": 0.1, "gamma": 0.5, "every": 2}
    assert _cosine(sched, 10, 1e-5) is sched  # a schedule is kept as given
    assert _cosine(1, 10.0, 0) == {"kind": "cosine", "init": 1.0, "rounds": 10, "final": 0.0}
    assert _cosine(0.1, 1, 1e-5) == {"kind": "cosine", "init": 0.1, "rounds": 1,
                                     "final": 1e-5}
    for rounds in (0, -3):
        with pytest.raises(ValueError, match=rf"^algorithm\.rounds: expected an int >= 1, "
                                             rf"got {rounds}$"):
            _cosine(0.1, rounds, 1e-5)


def test_safl_passes_every_argument():
    alg = safl(local_lr=0.05, server_lr=0.7, rounds=None, b1=0.5, b2=0.8, eps=0.05,
               optimizer="adam", sketch="count", sketch_size=6, compression=3.0, sketch_rows=2,
               sketch_seed=4, client_optimizer="momentum", weight_decay=0.3)
    assert alg.name == "safl" and isinstance(alg.codec, SketchCodec)
    c = alg.codec
    assert (c.kind, c.size, c.ratio, c.seed, c.rows) == ("count", 6, None, 4, 2)
    same(local_path(alg.local_optimizer), MOMENTUM)
    same(server_path(alg.server_optimizer), server_path(server_adam(0.7, 0.5, 0.8, 0.05)))
    by_ratio = safl(compression=3.0).codec
    assert (by_ratio.kind, by_ratio.size, by_ratio.ratio, by_ratio.seed, by_ratio.rows) == (
        "srht", None, 3.0, 0, 1)
    cosine = safl(server_lr=0.7, rounds=5, min_lr=0.1, b1=0.5, b2=0.8, eps=0.05)
    ref = server_adam({"kind": "cosine", "init": 0.7, "rounds": 5, "final": 0.1}, 0.5, 0.8,
                      0.05, amsgrad=True)
    same(server_path(cosine.server_optimizer), server_path(ref))


def test_fetchsgd_passes_every_argument():
    alg = fetchsgd(local_lr=0.05, server_lr=0.7, momentum=0.4, sketch_size=12, sketch_rows=3,
                   k=2, topk_compression=5.0, sketch_seed=4, client_optimizer="momentum",
                   weight_decay=0.3)
    c = alg.codec
    assert alg.name == "fetchsgd" and isinstance(c, FetchSGDCodec)
    assert (c.k, c.k_ratio, c.rho, c.lr) == (2, 5.0, 0.4, 0.7)
    assert (c.sk.kind, c.sk.size, c.sk.ratio, c.sk.rows, c.sk.seed) == ("count", 12, None, 3, 4)
    same(local_path(alg.local_optimizer), MOMENTUM)
    same(server_path(alg.server_optimizer), server_path(server_sgd(1.0)))
    by_ratio = fetchsgd(compression=7.0).codec
    assert (by_ratio.sk.size, by_ratio.sk.ratio, by_ratio.sk.rows) == (None, 7.0, 5)


def test_topk_ef_passes_every_argument():
    alg = topk_ef(local_lr=0.05, server_lr=0.7, b1=0.5, b2=0.8, eps=0.05, optimizer="amsgrad",
                  method="qsgd", k=3, compression=4.0, levels=5, error_feedback=False, seed=9,
                  client_optimizer="momentum", weight_decay=0.3)
    c = alg.codec
    assert alg.name == "topk_ef" and isinstance(c, CompressCodec)
    assert (c.method, c.k, c.ratio, c.levels, c.ef, c.seed) == ("qsgd", 3, None, 5, False, 9)
    same(local_path(alg.local_optimizer), MOMENTUM)
    same(server_path(alg.server_optimizer),
         server_path(server_adam(0.7, 0.5, 0.8, 0.05, amsgrad=True)))
    d = topk_ef(compression=4.0).codec
    assert (d.method, d.k, d.ratio, d.levels, d.ef, d.seed) == ("topk", None, 4.0, 16, True, 0)


def test_onebit_adam_passes_every_argument():
    alg = onebit_adam(local_lr=0.05, server_lr=0.7, b1=0.5, b2=0.8, eps=0.05,
                      error_feedback=False, client_optimizer="momentum", weight_decay=0.3)
    c = alg.codec
    assert alg.name == "onebit_adam" and (c.method, c.ef) == ("sign", False)
    assert onebit_adam().codec.ef is True
    same(local_path(alg.local_optimizer), MOMENTUM)
    same(server_path(alg.server_optimizer), server_path(server_adam(0.7, 0.5, 0.8, 0.05)))


def test_marina_passes_every_argument():
    alg = marina(local_lr=0.05, server_lr=0.7, optimizer="adam", b1=0.5, b2=0.8, eps=0.05,
                 k=3, compression=4.0, sync_prob=0.3, seed=6, client_optimizer="momentum",
                 weight_decay=0.3)
    c = alg.codec
    assert alg.name == "marina" and isinstance(c, MarinaCodec)
    assert (c.p, c.seed, c.q.k, c.q.ratio, c.q.seed) == (0.3, 6, 3, None, 6)
    assert alg.requires == frozenset({"full_participation"})
    same(local_path(alg.local_optimizer), MOMENTUM)
    same(server_path(alg.server_optimizer), server_path(server_adam(0.7, 0.5, 0.8, 0.05)))
    by_ratio = marina(compression=4.0).codec
    assert (by_ratio.q.k, by_ratio.q.ratio) == (None, 4.0)
    same(server_path(marina(server_lr=0.7).server_optimizer), server_path(server_sgd(0.7)))


def test_descriptions_are_the_documented_ones():
    """What ``fedforge algorithms`` prints is the list in docs/algorithms.md."""
    page = (Path(__file__).resolve().parents[2] / "docs" / "algorithms.md").read_text()
    for alg in (safl(), fetchsgd(), topk_ef(), onebit_adam(), marina()):
        assert f"\nsync: {alg.description}\n" in page, alg.name


def test_diagnostics_window_reaches_the_uplink_diagnostics():
    """Off (no part) by default; a window W gives exactly one ``UplinkDiagnostics(W)``."""
    factories = {"safl": safl, "fetchsgd": fetchsgd, "topk_ef": topk_ef, "marina": marina}
    for name, factory in factories.items():
        assert factory().parts == (), name
        (part,) = factory(diagnostics_window=3).parts
        assert type(part) is UplinkDiagnostics and part.window == 3, name
    assert onebit_adam().parts == ()  # it has no window and keeps _algorithm's default, off
    (part,) = _algorithm("x", 0.05, "sgd", 0.0, server_sgd(1.0), CompressCodec("sign"), "d",
                         7).parts
    assert type(part) is UplinkDiagnostics and part.window == 7


def test_defaults_reach_the_pieces():
    """Defaults the multi-round defaults check cannot see: on its tiny model every ratio gives
    the same sketch size, FetchSGD's top-k keeps nothing, SAFL's ``min_lr`` needs a horizon
    and MARINA's Adam constants need ``optimizer="adam"``."""
    s = safl().codec
    assert (s.kind, s.size, s.ratio, s.seed, s.rows) == ("srht", None, 100.0, 0, 1)
    f = fetchsgd().codec
    assert (f.k, f.k_ratio, f.rho, f.lr) == (None, None, 0.9, 1.0)
    assert (f.sk.size, f.sk.ratio, f.sk.rows, f.sk.seed) == (None, 100.0, 5, 0)
    t = topk_ef().codec
    assert (t.method, t.k, t.ratio, t.levels, t.ef, t.seed) == ("topk", None, 100.0, 16, True, 0)
    m = marina().codec
    assert (m.p, m.seed, m.q.k, m.q.ratio) == (0.1, 0, None, 100.0)
    cosine = safl(server_lr=0.7, rounds=5)
    ref = server_adam({"kind": "cosine", "init": 0.7, "rounds": 5, "final": 1e-5}, 0.9, 0.99,
                      1e-3, amsgrad=True)
    same(server_path(cosine.server_optimizer), server_path(ref))
    same(server_path(marina(server_lr=0.7, optimizer="adam").server_optimizer),
         server_path(server_adam(0.7, 0.9, 0.99, 1e-3)))
