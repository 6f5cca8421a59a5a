"""Minibatch schedules for a whole cohort at once, as dense padded tensors.

Vectorised clients need every client's local batches in one ``[clients, steps, batch]`` block,
so schedules are drawn with a few sorts over all clients instead of one DataLoader per client.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from fedforge.core.memory import check_allocation

BYTES_PER_SLOT = 5 * 8 + 1 + 8
"""Peak bytes per ``[client, step, batch]`` slot: int64 offsets, flat indices, positions,
shuffle keys and their sort order, a bool validity mask and the float mask."""


def _ceil_div(a: torch.Tensor | int, b: torch.Tensor | int) -> torch.Tensor:
    return torch.div(a + b - 1, b, rounding_mode="floor")  # type: ignore[operator]


def permutation_pool(
    sizes: torch.Tensor, passes: torch.Tensor,
    generator: torch.Generator | Sequence[torch.Generator],
) -> tuple[torch.Tensor, torch.Tensor]:
    """``passes[i]`` fresh random permutations of ``range(sizes[i])`` per client, concatenated.

    Returns ``(pool, start)``: client i's p-th permutation is
    ``pool[start[i] + p * sizes[i] : start[i] + (p + 1) * sizes[i]]``. One float64 sort of
    ``segment + U[0, 0.5)`` keys shuffles every segment at once; keys never cross a segment
    boundary, so each segment is always an exact permutation. ``generator`` may be one per
    client (asynchronous jobs): client i's keys are then its own generator's first draws, as
    if it were drawn alone.
    """
    device = sizes.device
    seg_len = torch.repeat_interleave(sizes, passes)
    total = int(seg_len.sum())
    seg_id = torch.repeat_interleave(torch.arange(len(seg_len), device=device), seg_len)
    seg_start = torch.cumsum(seg_len, 0) - seg_len
    per_client = sizes * passes
    if isinstance(generator, torch.Generator):
        keys = torch.rand(total, generator=generator, device=generator.device,
                          dtype=torch.float64)
    else:
        if len(generator) != len(sizes):
            raise ValueError(f"permutation_pool: {len(generator)} generators for "
                             f"{len(sizes)} clients")
        keys = torch.cat([torch.rand(n, generator=g, device=g.device, dtype=torch.float64)
                          for n, g in zip(per_client.tolist(), generator, strict=True)])
    order = torch.argsort(keys.to(device).mul_(0.5).add_(seg_id))
    pool = order - seg_start[seg_id]
    return pool, torch.cumsum(per_client, 0) - per_client


def _check_slots(clients: int, steps: int, batch_size: int, device: torch.device) -> None:
    """Refuse a schedule that cannot fit before any of it is allocated."""
    check_allocation(clients * steps * batch_size * BYTES_PER_SLOT,
                     f"client.batch_size: batches of {batch_size} for {clients} clients x "
                     f"{steps} steps", device)


def client_batches(
    sizes: torch.Tensor,
    steps: int | None,
    epochs: int | None,
    batch_size: int,
    generator: torch.Generator | Sequence[torch.Generator],
    drop_last: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Local minibatch positions for a cohort: ``pos`` int64 and ``mask`` (default dtype), both
    ``[clients, max_steps, batch_size]``; ``pos`` indexes into each client's own samples.

    * ``steps``: every client runs exactly ``steps`` batches. Draws cycle through a fresh random
      permutation of the client's data on each pass, so an epoch's samples are all seen before
      any repeats; a client with fewer than ``batch_size`` samples therefore gets batches that
      repeat its samples (each about ``batch_size / n`` times), all with mask 1.
      With ``drop_last`` the steps run in epochs of ``max(1, n // batch_size)`` full batches,
      one fresh permutation per epoch; an epoch's ``n % batch_size`` leftover samples are
      skipped (a DataLoader with ``drop_last=True``, as FedAST's code trains).
    * ``epochs``: client i runs ``epochs * ceil(n_i / batch_size)`` batches, one fresh
      permutation per epoch; the last batch of an epoch is partial (mask 0 on padding) and
      steps beyond a client's count are fully masked.

    Clients with 0 samples get all-zero masks (and ``pos`` 0). Masked entries have ``pos`` 0,
    which is always a valid position, so gathering never goes out of range.
    """
    if (steps is None) == (epochs is None):
        raise ValueError("client_batches: give exactly one of steps= or epochs=")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    sizes = torch.as_tensor(sizes, dtype=torch.int64)
    if sizes.ndim != 1 or (sizes.numel() and int(sizes.min()) < 0):
        raise ValueError("sizes must be a 1-D tensor of non-negative client sizes")
    device, c, b = sizes.device, len(sizes), batch_size
    n = sizes.view(c, 1, 1)
    n1 = n.clamp(min=1)
    if drop_last and steps is None:
        raise ValueError("client_batches: drop_last needs steps=")
    if steps is not None and drop_last:
        if steps < 0:
            raise ValueError(f"steps must be >= 0, got {steps}")
        _check_slots(c, steps, b, device)
        k = (n // b).clamp(min=1)  # full batches per epoch
        s = torch.arange(steps, device=device).view(1, steps, 1)
        pass_ = s // k
        offset = ((s % k) * b + torch.arange(b, device=device).view(1, 1, b)) % n1
        valid = (n > 0).expand(c, steps, b)
        passes = torch.where(sizes > 0, _ceil_div(steps, k.view(c)), 0)
    elif steps is not None:
        if steps < 0:
            raise ValueError(f"steps must be >= 0, got {steps}")
        _check_slots(c, steps, b, device)
        draw = torch.arange(steps * b, device=device).view(1, steps, b)
        pass_, offset = draw // n1, draw % n1
        valid = (n > 0).expand(c, steps, b)
        passes = torch.where(sizes > 0, _ceil_div(steps * b, sizes.clamp(min=1)), 0)
    else:
        if epochs < 0:
            raise ValueError(f"epochs must be >= 0, got {epochs}")
        per_epoch = _ceil_div(sizes, b)
        total_steps = epochs * per_epoch
        max_steps = int(total_steps.max()) if c else 0
        _check_slots(c, max_steps, b, device)
        s = torch.arange(max_steps, device=device).view(1, max_steps, 1)
        k = per_epoch.clamp(min=1).view(c, 1, 1)
        pass_ = s // k
        offset = (s % k) * b + torch.arange(b, device=device).view(1, 1, b)
        valid = (s < total_steps.view(c, 1, 1)) & (offset < n)
        passes = torch.where(sizes > 0, epochs, 0)
    pool, start = permutation_pool(sizes, passes.to(torch.int64), generator)
    flat = torch.where(valid, start.view(c, 1, 1) + pass_ * n + offset, 0)
    if pool.numel() == 0:
        pos = torch.zeros_like(flat)
    else:
        pos = torch.where(valid, pool[flat], 0)
    return pos, valid.to(torch.get_default_dtype())
