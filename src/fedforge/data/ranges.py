"""Each client's samples as one index range: a permutation of the samples, sorted by client,
plus offsets (CSR), instead of a padded ``[clients, max_size]`` table.

Memory is ``8 * (num_samples + num_clients + 1)`` bytes whatever the spread of client sizes,
and a cohort's minibatch indices are one gather of ``order[offsets[client] + pos]``, so a
round costs O(cohort) however many clients there are.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor


@dataclass(frozen=True, eq=False)
class ClientRanges(Sequence):
    """Client ``i`` owns samples ``order[offsets[i]:offsets[i + 1]]``; it is also a read-only
    sequence of those index tensors, so it stands in for a list of per-client indices."""

    offsets: Tensor  # int64 [num_clients + 1], offsets[0] = 0, non-decreasing
    order: Tensor  # int64 [num_samples]: sample ids, client by client

    @classmethod
    def from_lists(cls, parts: Sequence[Tensor | np.ndarray],
                   device: torch.device | str | None = None) -> ClientRanges:
        """Ranges holding ``parts[i]`` (in its order) as client ``i``'s samples."""
        if isinstance(parts, ClientRanges):
            return parts if device is None else parts.to(device)
        sizes = torch.tensor([len(p) for p in parts], dtype=torch.int64)
        offsets = torch.zeros(len(parts) + 1, dtype=torch.int64)
        torch.cumsum(sizes, 0, out=offsets[1:])
        tensors = [torch.as_tensor(p).to(torch.int64).reshape(-1).cpu() for p in parts]
        order = torch.cat(tensors) if tensors else torch.zeros(0, dtype=torch.int64)
        out = cls(offsets, order)
        return out if device is None else out.to(device)

    @classmethod
    def from_owners(cls, owner: np.ndarray | Tensor, num_clients: int) -> ClientRanges:
        """Ranges from each sample's client id (a stable sort: samples keep their order)."""
        owner = torch.as_tensor(owner).to(torch.int64).reshape(-1)
        if owner.numel() and (int(owner.min()) < 0 or int(owner.max()) >= num_clients):
            raise ValueError(f"client ids must lie in [0, {num_clients})")
        order = torch.sort(owner, stable=True).indices
        counts = torch.bincount(owner, minlength=num_clients)
        offsets = torch.zeros(num_clients + 1, dtype=torch.int64, device=owner.device)
        torch.cumsum(counts, 0, out=offsets[1:])
        return cls(offsets, order)

    def __len__(self) -> int:
        return self.offsets.numel() - 1

    def __getitem__(self, i):  # type: ignore[override]
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        n = len(self)
        i = int(i)
        if not -n <= i < n:
            raise IndexError(f"client {i} out of range for {n} clients")
        i %= n
        return self.order[int(self.offsets[i]):int(self.offsets[i + 1])]

    def __iter__(self) -> Iterator[Tensor]:
        bounds = self.offsets.tolist()
        for a, b in zip(bounds[:-1], bounds[1:], strict=True):
            yield self.order[a:b]

    @property
    def device(self) -> torch.device:
        return self.offsets.device

    def sizes(self) -> Tensor:
        """int64 ``[num_clients]``: samples per client."""
        return self.offsets[1:] - self.offsets[:-1]

    def owners(self) -> Tensor:
        """int64 ``[num_samples]``: the client of each entry of ``order``."""
        return torch.repeat_interleave(torch.arange(len(self), device=self.device), self.sizes())

    def nbytes(self) -> int:
        return self.offsets.numel() * 8 + self.order.numel() * 8

    def to(self, device: torch.device | str) -> ClientRanges:
        return ClientRanges(self.offsets.to(device), self.order.to(device))

    def gather(self, clients: Tensor, pos: Tensor) -> Tensor:
        """Global sample ids of local positions ``pos`` ``[C, ...]`` of clients ``clients``
        ``[C]``; an empty client's entries are 0 (a valid sample id, masked by the caller),
        as in the padded table."""
        clients = clients.to(self.device, torch.int64)
        shape = (-1, *([1] * (pos.dim() - 1)))
        start = self.offsets[clients].view(shape)
        size = (self.offsets[clients + 1] - self.offsets[clients]).view(shape)
        if self.order.numel() == 0:
            return torch.zeros(pos.shape, dtype=torch.int64, device=self.device)
        flat = (start + pos.to(self.device)).clamp_(max=self.order.numel() - 1)
        return torch.where(size > 0, self.order[flat], 0)

    def table(self) -> Tensor:
        """The padded ``[num_clients, max(1, max_size)]`` table (pad = 0) of the same ids."""
        sizes = self.sizes()
        width = max(int(sizes.max()) if len(sizes) else 0, 1)
        out = torch.zeros(len(self), width, dtype=torch.int64, device=self.device)
        if self.order.numel():
            owner = self.owners()
            col = torch.arange(self.order.numel(), device=self.device) - self.offsets[owner]
            out[owner, col] = self.order
        return out
