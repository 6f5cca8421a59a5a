"""Counter-based randomness (src/fedforge/comm/rng.py) against a pure-Python reference of
the documented hashes (MurmurHash3's fmix32 on Python ints): every constant, shift, mask and
scaling shows up in the exact bits, so no mutant of the mixer can hide behind statistics
(docs/testing.md).
"""

import math

import torch

from fedforge.comm import rng

M = 0xFFFFFFFF
I64 = torch.int64
# 32-bit values with every byte populated, zero, the top value and a few small counters
VALUES = [0, 1, 2, 7, 31, 32, 33, 255, 65535, 65536, 0x12345678, 0x9ABCDEF0, 0x7FFFFFFF,
          0x80000000, 0xDEADBEEF, M]


def fmix32(h: int) -> int:
    h &= M
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & M
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & M
    return h ^ (h >> 16)


def stream_key_ref(*parts: int) -> int:
    key = 0
    for p in parts:
        key = fmix32((key * 0x9E3779B1 + fmix32(p & M) + 0x7F4A7C15) & M)
    return key


def hash_u32_ref(key: int, idx: int) -> int:
    return fmix32((fmix32((idx ^ key) & M) + key) & M)


def hash_wide_ref(key: int, idx: int) -> int:
    return hash_u32_ref(key, idx & M) ^ fmix32(((idx >> 32) + key * 0x27D4EB2F) & M)


def _t(values):
    return torch.tensor(values, dtype=I64)


def test_known_values_of_fmix32():
    """Pinned literals: fmix32 maps 0 to 0 and 1 to 0x514E28B7."""
    assert fmix32(1) == 0x514E28B7
    assert rng.mix32(_t([0, 1])).tolist() == [0, 0x514E28B7]


def test_mix32_equals_fmix32_and_masks_its_input():
    assert rng.mix32(_t(VALUES)).tolist() == [fmix32(v) for v in VALUES]
    high = [v + (5 << 32) for v in VALUES[:6]]  # bits above 2^32 are dropped first
    assert rng.mix32(_t(high)).tolist() == [fmix32(v) for v in VALUES[:6]]


def test_stream_key_folds_every_part():
    for parts in [(), (0,), (1,), (0, 0), (3, 17), (M, 1, 77), (2**40 + 9, 5), (-1, 2)]:
        key = rng.stream_key(*parts)
        assert key.dtype == I64 and key.shape == ()
        assert int(key) == stream_key_ref(*parts), parts
    # tensor parts (a round as a float tensor) are cast to int64
    assert int(rng.stream_key(4, torch.tensor(3.0))) == stream_key_ref(4, 3)


def test_hash_u32_and_hash_wide():
    key = stream_key_ref(11, 3)
    idx = VALUES + [2**32 + 3, 2**40 + 12345, 2**62 + 7]
    got = rng.hash_u32(torch.tensor(key), _t([i & M for i in idx])).tolist()
    assert got == [hash_u32_ref(key, i & M) for i in idx]
    got = rng.hash_wide(torch.tensor(key), _t(idx)).tolist()
    assert got == [hash_wide_ref(key, i) for i in idx]
    # broadcasting a [2, 1] key over [3] indices
    keys = torch.tensor([[key], [7]])
    assert rng.hash_u32(keys, _t([0, 1, 2])).tolist() == [
        [hash_u32_ref(k, i) for i in range(3)] for k in (key, 7)]


def test_sign_vector_takes_32_bits_per_word_lowest_first():
    key = stream_key_ref(5)
    n = 70  # three words, the last one partly used
    v = rng.sign_vector(torch.tensor(key), n)
    assert v.dtype == torch.float32 and v.shape == (n,)
    ref = [2 * ((hash_u32_ref(key, i // 32) >> (i % 32)) & 1) - 1 for i in range(n)]
    assert v.tolist() == ref
    assert rng.sign_vector(torch.tensor(key), 32, dtype=torch.float64).dtype == torch.float64
    assert rng.sign_vector(torch.tensor(key), 32).tolist() == ref[:32]
    assert rng.sign_vector(torch.tensor(key), 33).tolist() == ref[:33]  # a second word


def test_uniform_signs_randint_per_index():
    key = stream_key_ref(9, 1)
    idx = list(range(40))
    hashes = [hash_u32_ref(key, i) for i in idx]
    u = rng.uniform(torch.tensor(key), _t(idx))
    assert u.dtype == torch.float32
    u64 = rng.uniform(torch.tensor(key), _t(idx), torch.float64)
    assert u64.dtype == torch.float64
    assert u64.tolist() == [(h + 0.5) / 2.0**32 for h in hashes]
    torch.testing.assert_close(u, u64.float(), rtol=0, atol=0)
    s = rng.signs(torch.tensor(key), _t(idx))
    assert s.dtype == torch.float32
    assert s.tolist() == [2 * (h & 1) - 1 for h in hashes]
    assert rng.signs(torch.tensor(key), _t(idx), torch.float64).dtype == torch.float64
    r = rng.randint(torch.tensor(key), _t(idx), 3)
    assert r.dtype == I64
    assert r.tolist() == [math.floor(h / 2.0**32 * 3) for h in hashes]
    assert set(r.tolist()) == {0, 1, 2}  # the top value occurs (a tighter clamp would show)
    # a large range needs the float64 scaling (float32 would lose the low digits)
    big = 2**31 - 1
    r = rng.randint(torch.tensor(key), _t(idx), big)
    assert r.tolist() == [math.floor(h / 2.0**32 * big) for h in hashes]


def test_normal_is_box_muller_on_two_wide_streams():
    key = stream_key_ref(2, 8)
    idx = [0, 1, 2, 3, 2**33 + 1]
    z = rng.normal(torch.tensor(key), _t(idx), torch.float64)
    key2 = fmix32((key + 0x51ED27) & M)
    ref = []
    for i in idx:
        u1 = (hash_wide_ref(key, i) + 0.5) / 2.0**32
        u2 = (hash_wide_ref(key2, i) + 0.5) / 2.0**32
        ref.append(math.sqrt(-2.0 * math.log(u1)) * math.cos(2 * math.pi * u2))
    torch.testing.assert_close(z, torch.tensor(ref, dtype=torch.float64), rtol=1e-12, atol=0)
    assert rng.normal(torch.tensor(key), _t(idx)).dtype == torch.float32


def test_int32_words_hash_to_the_same_bits():
    """The int32 path (two's-complement words, wrapping products, masked shifts) gives the
    int64 path's bits, on values with the top bit set and on a length with a scalar tail."""
    values = VALUES + [(v * 0x9E3779B1 + 17) & M for v in range(37)]
    words = rng.as_int32(_t(values))
    assert words.dtype == torch.int32
    assert words.tolist() == [v - 2**32 if v >= 2**31 else v for v in values]
    assert rng.as_int32(rng.mix32(_t(values))).tolist() == rng.mix32(words).tolist()
    assert [h & M for h in rng.mix32(words).tolist()] == [fmix32(v) for v in values]
    key = stream_key_ref(11, 3)
    got = rng.hash_u32(rng.as_int32(torch.tensor(key)), words)
    assert [h & M for h in got.tolist()] == [hash_u32_ref(key, v) for v in values]
