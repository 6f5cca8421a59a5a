"""A small differentiable augmentation for the student steps of MTT (optional, off by default).

MTT's public code uses differentiable siamese augmentation (colour, crop, cutout, flip, scale,
rotate); the FedPTR paper does not say whether it was used, so fedforge leaves it off unless
``augment=True``. This is a reduced version: a random horizontal flip and a random shift of
up to ``max_shift`` pixels (circular), drawn per student step from a seeded generator, both
exact permutations of pixels and so differentiable in the images.
"""

from __future__ import annotations

import torch


def flip_shift(seed: int, max_shift: int = 2):
    """-> ``augment(x, r)`` for :func:`fedforge.distill.mtt.match_trajectory` (x: [n, C, H, W])."""

    def augment(x: torch.Tensor, r: int) -> torch.Tensor:
        g = torch.Generator().manual_seed(seed * 1009 + r)
        if bool(torch.rand((), generator=g) < 0.5):
            x = x.flip(-1)
        dy, dx = (int(v) for v in torch.randint(-max_shift, max_shift + 1, (2,), generator=g))
        return torch.roll(x, shifts=(dy, dx), dims=(-2, -1))

    return augment
