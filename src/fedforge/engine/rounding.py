"""bf16 weights with stochastic rounding (``engine.precision = "bf16_sr"``).

A client's trained weights stay on bf16's grid for its whole round: the round starts from
the global model rounded to the nearest bf16 value, and after every local step each weight
is rounded to one of its two bf16 neighbours at random, up with probability equal to its
distance from the lower one in units of the gap. That rounding is unbiased, so an update
smaller than half a gap still moves the weight on average, where round-to-nearest would
drop it at every step. The weights are held as float32 tensors whose values are bf16's
(the same numbers, and no cast at the forward).

The random bits are not drawn: they are a counter-based hash (:mod:`fedforge.comm.rng`)
of the client's key (seed, round, client: the key dropout uses), the local step, the
parameter's position and the element's index, so every engine and every rerun round alike.
"""

from __future__ import annotations

import torch

from fedforge.comm.rng import hash_u32, mix32, stream_key

BF16_PRECISIONS = ("bf16", "bf16_sr")  # the forward runs in bf16 autocast
STOCHASTIC = "bf16_sr"
_LOW = 0xFFFF  # the 16 bits of a float32 below bf16's mantissa
_STREAM = 0x53520000  # this module's stream of the client key


def rounding_key(key: torch.Tensor, step: int, leaf: int) -> torch.Tensor:
    """The key of parameter ``leaf``'s rounding at local step ``step`` (``key`` may be
    batched under vmap)."""
    return mix32(key ^ int(stream_key(_STREAM, step, leaf)))


def random_bits(key: torch.Tensor, shape: torch.Size, device: torch.device) -> torch.Tensor:
    """16 uniform bits per element (int32 in [0, 2^16)), from the hash of its index."""
    idx = torch.arange(shape.numel(), dtype=torch.int64, device=device).view(shape)
    return (hash_u32(key.to(device), idx) & _LOW).to(torch.int32)


def stochastic_round(x: torch.Tensor, bits: torch.Tensor) -> torch.Tensor:
    """float32 ``x`` rounded to a bf16 neighbour: ``bits`` added below the mantissa, then
    cut off, so the magnitude rounds up with probability (its part below bf16) / 2^16."""
    return ((x.view(torch.int32) + bits) & ~_LOW).view(torch.float32)


def nearest(x: torch.Tensor) -> torch.Tensor:
    """float32 ``x`` rounded to the nearest bf16 value (ties to even), held in float32."""
    return x.to(torch.bfloat16).to(x.dtype)
