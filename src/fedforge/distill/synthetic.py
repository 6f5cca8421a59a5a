"""Initial synthetic sets: real images per class where the party has them, noise elsewhere."""

from __future__ import annotations

import torch


def synthetic_labels(
    num_classes: int, ipc: int, device: torch.device | str = "cpu"
) -> torch.Tensor:
    """Fixed hard labels ``[ipc * num_classes]``: ``ipc`` images of class 0, then class 1, ..."""
    return torch.arange(num_classes, device=device).repeat_interleave(ipc)


def init_synthetic(
    x: torch.Tensor,
    y: torch.Tensor,
    num_classes: int,
    ipc: int,
    generator: torch.Generator,
    input_shape: tuple[int, ...] | None = None,
) -> torch.Tensor:
    """``[ipc * num_classes, *input_shape]`` synthetic inputs (FedPTR Sec. 5.1).

    For each class present in ``(x, y)`` (the party's real samples), ``ipc`` of its images are
    drawn with replacement; absent classes get N(0, 1) noise in the (normalised) input space.
    ``x`` may be empty (FedPTR-S, or a client with no data): then everything is noise, and
    ``input_shape`` must be given.
    """
    shape = tuple(x.shape[1:]) if input_shape is None else tuple(input_shape)
    if not x.is_floating_point():
        raise ValueError(
            f"synthetic sets need real-valued inputs (images); got {x.dtype} (token data?)"
        )
    out = torch.randn((num_classes * ipc, *shape), generator=generator, dtype=x.dtype)
    out = out.to(x.device)
    for c in range(num_classes):
        (rows,) = torch.nonzero(y == c, as_tuple=True)
        if rows.numel():
            pick = torch.randint(rows.numel(), (ipc,), generator=generator).to(rows.device)
            out[c * ipc : (c + 1) * ipc] = x[rows[pick]]
    return out
