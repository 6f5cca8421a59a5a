"""Max-pooling over tiling windows as elementwise maxima of strided views.

When the windows tile the input (kernel == stride, no padding or dilation), each output is
the maximum of ``kh * kw`` strided views of the input, one per position in the window. On
the 2-core CPU we measured, torch's ``max_pool2d`` forward took 5-15 times as long as those
maxima, and was a quarter of a LeNet-5 or CNN training step (``benchmarks/history/``).
The backward stays torch's own kernel: it needs the index of each window's maximum, which
is computed from the views only when a gradient is asked for.

:func:`max_pool2d_tiled` equals ``F.max_pool2d`` bit for bit, gradients included: the index
is the first maximum of the window in scan order (row by row), as torch's, so ties send the
gradient to the same element. (A window holding a NaN pools to NaN in both; its gradient may
land on another of its elements, in a step that is already NaN.) Other configurations
(overlapping or padded windows, ``ceil_mode``, indices asked for, channels-last inputs) go to
``F.max_pool2d``.
:func:`route_max_pooling` routes a model's ``nn.MaxPool2d`` layers here (the classification
loss does, for its model). It works under ``torch.func`` transforms (``grad``, ``vmap``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

POOL_FUNCS = {F.max_pool2d, torch.max_pool2d}  # what a mode routes (batched convolutions)


def as_pair(v) -> tuple[int, int]:
    """A 2-D size argument of torch's conv/pool functions (an int or two) as two ints."""
    return (int(v), int(v)) if isinstance(v, int) else (int(v[0]), int(v[1]))


def _views(x: torch.Tensor, kh: int, kw: int) -> list[torch.Tensor]:
    """One strided view per window position, in scan order (row by row)."""
    return [x[..., pos // kw::kh, pos % kw::kw] for pos in range(kh * kw)]


def first_max_index(x: torch.Tensor, out: torch.Tensor, kh: int, kw: int) -> torch.Tensor:
    """Flat index (``row * W + col`` in the input plane) of each window's first maximum:
    what ``F.max_pool2d(..., return_indices=True)`` returns."""
    width = x.shape[-1]
    oh, ow = out.shape[-2:]
    corner = (torch.arange(oh, device=x.device).view(-1, 1) * (kh * width)
              + torch.arange(ow, device=x.device) * kw).to(torch.int32)  # window's top left
    views = _views(x, kh, kw)
    if (kh, kw) == (2, 2):  # the common case in boolean algebra, then few int32 passes
        not0, not1 = views[0] != out, views[1] != out
        row = not0 & not1  # the maximum is in the window's second row
        col = not0 & (~not1 | (views[2] != out))  # ... in its second column
        return (row.to(torch.int32) * width + col + corner).long()
    offsets = [(pos // kw) * width + pos % kw for pos in range(kh * kw)]
    offset = torch.full_like(out, offsets[-1], dtype=torch.int64)
    for view, off in zip(views[-2::-1], offsets[-2::-1], strict=True):  # last to first
        offset = off + (view != out) * (offset - off)  # an earlier maximum wins
    return offset + corner


class _TiledMaxPool(torch.autograd.Function):
    generate_vmap_rule = True  # slices, elementwise ops and torch's backward kernel

    @staticmethod
    def forward(x: torch.Tensor, kh: int, kw: int) -> torch.Tensor:
        views = _views(x, kh, kw)
        out = views[0]
        for view in views[1:]:
            out = torch.maximum(out, view)
        return out

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, kh, kw = inputs
        ctx.save_for_backward(x, output)
        ctx.kh, ctx.kw = kh, kw

    @staticmethod
    def backward(ctx, grad):
        x, out = ctx.saved_tensors
        k = [ctx.kh, ctx.kw]
        index = first_max_index(x, out, *k)
        grad_x = torch.ops.aten.max_pool2d_with_indices_backward(
            grad, x, k, k, [0, 0], [1, 1], False, index)
        return grad_x, None, None


def max_pool2d_tiled(x: torch.Tensor, kernel_size, stride=None, padding=0, dilation=1,
                     ceil_mode: bool = False, return_indices: bool = False) -> torch.Tensor:
    """``F.max_pool2d``, computed as maxima of strided views when the windows tile the input
    (kernel == stride, no padding or dilation, no indices); otherwise ``F.max_pool2d``."""
    k = as_pair(kernel_size)
    s = as_pair(stride) if stride not in (None, [], ()) else k
    if (k != s or as_pair(padding) != (0, 0) or as_pair(dilation) != (1, 1) or ceil_mode
            or return_indices or x.dim() not in (3, 4) or not x.is_floating_point()
            or _channels_last(x)):
        return F.max_pool2d(x, kernel_size, stride, padding, dilation, ceil_mode=ceil_mode,
                            return_indices=return_indices)
    *_, h, w = x.shape
    oh, ow = h // k[0], w // k[1]
    full = x[..., : oh * k[0], : ow * k[1]]  # rows and columns no window covers drop out
    return _TiledMaxPool.apply(full, *k)


def _channels_last(x: torch.Tensor) -> bool:
    """An NHWC batch: torch's pooling kernel for it is vectorised over channels and was
    faster than strided maxima (1.8x in a bf16 CNN step, one thread)."""
    if x.dim() != 4 or x.shape[1] <= 1 or x.is_contiguous():
        return False
    try:
        return x.is_contiguous(memory_format=torch.channels_last)
    except RuntimeError:  # a client's slice under vmap cannot be asked; strided maxima suit it
        return False


class TiledMaxPool2d(nn.MaxPool2d):
    """``nn.MaxPool2d`` pooling by :func:`max_pool2d_tiled`: the same values and gradients.
    A compiled function keeps torch's pooling, which inductor brings its own kernels for."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.compiler.is_compiling():
            return super().forward(x)
        return max_pool2d_tiled(x, self.kernel_size, self.stride, self.padding, self.dilation,
                                ceil_mode=self.ceil_mode, return_indices=self.return_indices)


def route_max_pooling(model: nn.Module) -> bool:
    """Make ``model``'s ``nn.MaxPool2d`` layers :class:`TiledMaxPool2d` (their class only;
    nothing else changes, and every result stays torch's bit for bit); whether it has any.
    A layer's own class, not a mode around the forward pass: a mode costs every operator
    of the model a Python call."""
    pools = [m for m in model.modules() if type(m) is nn.MaxPool2d]
    for m in pools:
        m.__class__ = TiledMaxPool2d
    return bool(pools) or any(isinstance(m, TiledMaxPool2d) for m in model.modules())
