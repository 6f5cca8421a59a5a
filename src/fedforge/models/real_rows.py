"""Linear layers multiply a batch's real tokens only, not its padding.

A batch of B sequences padded to T tokens costs every linear layer B*T rows, though a
sequence's trailing padding never reaches anything that is read: padding keys are masked
out of attention, and no head or scored position reads a trailing padding row. A linear
layer is row-wise, so while a batch's real rows are set (:func:`real_rows`), each linear
layer whose input is ``[B, T, in]`` multiplies only the real rows ``[N, in]`` and writes
them back into zeros ``[B, T, out]``. The real tokens' numbers are those of the padded
batch; on random sequences of 2-64 tokens (half padding) the base's matmuls halve.

Only each sequence's *trailing* padding is dropped: a padding id inside a sequence (an
end-of-text token that doubles as padding) stays a real row, as its position may be scored.
Under ``vmap`` (shapes must not depend on the data) and ``torch.compile`` nothing changes,
and neither does a batch with under :data:`MIN_PADDING` of its rows padding, where the
gathers would cost more than they save.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from torch import nn
from torch._C._functorch import TransformType
from torch._functorch.pyfunctorch import retrieve_all_functorch_interpreters

MIN_PADDING = 0.1  # the share of padding rows from which dropping them pays (see speed.md)


@dataclass
class Rows:
    """The real rows of a ``[B, T]`` batch: their flat indices into its ``B*T`` rows."""

    shape: torch.Size
    index: torch.Tensor
    gathered: set[int] = field(default_factory=set)  # linears whose input was gathered

    def matches(self, x: torch.Tensor) -> bool:
        """Whether ``x`` is one row per token of this batch (``[B, T, features]``)."""
        return x.dim() == len(self.shape) + 1 and x.shape[:-1] == self.shape

    def gather(self, x: torch.Tensor) -> torch.Tensor:
        """``[B, T, f]`` -> the real rows ``[N, f]``."""
        return x.reshape(-1, x.shape[-1]).index_select(0, self.index)

    def scatter(self, y: torch.Tensor) -> torch.Tensor:
        """The real rows' outputs ``[N, f]`` -> ``[B, T, f]``, zero at padding."""
        full = y.new_zeros(self.shape.numel(), y.shape[-1]).index_copy(0, self.index, y)
        return full.view(*self.shape, y.shape[-1])


_ROWS: contextvars.ContextVar[Rows | None] = contextvars.ContextVar("real_rows", default=None)


def _shapes_may_depend_on_data() -> bool:
    return torch.compiler.is_compiling() or any(
        i.key() == TransformType.Vmap for i in retrieve_all_functorch_interpreters())


def lengths(tokens: torch.Tensor, pad_id: int) -> torch.Tensor:
    """``[B]``: each sequence's length up to its last non-padding token, at least 1 (an
    all-padding row counts its first position)."""
    positions = torch.arange(1, tokens.shape[-1] + 1, device=tokens.device)
    return (positions * (tokens != pad_id)).amax(-1).clamp_min(1)


def trailing_padding(tokens: torch.Tensor, pad_id: int) -> torch.Tensor:
    """``[B, T]`` bool: positions after a sequence's last non-padding token."""
    positions = torch.arange(tokens.shape[-1], device=tokens.device)
    return positions >= lengths(tokens, pad_id)[..., None]


@contextmanager
def real_rows(tokens: torch.Tensor, pad_id: int) -> Iterator[None]:
    """Within: linear layers of the model (see :func:`skip_padding`) see only the real rows
    of ``tokens`` [B, T]."""
    if tokens.dim() != 2 or _shapes_may_depend_on_data():
        yield
        return
    keep = ~trailing_padding(tokens, pad_id)
    if float(keep.sum()) > (1 - MIN_PADDING) * keep.numel():
        yield
        return
    token = _ROWS.set(Rows(tokens.shape, keep.flatten().nonzero().squeeze(1)))
    try:
        yield
    finally:
        _ROWS.reset(token)


def on_real_rows(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """``fn(x)`` for a row-wise ``fn``, computed on the real rows only where they are set."""
    rows = _ROWS.get()
    if rows is None or not rows.matches(x):
        return fn(x)
    return rows.scatter(fn(rows.gather(x)))


def _gather_input(module: nn.Module, args: tuple) -> tuple | None:
    rows = _ROWS.get()
    if rows is None or not args or not rows.matches(args[0]):
        return None
    rows.gathered.add(id(module))
    return (rows.gather(args[0]), *args[1:])


def _scatter_output(module: nn.Module, _args: tuple, out: torch.Tensor) -> torch.Tensor | None:
    rows = _ROWS.get()
    if rows is None or id(module) not in rows.gathered:
        return None
    rows.gathered.discard(id(module))
    return rows.scatter(out)


def skip_padding(model: nn.Module) -> None:
    """Make every ``nn.Linear`` of ``model`` multiply only the real rows while
    :func:`real_rows` is set (hooks that do nothing otherwise)."""
    for module in model.modules():
        if type(module) is nn.Linear:
            module.register_forward_pre_hook(_gather_input)
            module.register_forward_hook(_scatter_output)
