"""LoopEngine: one client at a time, no vmap. The reference the fast engine is tested against."""

from __future__ import annotations

from collections.abc import Callable

from fedforge.core.tree import tree_index, tree_map
from fedforge.engine.base import ChunkedEngine, CohortInputs


class LoopEngine(ChunkedEngine):
    name = "loop"

    def chunk_size(self, inputs: CohortInputs, x_all) -> int:
        return 1

    def wrap(self, fn: Callable) -> Callable:
        def one_client_chunk(global_params, broadcast, states, info, xs, ys, ws):
            # every per-client argument has a leading axis of size 1: drop it, run, restore it
            out = fn(
                global_params, broadcast, tree_index(states, 0), tree_index(info, 0),
                xs[0], ys[0], ws[0],
            )
            return tree_map(lambda t: t.unsqueeze(0), out)

        return one_client_chunk
