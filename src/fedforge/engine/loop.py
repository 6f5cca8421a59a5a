"""LoopEngine: one client at a time, no vmap. The reference the fast engine is tested against."""

from __future__ import annotations

from collections.abc import Callable

import torch

from fedforge.core.tree import tree_index, tree_map
from fedforge.engine.base import ChunkedEngine, CohortInputs


class LoopEngine(ChunkedEngine):
    name = "loop"

    def chunk_size(self, inputs: CohortInputs, x_all) -> int:
        return 1

    def trim_steps(
        self, idx: torch.Tensor, ws: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Drop the client's trailing padded steps (all weights zero). A padded step leaves
        parameters and state untouched, so skipping it changes nothing but the time: under
        label skew one client's schedule can be several times another's."""
        active = (ws.sum(-1) > 0).any(0).nonzero()  # [n_active, 1] step indices
        keep = int(active[-1]) + 1 if active.numel() else 1
        return idx[:, :keep], ws[:, :keep]

    def wrap(self, fn: Callable) -> Callable:
        def one_client_chunk(global_params, broadcast, states, info, xs, ys, ws):
            # every per-client argument has a leading axis of size 1: drop it, run, restore it
            out = fn(
                global_params, broadcast, tree_index(states, 0), tree_index(info, 0),
                xs[0], ys[0], ws[0],
            )
            return tree_map(lambda t: t.unsqueeze(0), out)

        return one_client_chunk
