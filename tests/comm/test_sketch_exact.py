"""Exact checks of the sketch operators (src/fedforge/comm/sketch.py) that the Monte Carlo
tests in test_sketch.py cannot make: size validation at its boundaries, padding and block
sizes, the count sketch's structure, and the exact R_t of a fixed (seed, round).

R_t is part of the protocol: every client and the server rebuild it from (seed, round) alone,
so the pinned matrices below must only change together with a deliberate protocol change
(a resumed run or a client on another version would otherwise use another R_t). Written to
kill the mutants the mutation run left (docs/testing.md).
"""

import math

import pytest
import torch

from fedforge.comm.sketch import (
    SKETCHES,
    SRHT,
    CountSketch,
    GaussianSketch,
    IdentitySketch,
    Sketch,
    fwht,
    make_sketch,
    sketch_size,
)

F64 = torch.float64
S3, S2 = 1 / math.sqrt(3), 1 / math.sqrt(2)


def dense(op, t):
    return op.sketch(torch.eye(op.d, dtype=F64), t).reshape(op.d, -1).T


def test_sketch_size_boundaries():
    assert sketch_size(10, size=1) == 1
    assert sketch_size(10, ratio=1) == 10  # ratio 1 is allowed: no compression
    assert sketch_size(10, ratio=4) == 2  # round(2.5) = 2 (banker's rounding of int(round))
    assert sketch_size(10, ratio=3) == 3
    assert sketch_size(10, ratio=100) == 1  # at least one number
    assert sketch_size(10, size=3.9) == 3
    with pytest.raises(ValueError, match=r"^sketch_size: expected an int >= 1, got 0$"):
        sketch_size(10, size=0)
    with pytest.raises(ValueError, match=r"^compression: expected a ratio d/b >= 1, got 0.99$"):
        sketch_size(10, ratio=0.99)
    with pytest.raises(ValueError, match=r"^compression: expected a ratio d/b >= 1, got 0$"):
        sketch_size(10, ratio=0)
    with pytest.raises(ValueError, match=r"^sketch_size / compression: give exactly one"):
        sketch_size(10)


def test_base_sketch_validation_and_sizes():
    with pytest.raises(ValueError, match=r"^sketch: need d >= 1 and b >= 1, got d=0, b=1$"):
        Sketch(0, 1)
    with pytest.raises(ValueError, match=r"got d=1, b=0$"):
        Sketch(1, 0)
    s = Sketch(1, 1, seed=2)
    assert (s.d, s.b, s.seed, s.shape, s.numel) == (1, 1, 2, (1,), 1)
    with pytest.raises(NotImplementedError):
        s.sketch(torch.zeros(1), 1)
    with pytest.raises(NotImplementedError):
        s.desketch(torch.zeros(1), 1)
    assert int(s.key(torch.tensor(3.0))) == int(s.key(3))  # float round tensors work too
    assert int(s.key(3)) != int(s.key(4)) and int(s.key(3, 1)) != int(s.key(3, 2))
    ident = IdentitySketch(4, b=2)  # b is ignored: the identity keeps d numbers
    assert ident.b == 4 and ident.kind == "identity"
    v = torch.arange(4.0)
    assert torch.equal(ident.sketch(v, 1), v) and torch.equal(ident.desketch(v, 1), v)
    with pytest.raises(ValueError, match=r"^identity: expected \[\.\.\., 4\], got \(3,\)$"):
        ident.sketch(torch.zeros(3), 1)


def test_fwht_rejects_other_lengths_and_is_orthonormal():
    with pytest.raises(ValueError, match=r"^fwht: length must be a power of two, got 6$"):
        fwht(torch.zeros(6))
    x = torch.tensor([1.0, 2.0], dtype=F64)
    torch.testing.assert_close(fwht(x), torch.tensor([3.0, -1.0], dtype=F64) / math.sqrt(2))
    assert torch.equal(fwht(torch.tensor([5.0])), torch.tensor([5.0]))


def test_srht_padding_and_blocks():
    assert (SRHT(5, 3).p, SRHT(5, 3).block) == (8, 8)
    assert (SRHT(8, 3).p, SRHT(1, 1).p) == (8, 1)
    assert SRHT(2**20 + 1, 4).block == 2**20  # the default block is 2^20
    assert SRHT(2**21 + 1, 4).p == 3 * 2**20  # padded to a multiple of the block
    assert SRHT(40, 12, block=16).p == 48
    assert SRHT(5, 2).scale == pytest.approx(2.0)  # sqrt(p/b) = sqrt(8/2)
    with pytest.raises(ValueError, match=r"^srht block: expected a power of two, got 24$"):
        SRHT(5, 2, block=24)


def test_gaussian_rows_per_block():
    assert GaussianSketch(1000, 5).rows_per_block == 2**22 // 1000
    assert GaussianSketch(2**23, 5).rows_per_block == 1
    assert GaussianSketch(10, 5, block_elems=35).rows_per_block == 3


def test_count_sketch_structure():
    with pytest.raises(ValueError, match=r"^count sketch: rows and cols must be >= 1, got 0, 2$"):
        CountSketch(5, 2, rows=0)
    with pytest.raises(ValueError, match=r"got 1, 0$"):
        CountSketch(5, 0)
    op = CountSketch(50, 7, rows=3, seed=4)
    assert (op.shape, op.numel, op.b) == ((3, 7), 21, 21)
    r = dense(op, 2).reshape(3, 7, 50)
    # each row: every coordinate in exactly one bucket, with sign ±1/sqrt(rows)
    assert torch.equal((r != 0).sum(1), torch.ones(3, 50, dtype=torch.long))
    torch.testing.assert_close(r.abs().sum(1), torch.full((3, 50), 1 / math.sqrt(3),
                                                          dtype=F64))
    assert len(set(r.argmax(1).abs().flatten().tolist())) > 1  # buckets spread
    assert (r > 0).any() and (r < 0).any()
    est = op.row_estimates(op.sketch(torch.eye(50, dtype=F64)[7], 2), 2)  # e_7 alone
    torch.testing.assert_close(est[:, 7], torch.ones(3, dtype=F64))
    one = CountSketch(6, 6, rows=1, seed=1)
    y = one.sketch(torch.arange(6.0, dtype=F64), 0)
    torch.testing.assert_close(one.desketch(y, 0, mode="median"), one.desketch(y, 0))
    with pytest.raises(ValueError, match=r"^count sketch desketch mode: expected 'mean' or "):
        op.desketch(torch.zeros(3, 7), 2, mode="max")


def test_count_sketch_median_of_rows():
    """With 3 rows the median estimate picks the middle of the three row estimates."""
    op = CountSketch(4, 2, rows=3, seed=0)
    v = torch.tensor([10.0, 1.0, -2.0, 0.5], dtype=F64)
    est = op.row_estimates(op.sketch(v, 0), 0)  # [3, 4]
    torch.testing.assert_close(op.desketch(op.sketch(v, 0), 0, mode="median"),
                               est.median(0).values)
    torch.testing.assert_close(op.desketch(op.sketch(v, 0), 0), est.mean(0))


def test_make_sketch():
    assert set(SKETCHES) == {"identity", "srht", "gaussian", "count"}
    cs = make_sketch("count", 10, 7, seed=3, rows=2)
    assert (cs.rows, cs.cols, cs.seed, cs.b) == (2, 3, 3, 6)  # b // rows columns
    default = make_sketch("count", 10, 4)
    assert (default.rows, default.cols, default.seed) == (1, 4, 0)
    assert make_sketch("count", 10, 1, rows=3).cols == 1  # at least one column
    g = make_sketch("gaussian", 10, 4, seed=5)
    assert (g.kind, g.b, g.seed) == ("gaussian", 4, 5)
    assert make_sketch("srht", 10, 4, seed=6).seed == 6
    with pytest.raises(ValueError, match=r"^sketch: unknown kind 'fft'; expected one of "):
        make_sketch("fft", 10, 2)


def test_pinned_matrices_of_seed_1_round_3():
    """R_3 of seed 1 for d = 5, b = 3 (count: 2 rows × 3 columns)."""
    srht = [[1, 1, 1, 1, 1], [1, -1, 1, -1, 1], [1, -1, 1, -1, 1]]
    torch.testing.assert_close(dense(SRHT(5, 3, seed=1), 3),
                               torch.tensor(srht, dtype=F64) * S3, rtol=0, atol=1e-12)
    count = [[1, 0, 0, 0, -1], [0, 1, -1, -1, 0], [0, 0, 0, 0, 0],
             [0, -1, 0, 0, 0], [1, 0, -1, 0, 0], [0, 0, 0, -1, 1]]
    torch.testing.assert_close(dense(CountSketch(5, 3, rows=2, seed=1), 3),
                               torch.tensor(count, dtype=F64) * S2, rtol=0, atol=1e-12)
    gauss = [[-1.04903669125, 0.140474870262, -0.225725970433, -0.333173971488,
              0.085713076267],
             [0.399448790752, 0.14331809199, 0.797864335421, 0.475317644261, 0.167907660629],
             [0.525036000529, 0.515711297918, -0.193395248586, -0.312262916176,
              0.770307973004]]
    torch.testing.assert_close(dense(GaussianSketch(5, 3, seed=1), 3),
                               torch.tensor(gauss, dtype=F64), rtol=0, atol=1e-11)


@pytest.mark.parametrize("op", [SRHT(5, 3, seed=1), GaussianSketch(5, 3, seed=1),
                                CountSketch(5, 3, rows=2, seed=1)], ids=lambda o: o.kind)
def test_desketch_is_the_exact_transpose_on_a_batch(op):
    r = dense(op, 3)
    y = torch.arange(2 * op.numel, dtype=F64).reshape(2, *op.shape) - 3.0
    torch.testing.assert_close(op.desketch(y, 3), y.reshape(2, -1) @ r, rtol=1e-12,
                               atol=1e-12)
    with pytest.raises(ValueError, match=rf"^{op.kind}: expected \[\.\.\., 5\]"):
        op.sketch(torch.zeros(4, dtype=F64), 3)


def test_default_seeds_and_streams():
    """Seed 0 by default everywhere; the default stream of a key is 0."""
    for op in (Sketch(3, 2), IdentitySketch(3), SRHT(3, 2), GaussianSketch(3, 2),
               CountSketch(3, 2)):
        assert op.seed == 0, op.kind
    assert IdentitySketch(3, seed=5).seed == 5
    s = Sketch(3, 2, seed=7)
    assert int(s.key(3)) == int(s.key(3, 0))
    assert SRHT(5, 2, block=1).p == 5  # a block of one entry is a power of two


def test_float32_inputs_stay_float32():
    v = torch.arange(5, dtype=torch.float32) - 2.0
    for op in (SRHT(5, 3, seed=1), GaussianSketch(5, 3, seed=1), CountSketch(5, 3, 2, seed=1)):
        y = op.sketch(v, 3)
        assert y.dtype == torch.float32 and op.desketch(y, 3).dtype == torch.float32
        torch.testing.assert_close(y.double().reshape(-1), dense(op, 3) @ v.double(),
                                   rtol=1e-5, atol=1e-6)


def test_count_sketch_buckets_are_exact_integer_hashes():
    """bucket = floor((h >> 1) · cols / 2^31) of each coordinate's 32-bit hash, exactly
    (a float32 product would move coordinates near bucket edges)."""
    from fedforge.comm.rng import hash_u32

    op = CountSketch(20000, 97, rows=2, seed=3)
    y = op.sketch(torch.eye(20000, dtype=F64)[::1000], 5)  # 20 unit vectors
    for r in range(2):
        h = hash_u32(op.key(5, 10 + r), torch.arange(0, 20000, 1000))
        want = [((int(x) >> 1) * 97) >> 31 for x in h]
        got = y[:, r, :].abs().argmax(-1).tolist()
        assert got == want
        sign = [1.0 if int(x) & 1 else -1.0 for x in h]
        assert y[:, r, :].sum(-1).sign().tolist() == sign
    # coordinate 961096 (seed 3, round 5, row 0): exact bucket 86, a float32 product gives 87
    big = CountSketch(961097, 97, rows=1, seed=3)
    e = torch.zeros(961097, dtype=F64)
    e[961096] = 1.0
    h = int(hash_u32(big.key(5, 10), torch.tensor(961096)))
    assert int(big.sketch(e, 5)[0].abs().argmax()) == ((h >> 1) * 97) >> 31


def test_two_row_median_is_the_lower_estimate():
    """torch's median of two rows is the lower one (FetchSGD's estimate with rows = 2)."""
    op = CountSketch(6, 2, rows=2, seed=5)
    v = torch.tensor([4.0, -1.0, 2.5, 0.0, 3.0, -2.0], dtype=F64)
    est = op.row_estimates(op.sketch(v, 0), 0)
    assert not torch.equal(est[0], est[1])
    torch.testing.assert_close(op.desketch(op.sketch(v, 0), 0, mode="median"),
                               est.min(0).values)


def test_fwht_buffered_passes_equal_the_stacked_ones_bit_for_bit():
    """The two-buffer transform (outside vmap and autograd) computes the stacked one's sums:
    same bits on a cohort of blocks, the input left as it was, and vmap and a tensor that
    needs its gradient take the stacked path."""
    from fedforge.comm.sketch import _fwht_stacked

    x = torch.randn(3, 5, 256, generator=torch.Generator().manual_seed(0))
    before = x.clone()
    fast = fwht(x)
    assert torch.equal(x, before)
    assert torch.equal(fast, _fwht_stacked(x, 256))
    assert torch.equal(torch.func.vmap(fwht)(x), fast)
    w = x.clone().requires_grad_()
    fwht(w).sum().backward()
    torch.testing.assert_close(w.grad, fwht(torch.ones_like(x)))
    strided = x.transpose(0, 1)[..., :128]  # a non-contiguous view
    assert torch.equal(fwht(strided), _fwht_stacked(strided, 128))
