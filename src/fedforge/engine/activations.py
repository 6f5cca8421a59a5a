"""The activation memory of one client's training step, measured once per shape.

A vmapped chunk holds every client's activations at once, and their size has little to do
with the input's: a text model's mini-batch is a few kilobytes of token ids, while the
attention maps and hidden states its forward pass keeps for the backward pass are hundreds of
megabytes. So the vmapped engine sizes its chunks from a measurement: the bytes autograd saves
for one client's forward pass on one mini-batch, counted through
``torch.autograd.graph.saved_tensors_hooks`` (distinct storages only, and none that existed
before the step: the model's parameters and buffers, the trainable leaves, the batch).
Under ``vmap`` those activations are stacked per client, while the frozen weights are shared.
"""

from __future__ import annotations

import contextlib
import hashlib

import torch

from fedforge.core.tree import Params
from fedforge.engine.randomness import KeyedRandomness, is_keyed, loss_model, no_key
from fedforge.engine.stages import LossFn


def _storage(t: torch.Tensor) -> tuple[int, int]:
    """``(identity, bytes)`` of the memory ``t`` keeps alive: its storage where it has one."""
    try:
        storage = t.untyped_storage()
        return storage.data_ptr(), storage.nbytes()
    except (RuntimeError, NotImplementedError):  # a tensor without a plain storage
        return id(t), t.numel() * t.element_size()


def _existing(loss_fn: LossFn, tensors: list[torch.Tensor]) -> set[int]:
    """Storages that exist before the step: the loss model's weights and buffers, ``tensors``."""
    model = loss_model(loss_fn)
    if model is not None:
        tensors = [*tensors, *model.parameters(), *model.buffers()]
    return {_storage(t)[0] for t in tensors}


def _never_unpacked(_: None) -> torch.Tensor:
    raise AssertionError("the measured graph is never run backward")


def saved_activation_bytes(loss_fn: LossFn, params: Params, x: torch.Tensor, y: torch.Tensor,
                           w: torch.Tensor) -> int:
    """Bytes autograd saves for the backward pass of ``loss_fn(params, x, y, w)``: one
    client's activations on one mini-batch. Dropout runs keyed (no global random numbers are
    drawn), and the graph is dropped without a backward pass."""
    leaves = {k: v.detach().requires_grad_(True) if v.is_floating_point() else v
              for k, v in params.items()}
    before = _existing(loss_fn, [*leaves.values(), *params.values(), x, y, w])
    saved: dict[int, int] = {}

    kept: list[torch.Tensor] = []  # alive until the pass ends, so no storage is reused

    def pack(t: torch.Tensor) -> None:
        # the graph itself keeps nothing (it is never run backward): its nodes hold the hooks,
        # so a tensor the hooks keep keeps its own node alive, a cycle autograd never frees
        # (it leaked a step's activations per measurement)
        key, nbytes = _storage(t)
        if key not in before:
            saved[key] = nbytes
        kept.append(t)

    keyed = (KeyedRandomness(no_key(x.device), 0, "vmap") if is_keyed(loss_fn)
             else contextlib.nullcontext())
    hooks = torch.autograd.graph.saved_tensors_hooks(pack, _never_unpacked)
    try:
        with torch.enable_grad(), keyed, hooks:
            loss_fn(leaves, x, y, w)
    finally:
        kept.clear()  # break that cycle
    return sum(saved.values())


def activation_key(loss_fn: LossFn, params: Params, x: torch.Tensor, y: torch.Tensor) -> str:
    """What the measurement depends on: the model (its trainable leaves and, for the
    classification loss, every weight and buffer), the mini-batch's shape and dtype, the
    precision and the device type."""
    model = loss_model(loss_fn)
    named = [*params.items(), *(() if model is None else model.state_dict().items())]
    model_sig = ";".join(f"{k}:{tuple(v.shape)}:{v.dtype}" for k, v in named)
    digest = hashlib.sha1(model_sig.encode()).hexdigest()[:16]
    precision = getattr(loss_fn, "precision", "fp32")
    return (f"{digest} x{tuple(x.shape)}:{x.dtype} y{tuple(y.shape)}:{y.dtype} "
            f"{precision} {x.device.type}")


class ActivationSizes:
    """Measured activation bytes per :func:`activation_key`: measured once, checkpointed
    (:meth:`state_dict`), so a resumed run sizes its chunks from the same numbers."""

    def __init__(self) -> None:
        self.bytes: dict[str, int] = {}

    def measure(self, loss_fn: LossFn, params: Params, x: torch.Tensor, y: torch.Tensor,
                w: torch.Tensor) -> int:
        """One client's activation bytes on the batch ``(x, y, w)``: cached, or measured now."""
        key = activation_key(loss_fn, params, x, y)
        if key not in self.bytes:
            self.bytes[key] = saved_activation_bytes(loss_fn, params, x, y, w)
        return self.bytes[key]

    def state_dict(self) -> dict[str, int]:
        return dict(self.bytes)

    def load_state_dict(self, sizes: dict[str, int]) -> None:
        bad = [k for k, v in sizes.items() if not isinstance(v, int) or v < 0]
        if bad:
            raise ValueError(f"checkpoint field 'engine.activation_bytes': {bad[0]!r} is not "
                             "a byte count")
        self.bytes.update(sizes)
