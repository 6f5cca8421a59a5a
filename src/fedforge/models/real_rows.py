"""A pretrained model computes on a batch's real tokens only, not on its padding.

A batch of B sequences padded to T tokens costs every layer B*T rows, though a sequence's
trailing padding never reaches anything that is read: padding keys are masked out of
attention, and no head or scored position reads a trailing padding row. While a batch's
real rows are set (:func:`real_rows`):

* **The layer stack runs packed** (:func:`pack_layers`): the hidden states enter the first
  transformer layer as one row of the N real tokens ``[1, N, d]`` and leave the last one
  padded again ``[B, T, d]``. Everything row-wise in between (the linear layers and their
  LoRA factors, LayerNorm, activations, residual adds, dropout) runs on N rows; only the
  attention core scatters its queries, keys and values back to ``[B, heads, T, head_dim]``
  and runs the model's own attention with the padded mask, so no token attends across
  sequences. Rotary position tables are packed alike, so each token keeps its position.
* **Linear layers outside the stack** (a head, a causal LM's output layer;
  :func:`skip_padding`) multiply only the real rows ``[N, in]`` of a ``[B, T, in]`` input
  and write them back into zeros ``[B, T, out]``.
* **Dropout** on packed rows draws the mask bits of the padded layout
  (:func:`padded_elements`), so a run gives the same numbers packed or padded, in every
  engine.

The real tokens' numbers are those of the padded batch.

Only each sequence's *trailing* padding is dropped: a padding id inside a sequence (an
end-of-text token that doubles as padding) stays a real row, as its position may be scored.
Under ``vmap`` (shapes must not depend on the data) and ``torch.compile`` nothing changes,
and neither does a batch with under :data:`MIN_PADDING` of its rows padding, where the
gathers would cost more than they save. A stack whose weights are stacked per client (a
cohort's adapters in one computation, :mod:`.lora`) needs its clients' row blocks whole, so
it is not packed; its linear layers still skip the padding rows where their weight is one.
"""

from __future__ import annotations

import contextvars
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch._C._functorch import TransformType
from torch._functorch.pyfunctorch import retrieve_all_functorch_interpreters

from fedforge.errors import ConfigError

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
        return self.pack(x)[0]

    def scatter(self, y: torch.Tensor) -> torch.Tensor:
        """The real rows' outputs ``[N, f]`` -> ``[B, T, f]``, zero at padding."""
        return self.unpack(y[None])

    def is_packed(self, shape: torch.Size | tuple[int, ...]) -> bool:
        """Whether ``shape`` is the packed layout ``[1, N, ...]`` of this batch's real rows."""
        return len(shape) >= 3 and shape[0] == 1 and shape[1] == self.index.numel()

    def pack(self, x: torch.Tensor) -> torch.Tensor:
        """``[B, T, *f]`` (or ``[1, T, *f]``, the same for every sequence) -> ``[1, N, *f]``."""
        x = x.expand(*self.shape, *x.shape[2:])
        return x.reshape(self.shape.numel(), -1).index_select(0, self.index).view(
            1, -1, *x.shape[2:])

    def unpack(self, y: torch.Tensor) -> torch.Tensor:
        """``[1, N, *f]`` -> ``[B, T, *f]``, zero at padding."""
        full = y.new_zeros(self.shape.numel(), y[0, 0].numel())
        full = full.index_copy(0, self.index, y.reshape(self.index.numel(), -1))
        return full.view(*self.shape, *y.shape[2:])


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


def padded_elements(shape: torch.Size | tuple[int, ...]) -> tuple[torch.Tensor, int] | None:
    """For a packed tensor ``[1, N, f]``: each element's flat index in the padded layout
    ``[B, T, f]`` and that layout's size, so that a dropout mask keyed by element index is
    the padded batch's; None for any other tensor."""
    rows = _ROWS.get()
    if rows is None or len(shape) != 3 or not rows.is_packed(shape):
        return None
    f = int(shape[-1])
    index = rows.index[:, None] * f + torch.arange(f, device=rows.index.device)
    return index.view(1, -1, f), rows.shape.numel() * f


ATTENTION = "fedforge_real_rows"  # the attention implementation a packed stack runs


def pack_layers(model: nn.Module) -> bool:
    """Run ``model``'s transformer layers on the real rows while :func:`real_rows` is set
    (hooks and an attention implementation that do nothing otherwise); False for a model
    without a recognisable layer stack, which then only skips padding in its linears."""
    try:
        from transformers import AttentionInterface  # noqa: PLC0415 (optional extra)
        from transformers.masking_utils import AttentionMaskInterface  # noqa: PLC0415
        from transformers.modeling_layers import GradientCheckpointingLayer  # noqa: PLC0415
    except ImportError:  # a model built without transformers has no stack to pack
        raise ConfigError("model: a packed layer stack needs the extra: "
                          "pip install 'fedforge[pretrained]'") from None

    stack = next((m for m in model.modules() if isinstance(m, nn.ModuleList) and len(m)
                  and all(isinstance(c, GradientCheckpointingLayer) for c in m)), None)
    config = getattr(model, "config", None)
    if stack is None or config is None or config._attn_implementation not in ("eager", "sdpa"):
        return False
    name = f"{ATTENTION}_{config._attn_implementation}"
    AttentionInterface.register(name, _packed_attention)
    masks = AttentionMaskInterface._global_mapping  # a 2-D mask is built as the model's own
    AttentionMaskInterface.register(name, masks[config._attn_implementation])
    config._attn_implementation = name
    state = _Stack(stack)
    stack[0].register_forward_pre_hook(state.enter, with_kwargs=True)
    stack[-1].register_forward_hook(state.leave)
    for module in model.modules():
        if type(module).__name__.endswith("RotaryEmbedding"):
            module.register_forward_hook(state.positions)
    return True


class _Stack:
    """The hooks of one layer stack: pack at its entry, unpack at its exit."""

    def __init__(self, stack: nn.ModuleList) -> None:
        self.stack = stack

    def _rows(self) -> Rows | None:
        rows = _ROWS.get()
        if rows is None or any(p.dim() == 3 for p in self.stack.parameters()):
            return None  # weights stacked per client need whole client blocks
        return rows

    def enter(self, _module: nn.Module, args: tuple, kwargs: dict) -> tuple | None:
        rows = self._rows()
        if rows is None or not args or not rows.matches(args[0]):
            return None
        return (rows.pack(args[0]), *args[1:]), kwargs

    def leave(self, _module: nn.Module, _args: tuple, out: Any) -> Any:
        rows = _ROWS.get()
        first = out[0] if isinstance(out, tuple) else out
        if rows is None or not torch.is_tensor(first) or not rows.is_packed(first.shape):
            return None
        return (rows.unpack(first), *out[1:]) if isinstance(out, tuple) else rows.unpack(out)

    def positions(self, _module: nn.Module, _args: tuple, out: Any) -> Any:
        """A rotary table ``(cos, sin)`` ``[B|1, T, head_dim]``, packed like the tokens."""
        rows = self._rows()
        if rows is None or not isinstance(out, tuple) or \
                not all(t.dim() == 3 and t.shape[1] == rows.shape[1] for t in out):
            return None
        return tuple(rows.pack(t) for t in out)


def _packed_attention(module: nn.Module, query: torch.Tensor, key: torch.Tensor,
                      value: torch.Tensor, attention_mask: torch.Tensor | None,
                      **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The model's own attention (eager or SDPA) on the padded layout: packed ``[1, heads,
    N, head_dim]`` queries, keys and values are scattered to ``[B, heads, T, head_dim]``,
    and the output ``[B, T, heads, head_dim]`` is packed again."""
    try:
        from transformers import AttentionInterface  # noqa: PLC0415 (optional extra)
    except ImportError:
        raise ConfigError("model: packed attention needs the extra: "
                          "pip install 'fedforge[pretrained]'") from None

    implementation = module.config._attn_implementation.removeprefix(f"{ATTENTION}_")
    attend = (sys.modules[type(module).__module__].eager_attention_forward
              if implementation == "eager" else AttentionInterface()[implementation])
    rows = _ROWS.get()
    if rows is None or not rows.is_packed(query.transpose(1, 2).shape):
        return attend(module, query, key, value, attention_mask, **kwargs)
    q, k, v = (rows.unpack(t.transpose(1, 2)).transpose(1, 2) for t in (query, key, value))
    out, weights = attend(module, q, k, v, attention_mask, **kwargs)
    return rows.pack(out), weights
