"""Compressors and codecs: hand numbers, unbiasedness, error feedback, byte accounting."""

import math

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
    unflatten,
)
from fedforge.comm.rng import stream_key

PARAMS = {"a": torch.zeros(3, 4), "b": torch.zeros(5)}  # d = 17


def _ctx(round_=1, key=None, state=None):
    info = {} if key is None else {"codec_key": torch.tensor(key)}
    return RoundContext(PARAMS, {"round": torch.tensor(float(round_))}, state or {}, info)


def _delta(seed=0):
    g = torch.Generator().manual_seed(seed)
    return {"a": torch.randn(3, 4, generator=g), "b": torch.randn(5, generator=g)}


def test_hand_numbers():
    v = torch.tensor([0.5, -3.0, 1.0, 2.0])
    assert C.topk(v, 2).tolist() == [0.0, -3.0, 0.0, 2.0]
    assert C.scaled_sign(v).tolist() == [1.625, -1.625, 1.625, 1.625]  # mean|v| = 6.5/4
    # QSGD with s=1: ||v|| sign(v) * Bernoulli(|v|/||v||); s=|v|/||v|| exactly 1 -> kept
    one = torch.tensor([0.0, 2.0, 0.0])
    assert C.qsgd(one, 1, stream_key(0)).tolist() == [0.0, 2.0, 0.0]


def test_qsgd_and_randk_unbiased():
    """Monte Carlo over 4000 (QSGD) / 1500 (random-k) keys: mean within 0.05 / 0.1·||v|| of v
    (per-entry std of
    the mean is below ||v||/sqrt(4000·s) for QSGD and ||v||·sqrt(d/k/4000) for random-k)."""
    v = torch.tensor([0.3, -1.2, 0.05, 2.0, -0.7, 0.0], dtype=torch.float64)
    keys = torch.arange(4000)
    q = torch.func.vmap(lambda k: C.qsgd(v, 4, stream_key(7, k)))(keys)
    assert (q.mean(0) - v).abs().max() < 0.05 * v.norm()
    r = torch.stack([C.randk(v, 2, stream_key(3, int(k))) for k in keys[:1500]])
    assert (r.mean(0) - v).abs().max() < 0.1 * v.norm()


@pytest.mark.parametrize("method", ["topk", "randk", "qsgd", "sign"])
def test_error_feedback_residual_plus_sent_is_original(method):
    """Every step: sent + new residual = delta + old residual (exactly, up to float)."""
    codec = CompressCodec(method, k=4, levels=2, error_feedback=True, seed=1)
    state = codec.client_init(PARAMS)
    for t in range(1, 6):
        d = _delta(t)
        msg, new = codec.encode(d, state, _ctx(t, key=t))
        torch.testing.assert_close(msg["v"] + new["residual"], flatten(d) + state["residual"])
        state = new
    assert state["residual"].abs().sum() > 0


def _wire_bytes(tensors):
    return sum(t.numel() * t.element_size() for t in tensors)


@pytest.mark.parametrize("method,k,levels", [("topk", 5, 0), ("randk", 5, 0), ("qsgd", 0, 4),
                                             ("qsgd", 0, 255), ("sign", 0, 0)])
def test_byte_accounting_equals_wire_tensors(method, k, levels):
    codec = CompressCodec(method, k=k or None, ratio=None if k else 1.0, levels=levels or 16)
    v = flatten(_delta(3))
    msg, _ = codec.encode(unflatten(v, PARAMS), {}, _ctx(2, key=5))
    wire = C.wire(method, v, msg["v"], k=k, levels=levels or 16)
    assert codec.nbytes(PARAMS) == _wire_bytes(wire)


def test_sketch_codec_bytes_equal_sketch_tensor_plus_seed():
    for kind, rows in [("srht", 1), ("gaussian", 1), ("count", 2)]:
        codec = SketchCodec(kind, size=8, seed=0, rows=rows)
        msg, _ = codec.encode(_delta(), {}, _ctx())
        seed = torch.zeros(1, dtype=torch.int64)  # the only other thing sent
        assert codec.nbytes(PARAMS) == _wire_bytes([msg["y"], seed])
    assert Codec().nbytes(PARAMS) == 17 * 4
    assert SketchCodec("identity", ratio=1.0).nbytes(PARAMS) == 17 * 4
    fetch = FetchSGDCodec(size=10, rows=5, k=3)
    msg, _ = fetch.encode(_delta(), {}, _ctx())
    assert fetch.nbytes(PARAMS) == _wire_bytes([msg["y"]]) == 4 * 10


def test_marina_full_sync_and_differences():
    """Round 1 is a full sync; later rounds send Q(delta - prev) unless the shared coin says
    sync; the server's g tracks mean delta exactly on sync rounds."""
    codec = MarinaCodec(k=4, p=0.3, seed=2)
    syncs = [bool(codec.full_sync(t)) for t in range(1, 40)]
    assert syncs[0] and any(syncs[1:]) and not all(syncs[1:])
    state, server = codec.client_init(PARAMS), codec.server_init(PARAMS)
    for t in range(1, 8):
        d = _delta(t)
        msg, new = codec.encode(d, state, _ctx(t))
        if syncs[t - 1]:
            torch.testing.assert_close(msg["v"], flatten(d))
            assert codec.nbytes(PARAMS, t) == 17 * 4
        else:
            expect = codec.q.compress(flatten(d) - state["prev"], _ctx(t))
            torch.testing.assert_close(msg["v"], expect)
            assert codec.nbytes(PARAMS, t) == 4 * 4 + 8
        g, server = codec.decode(msg, server, PARAMS, t)
        if syncs[t - 1]:
            torch.testing.assert_close(flatten(g), flatten(d))
        state = new


def test_fetchsgd_server_exact_with_identity_like_sketch():
    """With a count sketch wide enough to have no collisions on this support, k = d and
    momentum 0, FetchSGD's server step returns lr · (mean delta) and empties its error."""
    params = {"w": torch.zeros(4, dtype=torch.float64)}
    codec = FetchSGDCodec(size=4000, rows=1, k=4, momentum=0.0, lr=0.5, seed=0)
    server = codec.server_init(params)
    d = {"w": torch.tensor([1.0, -2.0, 3.0, 0.5], dtype=torch.float64)}
    msg, _ = codec.encode(d, {}, _ctx())
    out, server = codec.decode(msg, server, params, 1)
    torch.testing.assert_close(out["w"], 0.5 * d["w"])
    assert server["e"].abs().max() < 1e-12


def test_bad_input_errors():
    with pytest.raises(ValueError, match="unknown method"):
        CompressCodec("dropout")
    with pytest.raises(ValueError, match="k / compression"):
        CompressCodec("topk")
    with pytest.raises(ValueError, match="sync_prob"):
        MarinaCodec(k=1, p=1.5)
    with pytest.raises(ValueError, match="k: expected"):
        C.count_k(10, 11, None)
    assert math.ceil(17 / 8) == len(C._pack_bits(torch.ones(17)))
