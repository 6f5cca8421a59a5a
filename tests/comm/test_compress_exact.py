"""Exact checks of the uplink compressors (src/fedforge/comm/compress.py): each compressor's
output from the same counter hashes, by hand; the k and byte formulas at their edges; the
bit packing and wire tensors; every error message (docs/testing.md).
"""

import pytest
import torch

from fedforge.comm import compress as C
from fedforge.comm.rng import randint, stream_key, uniform

F64 = torch.float64


def test_topk_per_row():
    v = torch.tensor([[0.5, -3.0, 1.0, 2.0], [4.0, 0.125, -0.25, 0.5]])
    assert C.topk(v, 2).tolist() == [[0.0, -3.0, 0.0, 2.0], [4.0, 0.0, 0.0, 0.5]]
    assert C.topk(v, 1).tolist() == [[0.0, -3.0, 0.0, 0.0], [4.0, 0.0, 0.0, 0.0]]


def test_randk_unbiased_scales_by_d_over_k_and_sums_repeats():
    v = torch.tensor([[1.0, 2.0, 3.0, 4.0, 5.0], [-1.0, -2.0, -3.0, -4.0, -5.0]], dtype=F64)
    key = stream_key(3, 1)
    k, d = 3, 5
    idx = randint(key, torch.arange(k), d).tolist()
    expect = torch.zeros(2, d, dtype=F64)
    for j in idx:  # drawn with replacement: a repeated index counts twice
        expect[:, j] += v[:, j] * d / k
    torch.testing.assert_close(C.randk(v, k, key), expect, rtol=1e-12, atol=0)
    mask = torch.zeros(d, dtype=F64)
    mask[idx] = 1.0
    torch.testing.assert_close(C.randk(v, k, key, unbiased=False), v * mask, rtol=0, atol=0)


def test_randk_repeats_are_counted():
    """A key whose k = 4 draws on d = 3 repeat an index (pigeonhole): the sum keeps both."""
    v = torch.tensor([1.0, 10.0, 100.0], dtype=F64)
    key = stream_key(0)
    idx = randint(key, torch.arange(4), 3).tolist()
    counts = [idx.count(j) for j in range(3)]
    assert max(counts) >= 2
    expect = torch.tensor([c * x * 3 / 4 for c, x in zip(counts, v.tolist())], dtype=F64)
    torch.testing.assert_close(C.randk(v, 4, key), expect, rtol=1e-12, atol=0)


def test_qsgd_by_hand():
    """level = s|v_j|/||v||, rounded up where the shared uniform is below its fraction."""
    v = torch.tensor([3.0, -4.0, 0.0, 1.0, -2.0], dtype=F64)
    s, key = 3, stream_key(7, 2)
    norm = v.norm()
    u = uniform(key, torch.arange(5), F64)
    level = v.abs() / norm * s
    q = level.floor() + (u < level - level.floor()).to(F64)
    expect = norm * torch.sign(v) * q / s
    out = C.qsgd(v, s, key)
    torch.testing.assert_close(out, expect, rtol=1e-12, atol=0)
    assert set((out.abs() * s / norm).round().tolist()) <= {0.0, 1.0, 2.0, 3.0}
    # rows with their own keys (vmapped clients): row i uses key i
    rows = torch.stack([v, 2 * v])
    keys = torch.stack([key, stream_key(7, 3)])
    out2 = C.qsgd(rows, s, keys)
    torch.testing.assert_close(out2[0], expect, rtol=1e-12, atol=0)
    torch.testing.assert_close(out2[1], 2 * C.qsgd(v, s, keys[1]), rtol=1e-12, atol=0)
    # the zero vector stays zero (the norm is floored, no 0/0)
    assert C.qsgd(torch.zeros(4, dtype=F64), s, key).tolist() == [0.0] * 4
    # float32 in, float32 out (the dither is drawn in the vector's dtype)
    assert C.qsgd(v.float(), s, key).dtype == torch.float32


def test_scaled_sign_per_row():
    v = torch.tensor([[1.0, -3.0], [0.0, 2.0]])
    assert C.scaled_sign(v).tolist() == [[2.0, -2.0], [0.0, 1.0]]


def test_count_k_edges_and_errors():
    assert C.count_k(10, 1, None) == 1
    assert C.count_k(10, 10, None) == 10
    assert C.count_k(10, 3.0, 5.0) == 3  # k wins over the ratio
    assert C.count_k(10, None, 1.0) == 10
    assert C.count_k(10, None, 3.0) == 3  # round(3.33)
    assert C.count_k(10, None, 1.6) == 6  # round(6.25)
    assert C.count_k(10, None, 100.0) == 1  # at least one
    for k in (0, 11):
        with pytest.raises(ValueError, match=rf"^k: expected 1 <= k <= d=10, got {k}$"):
            C.count_k(10, k, None)
    for ratio in (None, 0.5):
        with pytest.raises(ValueError, match=r"^compression: expected a ratio d/k >= 1, "
                                             rf"got {ratio}$"):
            C.count_k(10, None, ratio)


def test_qsgd_bits():
    assert [C.qsgd_bits(s) for s in (0, 1, 2, 3, 4, 7, 8, 255)] == [1, 1, 2, 2, 3, 3, 4, 8]


def test_compressed_nbytes_by_hand():
    assert C.compressed_nbytes("topk", 17, k=5) == 40  # 5 fp32 values + 5 int32 indices
    assert C.compressed_nbytes("randk", 17, k=5) == 28  # 5 values + an int64 seed
    # norm 4 + ceil(17/8) = 3 sign bytes + ceil(17·3/8) = 7 level bytes (4 levels: 3 bits)
    assert C.compressed_nbytes("qsgd", 17, levels=4) == 14
    assert C.compressed_nbytes("qsgd", 16, levels=1) == 4 + 2 + 2
    assert C.compressed_nbytes("sign", 17) == 4 + 3
    assert C.compressed_nbytes("sign", 16) == 4 + 2
    assert C.compressed_nbytes("topk", 17) == 0 and C.compressed_nbytes("randk", 17) == 8
    with pytest.raises(ValueError, match=r"^compressor: unknown method 'dropout'; expected "
                                         r"one of \('topk', 'randk', 'qsgd', 'sign'\)$"):
        C.compressed_nbytes("dropout", 17)


def test_pack_bits_little_endian():
    bits = torch.tensor([1, 0, 1, 1, 0, 0, 0, 0, 1, 1])
    packed = C._pack_bits(bits)
    assert packed.dtype == torch.uint8
    assert packed.tolist() == [13, 3]
    assert C._pack_bits(torch.ones(8)).tolist() == [255]
    assert C._pack_bits(torch.tensor([True] + [False] * 7 + [True])).tolist() == [1, 1]


def test_wire_tensors_by_hand():
    v = torch.tensor([0.5, -3.0, 1.0, 2.0])
    top = C.topk(v, 2)
    vals, idx = C.wire("topk", v, top, k=3)  # only 2 non-zeros: index 0 pads
    assert vals.dtype == torch.float32 and idx.dtype == torch.int32
    assert idx.tolist() == [1, 3, 0] and vals.tolist() == [-3.0, 2.0, 0.0]
    vals, seed = C.wire("randk", v, v, k=3)
    assert vals.dtype == torch.float32 and vals.tolist() == [0.0] * 3
    assert seed.dtype == torch.int64 and seed.tolist() == [0]
    scale, signs = C.wire("sign", v, C.scaled_sign(v))
    assert scale.dtype == torch.float32 and scale.tolist() == [1.625]
    assert signs.tolist() == [2]  # only entry 1 is negative
    # QSGD, s = 2: recon entries ||v|| l/s with levels l = 0, 2, 1, 1
    w = torch.tensor([0.0, -3.0, 0.0, 4.0], dtype=F64)  # ||w|| = 5
    recon = torch.tensor([0.0, -5.0, 0.0, 2.5], dtype=F64)
    norm, sign_bits, level_bits = C.wire("qsgd", w, recon, levels=2)
    assert norm.dtype == torch.float32 and norm.tolist() == [5.0]
    assert sign_bits.tolist() == [2]
    # 2 bits per level, lowest first: 0 -> 00, 2 -> 01, 0 -> 00, 1 -> 10 => bits 0,0,0,1,0,0,1,0
    assert level_bits.tolist() == [0b01001000]
    with pytest.raises(ValueError, match=r"^compressor: unknown method 'x'; expected one of "):
        C.wire("x", v, v)


def test_wire_of_float64_vectors_is_float32_and_zero_is_not_negative():
    v = torch.tensor([0.0, -3.0, 1.0, 2.0], dtype=F64)
    vals, _ = C.wire("topk", v, C.topk(v, 2), k=2)
    assert vals.dtype == torch.float32 and vals.tolist() == [-3.0, 2.0]
    scale, signs = C.wire("sign", v, C.scaled_sign(v))
    assert scale.dtype == torch.float32 and scale.tolist() == [1.5]
    assert signs.tolist() == [2]  # the zero entry is not sent as negative
    _, sign_bits, _ = C.wire("qsgd", v, v, levels=1)
    assert sign_bits.tolist() == [2]
    # a vector of norm below 1: levels relative to its own norm 0.5
    w = torch.tensor([0.3, 0.0, -0.4], dtype=F64)
    recon = torch.tensor([0.5, 0.0, -0.5], dtype=F64)  # levels 1, 0, 1 of s = 1
    _, _, level_bits = C.wire("qsgd", w, recon, levels=1)
    assert level_bits.tolist() == [0b101]


def test_wire_qsgd_of_zero_vector_has_zero_levels():
    z = torch.zeros(3)
    norm, sign_bits, level_bits = C.wire("qsgd", z, z, levels=1)
    assert norm.tolist() == [0.0] and sign_bits.tolist() == [0] and level_bits.tolist() == [0]
