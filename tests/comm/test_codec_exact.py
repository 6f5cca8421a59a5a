"""Exact checks of the uplink codecs (src/fedforge/comm/codec.py) that the multi-round
references leave open: flattening and dtypes, each codec's arguments, keys and state, the
FetchSGD server step against its documented rule, byte counts and errors (docs/testing.md).
"""

import pytest
import torch

from fedforge.client.transforms import RoundContext
from fedforge.comm import compress as C
from fedforge.comm.codec import (
    Codec,
    CompressCodec,
    FetchSGDCodec,
    MarinaCodec,
    SketchCodec,
    flatten,
    numel,
    unflatten,
    zeros_flat,
)
from fedforge.comm.rng import stream_key, uniform
from fedforge.comm.sketch import CountSketch, make_sketch

F64 = torch.float64
PARAMS = {"a": torch.zeros(2, 3, dtype=F64), "b": torch.zeros(4, dtype=F64)}  # d = 10
DELTA = {"a": torch.arange(6, dtype=F64).reshape(2, 3) - 2.5,
         "b": torch.tensor([4.0, -7.0, 0.5, 1.0], dtype=F64)}
FLAT = torch.tensor([-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 4.0, -7.0, 0.5, 1.0], dtype=F64)


def _ctx(round_=1, key=None):
    info = {} if key is None else {"codec_key": torch.tensor(key)}
    return RoundContext(PARAMS, {"round": torch.tensor(float(round_))}, {}, info)


def test_flatten_unflatten_numel_zeros():
    assert flatten(DELTA).tolist() == FLAT.tolist()
    back = unflatten(FLAT.float(), PARAMS)
    assert list(back) == ["a", "b"] and back["a"].shape == (2, 3)
    assert back["a"].dtype == F64 and back["b"].tolist() == [4.0, -7.0, 0.5, 1.0]
    assert back["a"].tolist() == DELTA["a"].tolist()
    assert numel(PARAMS) == 10
    z = zeros_flat(PARAMS)
    assert z.dtype == F64 and z.shape == (10,) and z.abs().sum() == 0


def test_identity_codec():
    codec = Codec()
    assert codec.name == "identity"
    assert codec.client_init(PARAMS) == {} and codec.server_init(PARAMS) == {}
    assert codec.round_info(3, torch.Generator()) == {}
    msg, state = codec.encode(DELTA, {"s": 1}, _ctx())
    assert msg["v"].tolist() == FLAT.tolist() and state == {"s": 1}
    out, state = codec.decode(msg, {"t": 2}, PARAMS, 1)
    assert out["b"].tolist() == DELTA["b"].tolist() and state == {"t": 2}
    assert codec.nbytes(PARAMS) == 40 and codec.nbytes(PARAMS, 3) == 40


def test_sketch_codec_arguments_and_round():
    with pytest.raises(ValueError, match=r"^sketch_size / compression: give one of them$"):
        SketchCodec("srht")
    with pytest.raises(ValueError, match=r"^sketch: unknown kind 'bogus'"):
        SketchCodec("bogus", size=4)
    codec = SketchCodec("count", size=6, seed=3, rows=2)
    assert codec.name == "sketch"
    assert (codec.kind, codec.size, codec.ratio, codec.seed, codec.rows) == ("count", 6, None,
                                                                             3, 2)
    op = codec.op(10)
    assert codec.op(10) is op and isinstance(op, CountSketch)
    assert (op.rows, op.cols, op.seed) == (2, 3, 3)
    msg, state = codec.encode(DELTA, {"s": 1}, _ctx(4))
    assert state == {"s": 1}
    torch.testing.assert_close(msg["y"], op.sketch(FLAT, torch.tensor(4.0)), rtol=0, atol=0)
    assert not torch.equal(msg["y"], op.sketch(FLAT, torch.tensor(5.0)))  # fresh per round
    out, _ = codec.decode(msg, {}, PARAMS, 4)
    torch.testing.assert_close(flatten(out), op.desketch(msg["y"], 4), rtol=0, atol=0)
    assert codec.nbytes(PARAMS) == 4 * 6 + 8
    ratio = SketchCodec("gaussian", ratio=2.0, seed=1)
    assert ratio.op(10).b == 5 and ratio.nbytes(PARAMS) == 4 * 5 + 8
    ident = SketchCodec("identity", ratio=5.0)
    assert ident.op(10).b == 10 and ident.nbytes(PARAMS) == 40


@pytest.mark.parametrize("method", ["topk", "randk"])
def test_compress_codec_needs_k_or_ratio(method):
    with pytest.raises(ValueError, match=r"^k / compression: give one of them for top-k and "
                                         r"random-k$"):
        CompressCodec(method)
    CompressCodec(method, k=2)
    CompressCodec(method, ratio=2.0)


def test_compress_codec_errors_and_fields():
    with pytest.raises(ValueError, match=r"^compressor: unknown method 'drop'; expected one "
                                         r"of \('topk', 'randk', 'qsgd', 'sign'\)$"):
        CompressCodec("drop")
    for levels in (0, -1):
        with pytest.raises(ValueError, match=rf"^levels: expected an int >= 1, got {levels}$"):
            CompressCodec("qsgd", levels=levels)
    CompressCodec("qsgd", levels=1)
    CompressCodec("sign", levels=0)  # levels only matter for QSGD
    codec = CompressCodec("qsgd", levels=3.0, error_feedback=1, seed="7")
    assert codec.levels == 3 and codec.ef is True and codec.seed == 7
    assert (codec.k, codec.ratio) == (None, None)
    with pytest.raises(ValueError, match=r"^k / compression"):  # the default is top-k
        CompressCodec()
    assert CompressCodec(k=2).method == "topk" and CompressCodec(k=2).ef is False
    assert CompressCodec("sign").name == "compress" and CompressCodec("sign")._k(10) == 0
    assert CompressCodec("qsgd")._k(10) == 0 and CompressCodec("qsgd").levels == 16
    assert CompressCodec("topk", k=3)._k(10) == 3 and CompressCodec("randk", ratio=5)._k(10) == 2


def test_compress_codec_round_info_only_for_qsgd():
    g = torch.Generator().manual_seed(4)
    info = CompressCodec("qsgd").round_info(3, g)
    expect = torch.randint(0, 2**32, (3,), generator=torch.Generator().manual_seed(4))
    assert info["codec_key"].tolist() == expect.tolist()
    for method in ("topk", "randk", "sign"):
        assert CompressCodec(method, k=2).round_info(3, g) == {}


def test_compress_codec_each_method():
    v = FLAT
    topk = CompressCodec("topk", k=2)
    assert topk.compress(v, _ctx()).tolist() == C.topk(v, 2).tolist()
    randk = CompressCodec("randk", k=3, seed=5)
    key = stream_key(5, torch.tensor(2))
    assert randk.compress(v, _ctx(2)).tolist() == C.randk(v, 3, key).tolist()
    randk_ef = CompressCodec("randk", k=3, seed=5, error_feedback=True)
    assert randk_ef.compress(v, _ctx(2)).tolist() == C.randk(v, 3, key, unbiased=False).tolist()
    qsgd = CompressCodec("qsgd", levels=3, seed=2)
    expect = C.qsgd(v, 3, stream_key(2, torch.tensor(9)))
    assert qsgd.compress(v, _ctx(1, key=9)).tolist() == expect.tolist()
    assert CompressCodec("sign").compress(v, _ctx()).tolist() == C.scaled_sign(v).tolist()


def test_compress_codec_encode_with_and_without_error_feedback():
    ef = CompressCodec("topk", k=2, error_feedback=True)
    state = ef.client_init(PARAMS)
    assert list(state) == ["residual"] and state["residual"].dtype == F64
    state = {"residual": torch.full((10,), 0.25, dtype=F64)}
    msg, new = ef.encode(DELTA, state, _ctx())
    p = FLAT + 0.25
    assert msg["v"].tolist() == C.topk(p, 2).tolist()
    assert new["residual"].tolist() == (p - C.topk(p, 2)).tolist()
    plain = CompressCodec("topk", k=2)
    assert plain.client_init(PARAMS) == {}
    msg, new = plain.encode(DELTA, {"x": 1}, _ctx())
    assert msg["v"].tolist() == C.topk(FLAT, 2).tolist() and new == {"x": 1}
    assert plain.nbytes(PARAMS) == 16
    assert CompressCodec("qsgd", levels=4).nbytes(PARAMS) == C.compressed_nbytes("qsgd", 10,
                                                                                  0, 4)


def test_marina_codec_arguments_coin_and_state():
    for p in (-0.1, 1.1):
        with pytest.raises(ValueError, match=rf"^sync_prob: expected a probability in \[0, 1\], "
                                             rf"got {p}$"):
            MarinaCodec(k=2, p=p)
    MarinaCodec(k=2, p=0.0)
    MarinaCodec(k=2, p=1.0)
    codec = MarinaCodec(k=3, p=0.4, seed=6)
    assert codec.name == "marina" and (codec.p, codec.seed) == (0.4, 6)
    assert (codec.q.method, codec.q.k, codec.q.seed, codec.q.ef) == ("randk", 3, 6, False)
    assert MarinaCodec(ratio=5.0).q._k(10) == 2 and MarinaCodec(k=2).p == 0.1
    for t in range(1, 30):  # the shared coin, by hand
        u = uniform(stream_key(6, torch.tensor(t), 77), torch.zeros((), dtype=torch.int64))
        assert bool(codec.full_sync(t)) == (t <= 1 or bool(u < 0.4))
        assert bool(codec.full_sync(torch.tensor(float(t)))) == bool(codec.full_sync(t))
    assert codec.client_init(PARAMS)["prev"].dtype == F64
    assert codec.server_init(PARAMS)["g"].shape == (10,)
    t = next(t for t in range(2, 30) if not bool(codec.full_sync(t)))
    prev = torch.full((10,), 0.5, dtype=F64)
    msg, new = codec.encode(DELTA, {"prev": prev}, _ctx(t))
    assert msg["v"].tolist() == codec.q.compress(FLAT - prev, _ctx(t)).tolist()
    assert new["prev"].tolist() == FLAT.tolist()
    g0 = torch.ones(10, dtype=F64)
    out, server = codec.decode(msg, {"g": g0}, PARAMS, t)
    assert server["g"].tolist() == (g0 + msg["v"]).tolist()
    assert flatten(out).tolist() == server["g"].tolist()
    assert codec.nbytes(PARAMS, t) == 4 * 3 + 8 and codec.nbytes(PARAMS) == 40
    msg, _ = codec.encode(DELTA, {"prev": prev}, _ctx(1))  # round 1: full sync
    assert msg["v"].tolist() == FLAT.tolist()
    out, server = codec.decode(msg, {"g": g0}, PARAMS, 1)
    assert server["g"].tolist() == FLAT.tolist() and codec.nbytes(PARAMS, 1) == 40


def _fetch_reference(codec, ys, d, k, lr_at):
    """FetchSGD's server (docstring): S_u <- ρ S_u + S, S_e <- S_e + lr S_u, Δ = top-k of the
    median estimate of S_e, S_e -= sk(Δ), S_u zeroed in the buckets of Δ's support."""
    op = codec.sk.op(d)
    u = torch.zeros(op.shape, dtype=F64)
    e = torch.zeros(op.shape, dtype=F64)
    out = []
    for t, y in enumerate(ys, start=1):
        u = codec.rho * u + y
        e = e + lr_at(t) * u
        est = torch.stack([op.row_estimates(e, 0)[r] for r in range(op.rows)]).median(0).values
        delta = C.topk(est, k)
        e = e - op.sketch(delta, 0)
        hit = op.sketch((delta != 0).to(F64), 0) != 0
        u = torch.where(hit, torch.zeros_like(u), u)
        out.append((delta, u.clone(), e.clone()))
    return out


def test_fetchsgd_server_step_by_its_rule():
    lr = {"kind": "exponential", "init": 0.8, "gamma": 0.5}  # 0.8 · 0.5^t
    codec = FetchSGDCodec(size=12, rows=3, k=2, momentum=0.5, lr=lr, seed=4)
    assert (codec.k, codec.k_ratio, codec.rho, codec.lr) == (2, None, 0.5, lr)
    assert (codec.sk.kind, codec.sk.size, codec.sk.rows, codec.sk.seed) == ("count", 12, 3, 4)
    assert codec.name == "fetchsgd" and codec.nbytes(PARAMS) == 4 * 12
    server = codec.server_init(PARAMS)
    assert server["u"].shape == (3, 4) and server["e"].dtype == F64
    deltas = [DELTA, {k: -0.5 * v for k, v in DELTA.items()}, DELTA]
    ys = []
    for t, d in enumerate(deltas, start=1):
        msg, state = codec.encode(d, {"s": 1}, _ctx(t))
        assert state == {"s": 1}
        torch.testing.assert_close(msg["y"], codec.sk.op(10).sketch(flatten(d), 0))
        ys.append(msg["y"])
    ref = _fetch_reference(codec, ys, 10, 2, lambda t: 0.8 * 0.5**t)
    for t, (y, (delta, u, e)) in enumerate(zip(ys, ref), start=1):
        out, server = codec.decode({"y": y}, server, PARAMS, t)
        torch.testing.assert_close(flatten(out), delta, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(server["u"], u, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(server["e"], e, rtol=1e-12, atol=1e-12)
        assert int((flatten(out) != 0).sum()) <= 2


def test_fetchsgd_k_choices():
    """Default k: a tenth of the columns (at least 1); k_ratio: round(d / ratio)."""
    y = torch.arange(1.0, 41.0, dtype=F64).reshape(1, 40)  # one row, 40 columns
    params = {"w": torch.zeros(100, dtype=F64)}

    def support(codec):
        out, _ = codec.decode({"y": y}, codec.server_init(params), params, 1)
        return int((out["w"] != 0).sum())

    assert support(FetchSGDCodec(size=40, rows=1, momentum=0.0)) <= 4
    assert support(FetchSGDCodec(size=40, rows=1, momentum=0.0, k=7)) <= 7
    assert support(FetchSGDCodec(size=40, rows=1, momentum=0.0, k_ratio=20.0)) <= 5
    big = support(FetchSGDCodec(size=40, rows=1, momentum=0.0, k=60))
    assert big > 7  # many coordinates hash to non-empty buckets
    assert support(FetchSGDCodec(size=40, rows=1, momentum=0.0, k=7, k_ratio=2.0)) <= 7
    small = FetchSGDCodec(size=5, rows=1, momentum=0.0)  # 5 // 10 = 0 -> at least 1
    out, _ = small.decode({"y": torch.ones(1, 5, dtype=F64)}, small.server_init(params),
                          params, 1)
    assert int((out["w"] != 0).sum()) == 1
    assert FetchSGDCodec(ratio=10.0).sk.op(100).numel == 10  # 5 rows of 2 columns
    assert make_sketch("count", 100, 10, 0, 5).shape == (5, 2)


def test_codec_defaults():
    sk = SketchCodec(size=4)
    assert (sk.kind, sk.seed, sk.rows) == ("srht", 0, 1)
    assert MarinaCodec(k=2).seed == 0 and MarinaCodec(k=2).q.seed == 0
    fetch = FetchSGDCodec(size=10)
    assert (fetch.rho, fetch.lr, fetch.k, fetch.k_ratio) == (0.9, 1.0, None, None)
    assert (fetch.sk.seed, fetch.sk.rows) == (0, 5)


def test_sketch_codec_validates_rows_when_built():
    with pytest.raises(ValueError, match=r"^count sketch: rows and cols must be >= 1"):
        SketchCodec("count", size=4, rows=-1)


def test_marina_coin_edges():
    never, always = MarinaCodec(k=2, p=0.0, seed=3), MarinaCodec(k=2, p=1.0, seed=3)
    assert [bool(never.full_sync(t)) for t in range(1, 6)] == [True] + [False] * 4
    assert all(bool(always.full_sync(t)) for t in range(1, 6))


def test_fetchsgd_lr_schedule_name_and_exact_k():
    params = {"w": torch.zeros(100, dtype=F64)}
    bad = FetchSGDCodec(size=10, lr=True)
    with pytest.raises(ValueError, match=r"^server_lr: expected a number or a schedule"):
        bad.decode({"y": torch.ones(5, 2, dtype=F64)}, bad.server_init(params), params, 1)
    y = torch.arange(1.0, 41.0, dtype=F64).reshape(1, 40)  # every bucket non-zero

    def support(codec):
        out, _ = codec.decode({"y": y}, codec.server_init(params), params, 1)
        return int((out["w"] != 0).sum())

    assert support(FetchSGDCodec(size=40, rows=1, momentum=0.0)) == 4  # 40 columns // 10
    assert support(FetchSGDCodec(size=40, rows=1, momentum=0.0, k=7)) == 7
    assert support(FetchSGDCodec(size=40, rows=1, momentum=0.0, k_ratio=20.0)) == 5


def test_unflatten_three_tensors_and_compress_seed_default():
    like = {"a": torch.zeros(2), "b": torch.zeros(3), "c": torch.zeros(1, 2)}
    out = unflatten(torch.arange(7.0), like)
    assert [out[k].tolist() for k in like] == [[0.0, 1.0], [2.0, 3.0, 4.0], [[5.0, 6.0]]]
    assert CompressCodec("sign").seed == 0
