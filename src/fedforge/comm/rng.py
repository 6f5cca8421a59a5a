"""Counter-based randomness: pure tensor hashes of (seed, round, index).

Sketch matrices, signs and dithers are functions of integer counters, not draws from a
stateful generator. So every client and the server rebuild the same ``R_t`` from
``(seed, round)`` alone (only the seed would travel), any block of ``R_t`` can be generated
on its own (a Gaussian sketch is never materialised as a dense ``b×d``), and the ops work
unchanged under ``torch.func.vmap`` and on CUDA (vmap refuses stateful random ops).

The mixer is the 32-bit MurmurHash3 finaliser on int64 tensors holding values in
``[0, 2^32)``; products of two such values wrap mod 2^64 in torch and the low 32 bits are
exact, so masking keeps the arithmetic exact. The same words may also be held as int32
(two's complement, :func:`as_int32`): products and sums then wrap in 32 bits and right
shifts are masked to act as unsigned ones, so the bits are the same, and the arithmetic runs
2-7x faster on a CPU (dropout masks hash every activation of every step).
"""

from __future__ import annotations

import math

import torch

_M32 = 0xFFFFFFFF


def as_int32(h: torch.Tensor) -> torch.Tensor:
    """Words in [0, 2^32) held as int64, as the int32 tensor with the same 32 bits."""
    return (h - ((h >> 31) & 1) * 2**32).to(torch.int32)


def _signed(c: int) -> int:
    return c - 2**32 if c >= 2**31 else c


def mix32(h: torch.Tensor) -> torch.Tensor:
    """MurmurHash3 fmix32 of an int64 tensor with values in [0, 2^32), or of an int32
    tensor holding the words' bits (the result then holds the hash's bits)."""
    if h.dtype == torch.int32:  # wrapping products; shifts masked to be unsigned
        h = h ^ ((h >> 16) & 0xFFFF)
        h.mul_(_signed(0x85EBCA6B))
        h ^= (h >> 13) & 0x7FFFF
        h.mul_(_signed(0xC2B2AE35))
        return h.bitwise_xor_((h >> 16) & 0xFFFF)
    h = h & _M32
    h = h ^ (h >> 16)
    h = (h * 0x85EBCA6B) & _M32
    h = h ^ (h >> 13)
    h = (h * 0xC2B2AE35) & _M32
    return h ^ (h >> 16)


def stream_key(*parts: int | torch.Tensor) -> torch.Tensor:
    """Fold integers (seed, round, stream id, ...) into one 32-bit key (int64 0-d tensor)."""
    key = torch.zeros((), dtype=torch.int64)
    for p in parts:
        p = torch.as_tensor(p).to(torch.int64)
        key = key.to(p.device)
        key = mix32(key * 0x9E3779B1 + mix32(p & _M32) + 0x7F4A7C15)
    return key


def hash_u32(key: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """32-bit hash of every index in [0, 2^32) under ``key`` (int64 tensors, broadcasting;
    or both int32, as :func:`mix32` takes them).

    Two rounds of mixing, so keys are not related by a permutation of the indices."""
    key = key.to(idx.device)
    return mix32(mix32(idx ^ key) + key)


def hash_wide(key: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """32-bit hash of indices up to 2^63 (both halves mixed in)."""
    return hash_u32(key, idx & _M32) ^ mix32(((idx >> 32) + key.to(idx.device) * 0x27D4EB2F)
                                             & _M32)


def sign_vector(key: torch.Tensor, n: int, device=None, dtype=torch.float32) -> torch.Tensor:
    """``n`` Rademacher signs, 32 per hash word (32x fewer hashes than :func:`signs`)."""
    words = hash_u32(key, torch.arange(-(-n // 32), device=device))
    bits = (words.unsqueeze(-1) >> torch.arange(32, device=device)) & 1
    return (bits.reshape(-1)[:n] * 2 - 1).to(dtype)


def uniform(key: torch.Tensor, idx: torch.Tensor, dtype=torch.float32) -> torch.Tensor:
    """U(0, 1) open interval, one value per index."""
    return ((hash_u32(key, idx).to(torch.float64) + 0.5) / 2.0**32).to(dtype)


def signs(key: torch.Tensor, idx: torch.Tensor, dtype=torch.float32) -> torch.Tensor:
    """Rademacher ±1 per index."""
    return ((hash_u32(key, idx) & 1) * 2 - 1).to(dtype)


def randint(key: torch.Tensor, idx: torch.Tensor, high: int) -> torch.Tensor:
    """Uniform integers in [0, high) per index (float64 scaling; bias below high / 2^32)."""
    u = (hash_u32(key, idx).to(torch.float64)) / 2.0**32
    return (u * high).floor().to(torch.int64).clamp_max(high - 1)


def normal(key: torch.Tensor, idx: torch.Tensor, dtype=torch.float32) -> torch.Tensor:
    """N(0, 1) per index (Box–Muller on two independent hash streams)."""
    u1 = (hash_wide(key, idx).to(torch.float64) + 0.5) / 2.0**32
    u2 = (hash_wide(mix32(key + 0x51ED27), idx).to(torch.float64) + 0.5) / 2.0**32
    return (torch.sqrt(-2.0 * torch.log(u1)) * torch.cos(2 * math.pi * u2)).to(dtype)
