"""Uplink compressors on flat ``[..., d]`` vectors: top-k, random-k, QSGD, scaled sign.

Each returns the *dense simulated reconstruction* ``C(v)`` (what the server rebuilds from the
wire message), so the engine can average it like any delta, and :func:`wire` returns the
tensors that would actually be sent, whose byte size :func:`compressed_nbytes` reports.
Randomness comes from counter hashes (:mod:`fedforge.comm.rng`), so all of it is vmappable.
"""

from __future__ import annotations

import math

import torch

from fedforge.comm.rng import randint, uniform

METHODS = ("topk", "randk", "qsgd", "sign")


def topk(v: torch.Tensor, k: int) -> torch.Tensor:
    """Keep the k largest-magnitude entries of each vector (biased; use with EF)."""
    idx = v.abs().topk(k, dim=-1).indices
    return torch.zeros_like(v).scatter(-1, idx, v.gather(-1, idx))


def randk(v: torch.Tensor, k: int, key: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """k coordinates drawn uniformly with replacement from the shared key; ``unbiased``
    scales by d/k so E[C(v)] = v (MARINA's RandK), otherwise plain selection (with EF)."""
    d = v.shape[-1]
    idx = randint(key, torch.arange(k, device=v.device), d)
    if unbiased:
        return torch.zeros_like(v).index_add(-1, idx, v[..., idx] * (d / k))
    mask = torch.zeros(d, dtype=v.dtype, device=v.device).index_fill(0, idx, 1.0)
    return v * mask


def qsgd(v: torch.Tensor, levels: int, key: torch.Tensor) -> torch.Tensor:
    """QSGD (Alistarh et al. 2017): ``||v|| sign(v) l/s`` with l the stochastic rounding of
    ``s|v_j|/||v||``; unbiased. ``key`` is per client (vmapped) so dithers are independent."""
    norm = v.norm(dim=-1, keepdim=True)
    level = v.abs() / norm.clamp_min(torch.finfo(v.dtype).tiny) * levels
    low = level.floor()
    u = uniform(key.unsqueeze(-1), torch.arange(v.shape[-1], device=v.device), v.dtype)
    q = low + (u < level - low).to(v.dtype)
    return norm * torch.sign(v) * q / levels


def scaled_sign(v: torch.Tensor) -> torch.Tensor:
    """``mean|v| · sign(v)`` (1-bit with an l1 scale, as in EF-signSGD / 1-bit Adam)."""
    return v.abs().mean(-1, keepdim=True) * torch.sign(v)


def count_k(d: int, k: int | None, ratio: float | None) -> int:
    """k from an absolute count or a compression ratio d/k."""
    if k is not None:
        if int(k) < 1 or int(k) > d:
            raise ValueError(f"k: expected 1 <= k <= d={d}, got {k!r}")
        return int(k)
    if ratio is None or ratio < 1:
        raise ValueError(f"compression: expected a ratio d/k >= 1, got {ratio!r}")
    return max(1, min(d, int(round(d / ratio))))


def qsgd_bits(levels: int) -> int:
    """Bits per entry of a QSGD level (levels 0..s) — sign sent separately as one bit."""
    return max(1, math.ceil(math.log2(levels + 1)))


def compressed_nbytes(method: str, d: int, k: int = 0, levels: int = 0) -> int:
    """Exact bytes on the wire for one client's message (see :func:`wire`)."""
    if method == "topk":
        return 4 * k + 4 * k  # fp32 values + int32 indices
    if method == "randk":
        return 4 * k + 8  # fp32 values + the int64 seed that regenerates the indices
    if method == "qsgd":
        return 4 + math.ceil(d / 8) + math.ceil(d * qsgd_bits(levels) / 8)  # norm, signs, levels
    if method == "sign":
        return 4 + math.ceil(d / 8)  # fp32 scale + packed sign bits
    raise ValueError(f"compressor: unknown method {method!r}; expected one of {METHODS}")


def _pack_bits(bits: torch.Tensor) -> torch.Tensor:
    """Pack a 0/1 vector into uint8 (little-endian within a byte)."""
    n = bits.numel()
    padded = torch.zeros(math.ceil(n / 8) * 8, dtype=torch.uint8, device=bits.device)
    padded[:n] = bits.to(torch.uint8)
    weights = (2 ** torch.arange(8, device=bits.device)).to(torch.uint8)
    return (padded.view(-1, 8) * weights).sum(-1).to(torch.uint8)


def wire(method: str, v: torch.Tensor, recon: torch.Tensor, k: int = 0,
         levels: int = 0) -> list[torch.Tensor]:
    """The tensors one client would send for ``recon = C(v)`` (a single flat vector)."""
    if method == "topk":
        idx = recon.nonzero().flatten()
        idx = torch.cat([idx, torch.zeros(k - idx.numel(), dtype=idx.dtype)])  # zeros kept
        return [recon[idx].to(torch.float32), idx.to(torch.int32)]
    if method == "randk":
        return [torch.zeros(k, dtype=torch.float32), torch.zeros(1, dtype=torch.int64)]
    if method == "qsgd":
        norm = v.norm().reshape(1).to(torch.float32)
        q = (recon.abs() / norm.clamp_min(1e-30) * levels).round().to(torch.int64)
        bits = ((q.unsqueeze(-1) >> torch.arange(qsgd_bits(levels))) & 1).flatten()
        return [norm, _pack_bits(recon < 0), _pack_bits(bits)]
    if method == "sign":
        return [v.abs().mean().reshape(1).to(torch.float32), _pack_bits(v < 0)]
    raise ValueError(f"compressor: unknown method {method!r}; expected one of {METHODS}")
