"""Sketch operators: unbiasedness, norm preservation, dense-matrix checks, heavy hitters,
linearity, vmap and shared randomness. Monte Carlo tolerances are stated per test; seeds
are fixed (rounds 1..N of one sketch seed), so the tests are deterministic."""

import math

import numpy as np
import pytest
import torch

from fedforge.comm.sketch import (
    SRHT,
    CountSketch,
    GaussianSketch,
    IdentitySketch,
    fwht,
    make_sketch,
    sketch_size,
)

D, B, TRIALS = 48, 16, 400


def _v(d=D, seed=0):
    return torch.randn(d, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def _ops():
    return [SRHT(D, B, seed=3), GaussianSketch(D, B, seed=3), CountSketch(D, 8, rows=2, seed=3)]


def _dense(op, round_):
    """R as a dense matrix, column j = sk(e_j) (flattened)."""
    eye = torch.eye(op.d, dtype=torch.float64)
    return op.sketch(eye, round_).reshape(op.d, -1).T  # [b, d]


@pytest.mark.parametrize("op", _ops(), ids=lambda o: o.kind)
def test_unbiased_mean_of_RtR_is_identity(op):
    """E[R^T R] = I: the Monte Carlo mean over 400 rounds of R_t^T R_t is within 0.35 of I
    entrywise (each entry's std is <= sqrt(d/b)/sqrt(400) ~ 0.09 for these sizes)."""
    acc = sum(_dense(op, t).T @ _dense(op, t) for t in range(1, TRIALS + 1)) / TRIALS
    assert (acc - torch.eye(D, dtype=torch.float64)).abs().max() < 0.35


@pytest.mark.parametrize("op", _ops(), ids=lambda o: o.kind)
def test_desketch_of_sketch_unbiased_and_norm_preserved(op):
    """Mean of desk(sk(v)) -> v (relative l2 error < 0.2 over 300 rounds; expected about
    sqrt(d/(b·300)) = 0.1) and
    mean ||sk(v)||^2 / ||v||^2 within 10% of 1."""
    v = _v()
    rec = torch.stack([op.desketch(op.sketch(v, t), t) for t in range(1, 301)])
    assert (rec.mean(0) - v).norm() / v.norm() < 0.2
    ratio = torch.stack([op.sketch(v, t).pow(2).sum() for t in range(1, 301)]).mean()
    assert abs(ratio / v.pow(2).sum() - 1) < 0.1


@pytest.mark.parametrize("op", _ops() + [IdentitySketch(D)], ids=lambda o: o.kind)
def test_desketch_is_transpose_and_linear(op):
    """desk = R^T exactly, and desk(mean of sketches) = mean of desk(sketches)."""
    r = _dense(op, 5)
    y = torch.randn(*op.shape, dtype=torch.float64)
    torch.testing.assert_close(op.desketch(y, 5), r.T @ y.reshape(-1))
    vs = torch.stack([_v(seed=s) for s in range(4)])  # a cohort [4, d]
    sk = op.sketch(vs, 5)
    torch.testing.assert_close(op.desketch(sk.mean(0), 5), op.desketch(sk, 5).mean(0))
    torch.testing.assert_close(sk.mean(0), op.sketch(vs.mean(0), 5))


def _hadamard(n):
    h = np.array([[1.0]])
    while h.shape[0] < n:
        h = np.block([[h, h], [h, -h]])
    return h / math.sqrt(n)


def test_fwht_equals_dense_hadamard():
    x = np.random.default_rng(0).normal(size=(3, 64))
    got = fwht(torch.tensor(x)).numpy()
    np.testing.assert_allclose(got, x @ _hadamard(64).T, atol=1e-12)
    np.testing.assert_allclose(fwht(fwht(torch.tensor(x))).numpy(), x, atol=1e-12)


@pytest.mark.parametrize("d,block", [(48, 2**20), (40, 16)])
def test_srht_fast_path_equals_explicit_product(d, block):
    """sqrt(p/b) S H D pad(v), built densely in NumPy from the operator's own signs/rows,
    equals the fast path; ``block=16`` checks the block-diagonal H for large d."""
    op = SRHT(d, 12, seed=1, block=block)
    signs_, rows = op._signs_rows(7, "cpu")
    p = op.p
    h = np.kron(np.eye(p // op.block), _hadamard(op.block))
    s = np.zeros((12, p))
    s[np.arange(12), rows.numpy()] = 1.0
    r = math.sqrt(p / 12) * s @ h @ np.diag(signs_.numpy())[:, :d]
    v = np.random.default_rng(1).normal(size=d)
    np.testing.assert_allclose(op.sketch(torch.tensor(v), 7).numpy(), r @ v, atol=1e-10)
    y = np.random.default_rng(2).normal(size=12)
    np.testing.assert_allclose(op.desketch(torch.tensor(y), 7).numpy(), r.T @ y, atol=1e-10)
    assert op.p == (64 if block > 64 else 48)


def test_count_sketch_recovers_heavy_hitters():
    """5 large coordinates (±50) in d=2000 N(0,1) noise; a 5x200 sketch's median estimate
    puts exactly those 5 on top, each within 10 of its value."""
    d, k = 2000, 5
    v = _v(d, seed=4)
    heavy = torch.tensor([3, 500, 999, 1500, 1999])
    v[heavy] = torch.tensor([50.0, -50.0, 50.0, -50.0, 50.0], dtype=torch.float64)
    op = CountSketch(d, 200, rows=5, seed=0)
    est = op.desketch(op.sketch(v, 0), 0, mode="median")
    assert set(est.abs().topk(k).indices.tolist()) == set(heavy.tolist())
    assert (est[heavy] - v[heavy]).abs().max() < 10


def test_gaussian_blocks_match_one_block():
    """Row blocks of 7 entries (tiny) give the same R as one block: generation is counter
    based, never one dense b×d draw."""
    small = GaussianSketch(D, B, seed=2, block_elems=7 * D)
    big = GaussianSketch(D, B, seed=2)
    assert small.rows_per_block == 7
    torch.testing.assert_close(_dense(small, 3), _dense(big, 3))


@pytest.mark.parametrize("op", _ops(), ids=lambda o: o.kind)
def test_shared_fresh_randomness_and_vmap(op):
    """Same (seed, round) -> same R (clients and server agree); another round -> another R;
    a vmapped per-client sketch with a tensor round equals the batched call."""
    assert torch.equal(_dense(op, 4), _dense(op, 4))
    assert not torch.allclose(_dense(op, 4), _dense(op, 5))
    vs = torch.stack([_v(seed=s) for s in range(3)])
    rt = torch.tensor(4.0)
    got = torch.func.vmap(lambda v: op.sketch(v, rt))(vs)
    torch.testing.assert_close(got, op.sketch(vs, 4))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_cuda_matches_cpu():
    for op in _ops():
        v = _v()
        torch.testing.assert_close(op.sketch(v.cuda(), 2).cpu(), op.sketch(v, 2))


def test_sizes_and_errors():
    assert sketch_size(1000, ratio=10) == 100
    assert sketch_size(1000, size=7) == 7
    with pytest.raises(ValueError, match="compression"):
        sketch_size(1000, ratio=0.5)
    with pytest.raises(ValueError, match="exactly one"):
        sketch_size(1000, 5, 10.0)
    with pytest.raises(ValueError, match="unknown kind"):
        make_sketch("fourier", 10, 2)
    with pytest.raises(ValueError, match=r"expected \[\.\.\., 48\]"):
        SRHT(D, B).sketch(torch.zeros(5), 1)
    assert make_sketch("count", 100, 30, rows=3).shape == (3, 10)
