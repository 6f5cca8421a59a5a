"""Frozen weights cast to bf16 once per local round instead of at every step.

Under ``engine.precision = "bf16"`` the forward runs in bf16 autocast, which casts a linear
layer's float32 weight to bf16 at every call; it caches the cast only for leaves that
require grad, so a frozen weight (the pretrained base under LoRA adapters) is cast again at
every step. Here such weights are cast once when a client's round starts and the forward
sees the bf16 copies: autocast then finds them already in bf16 and casts nothing. The copies
are what autocast's cast gives (the same ``to(bfloat16)``), so every number stays the same
bits; the float32 tensors remain the model's.

Only the operands of ops that autocast runs in bf16 are cast: the weight and bias of
``nn.Linear``, ``nn.Conv1d`` and ``nn.Conv2d`` (exactly these classes: a subclass may use
its weight otherwise) and of any module class that lists them in ``AUTOCAST_BF16`` (the
LoRA layer's frozen base, :class:`fedforge.models.lora.LoraLinear`). A LayerNorm or an
embedding runs in float32 or in its weight's dtype under autocast, so a bf16 copy would
change its result: those stay as they are, and so does a tensor that such a layer shares
(a language model's output layer tied to its embedding).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import NamedTuple

import torch
from torch import nn

from fedforge.engine.rounding import BF16_PRECISIONS

_BF16_OPERANDS: dict[type, tuple[str, ...]] = {
    nn.Linear: ("weight", "bias"), nn.Conv1d: ("weight", "bias"),
    nn.Conv2d: ("weight", "bias")}


class Target(NamedTuple):
    """A frozen float32 parameter the forward may see in bf16: ``module.<name>``."""

    module: nn.Module
    name: str


def _bf16_operands(module: nn.Module) -> tuple[str, ...]:
    kind = type(module)
    return _BF16_OPERANDS.get(kind, getattr(kind, "AUTOCAST_BF16", ()))


def frozen_targets(model: nn.Module) -> list[Target]:
    """The frozen float32 parameters of ``model.modules()`` that only ops autocast runs in
    bf16 read. ``model.modules()``, not the module tree: a model may hold its frozen base
    outside its parameters and list the base's modules there (model ``pretrained``)."""
    users: dict[int, list[Target]] = {}
    tensors: dict[int, torch.Tensor] = {}
    for module in model.modules():
        for name, p in module._parameters.items():
            if p is not None:
                users.setdefault(id(p), []).append(Target(module, name))
                tensors[id(p)] = p
    return [t for key, uses in users.items()
            if tensors[key].dtype == torch.float32 and not tensors[key].requires_grad
            and all(u.name in _bf16_operands(u.module) for u in uses)
            for t in uses]


def loss_targets(loss_fn: Callable) -> list[Target]:
    """:func:`frozen_targets` of a bf16 loss's model (the classification loss's); none for
    another precision or another loss."""
    model = getattr(loss_fn, "model", None)
    bf16 = getattr(loss_fn, "precision", None) in BF16_PRECISIONS
    if not bf16 or not isinstance(model, nn.Module):
        return []
    return frozen_targets(model)


def cast(targets: list[Target]) -> list[tuple[Target, torch.Tensor]]:
    """Each target with its bf16 copy (one copy per tensor, however many modules share it)."""
    copies: dict[int, torch.Tensor] = {}
    out = []
    for t in targets:
        p = t.module._parameters[t.name]
        if id(p) not in copies:
            copies[id(p)] = p.detach().to(torch.bfloat16)
        out.append((t, copies[id(p)]))
    return out


@contextmanager
def swapped(casts: list[tuple[Target, torch.Tensor]]) -> Iterator[None]:
    """Inside: each target module holds its bf16 copy in place of the float32 parameter
    (as ``functional_call`` swaps parameters); the float32 ones are back on leaving."""
    kept = [(t, t.module._parameters[t.name]) for t, _ in casts]
    try:
        for t, copy in casts:
            t.module._parameters[t.name] = copy
        yield
    finally:
        for t, p in kept:
            t.module._parameters[t.name] = p
