"""LoopEngine: one client at a time, no vmap. The reference the fast engine is tested against.

``channels_last=True`` runs each client's image batches and 4-D tensors (convolution weights
and what is shaped like them) in ``torch.channels_last`` (NHWC) memory format: on a CPU this
can spare oneDNN's layout reorders around each convolution and use the vectorised NHWC
pooling; whether it wins depends on the machine and model, so ``auto`` times it.
Only the layout changes, not the values; the outputs are returned contiguous, so aggregation,
client state and checkpoints are as without it. Float results differ only by kernel rounding.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from fedforge.core.tree import tree_index, tree_map
from fedforge.engine.base import ChunkedEngine, CohortInputs


def _to_channels_last(tree):
    """Every 4-D tensor of a tree in channels-last memory format; other leaves as they are.
    ``to`` rather than ``contiguous``: a one-channel weight ``[C_out, 1, kh, kw]`` is already
    "contiguous" in both formats, and only ``to`` gives it the strides that make convolution
    pick NHWC for its output."""
    return tree_map(lambda t: t.to(memory_format=torch.channels_last)
                    if isinstance(t, torch.Tensor) and t.dim() == 4 else t, tree)


def _steps_channels_last(xs: torch.Tensor) -> torch.Tensor:
    """``[steps, batch, C, H, W]`` stored as ``[steps, batch, H, W, C]``, so that each step's
    ``xs[k]`` is a channels-last ``[batch, C, H, W]``; non-image inputs are left alone."""
    if xs.dim() != 5:
        return xs
    _, b, c, h, w = xs.shape
    # explicit strides: with one channel, ``contiguous`` would keep the NCHW ones (both
    # formats are "contiguous" then), and convolution would pick NCHW for its output
    out = torch.empty_strided(xs.shape, (b * h * w * c, h * w * c, 1, w * c, c),
                              dtype=xs.dtype, device=xs.device)
    return out.copy_(xs)


def loop_label(channels_last: bool) -> str:
    """How reports and ``auto``'s timings name the loop in either layout."""
    return "loop channels_last" if channels_last else "loop"


class LoopEngine(ChunkedEngine):
    name = "loop"
    functional_grad = False  # one client outside any transform: plain autograd is cheaper

    def __init__(self, keep_deltas: bool = False, *, channels_last: bool = False,
                 in_place: bool = True) -> None:
        super().__init__(keep_deltas=keep_deltas)
        self.channels_last = channels_last
        # update each client's parameters in place where nothing keeps a step's (the same
        # numbers, bit for bit; ``False`` is the out-of-place reference the tests compare)
        self.in_place = in_place

    def chunk_size(self, inputs: CohortInputs, x_all, y_all=None, loss_fn=None) -> int:
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
            state, x = tree_index(states, 0), xs[0]
            if self.channels_last:
                global_params, broadcast, state = _to_channels_last(
                    (global_params, broadcast, state))
                x = _steps_channels_last(x)
            out = fn(global_params, broadcast, state, tree_index(info, 0), x, ys[0], ws[0])
            if self.channels_last:  # back to the ordinary layout for everything downstream
                out = tree_map(torch.Tensor.contiguous, out)
            return tree_map(lambda t: t.unsqueeze(0), out)

        return one_client_chunk
