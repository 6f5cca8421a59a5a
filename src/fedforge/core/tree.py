"""Pytree helpers for parameter dicts.

Parameters are ``dict[str, Tensor]``; a cohort's parameters are the same dict with a leading
client axis. Optimizer and client states are nested dicts / NamedTuples of tensors, so every
helper here goes through ``torch.utils._pytree`` and works on any of them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch.utils import _pytree as pytree

Params = dict[str, torch.Tensor]
PyTree = Any

tree_map = pytree.tree_map
tree_leaves = pytree.tree_leaves


def tree_map2(fn: Callable, a: PyTree, b: PyTree) -> PyTree:
    """Map ``fn`` over two pytrees of the same structure."""
    leaves_a, spec = pytree.tree_flatten(a)
    leaves_b = pytree.tree_leaves(b)
    if len(leaves_a) != len(leaves_b):
        raise ValueError(f"pytree mismatch: {len(leaves_a)} vs {len(leaves_b)} leaves")
    return pytree.tree_unflatten([fn(x, y) for x, y in zip(leaves_a, leaves_b)], spec)


def tree_add(a: PyTree, b: PyTree, alpha: float = 1.0) -> PyTree:
    return tree_map2(lambda x, y: x + alpha * y, a, b)


def tree_sub(a: PyTree, b: PyTree) -> PyTree:
    return tree_map2(lambda x, y: x - y, a, b)


def tree_scale(a: PyTree, s: float | torch.Tensor) -> PyTree:
    return tree_map(lambda x: x * s, a)


def tree_zeros_like(a: PyTree) -> PyTree:
    return tree_map(torch.zeros_like, a)


def tree_where(cond: torch.Tensor, a: PyTree, b: PyTree) -> PyTree:
    """Select ``a`` where ``cond`` else ``b``; ``cond`` is a 0-d bool (batched under vmap)."""
    return tree_map2(lambda x, y: torch.where(cond, x, y), a, b)


def upcast(x: torch.Tensor) -> torch.Tensor:
    """Half-precision tensors to float32; float32 and float64 stay as they are."""
    return x.float() if x.dtype in (torch.float16, torch.bfloat16) else x


def tree_sq_norm(a: PyTree) -> torch.Tensor:
    """Squared global L2 norm of all leaves (a 0-d tensor; at least float32)."""
    return sum((upcast(x) ** 2).sum() for x in tree_leaves(a))


def tree_dot(a: PyTree, b: PyTree) -> torch.Tensor:
    return sum((x * y).sum() for x, y in zip(tree_leaves(a), tree_leaves(b)))


def tree_stack(trees: Sequence[PyTree]) -> PyTree:
    """Stack a list of same-structure pytrees along a new leading axis."""
    flats = [pytree.tree_flatten(t) for t in trees]
    spec = flats[0][1]
    leaves = [torch.stack(group) for group in zip(*(f[0] for f in flats))]
    return pytree.tree_unflatten(leaves, spec)


def tree_index(tree: PyTree, index: int | torch.Tensor | slice) -> PyTree:
    """Take ``leaf[index]`` of every leaf (a client or a chunk of a stacked cohort)."""
    return tree_map(lambda x: x[index], tree)


def tree_clone(tree: PyTree) -> PyTree:
    return tree_map(lambda x: x.detach().clone(), tree)


def tree_to(tree: PyTree, device: torch.device | str) -> PyTree:
    return tree_map(lambda x: x.to(device) if isinstance(x, torch.Tensor) else x, tree)


def tree_num_elements(tree: PyTree) -> int:
    return sum(x.numel() for x in tree_leaves(tree))


def tree_nbytes(tree: PyTree) -> int:
    return sum(x.numel() * x.element_size() for x in tree_leaves(tree))


def flatten_dict(tree: dict, prefix: str = "") -> dict[str, torch.Tensor]:
    """Nested dict of tensors -> flat ``{"a/b/c": tensor}`` (for safetensors)."""
    out: dict[str, torch.Tensor] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flatten_dict(value, name + "/"))
        else:
            out[name] = value
    return out


def unflatten_dict(flat: dict[str, torch.Tensor]) -> dict:
    """Inverse of :func:`flatten_dict`."""
    out: dict = {}
    for name, value in flat.items():
        node = out
        *parents, leaf = name.split("/")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return out


def restore_flat(template: dict[str, torch.Tensor], got: Mapping[str, torch.Tensor],
                 what: str) -> dict[str, torch.Tensor]:
    """``got`` in ``template``'s key order, dtype and device; one-line error on a mismatch."""
    missing = [k for k in template if k not in got]
    extra = [k for k in got if k not in template]
    if missing or extra:
        raise ValueError(f"checkpoint {what} state does not match this run's algorithm: "
                         f"missing {missing[:5]}, unexpected {extra[:5]}")
    out = {}
    for key, ref in template.items():
        value = got[key]
        if tuple(value.shape) != tuple(ref.shape):
            raise ValueError(f"checkpoint {what} tensor {key!r}: shape {tuple(value.shape)}, "
                             f"this run expects {tuple(ref.shape)}")
        out[key] = value.to(device=ref.device, dtype=ref.dtype)
    return out


def restore_like(template: dict, loaded: Mapping, what: str) -> dict:
    """A loaded tensor tree in ``template``'s structure, key order, dtype and device.

    Checkpoints come back in the file's (alphabetical) key order; the flatten order of a
    state decides codec and noise order downstream, so it is rebuilt from a fresh template.
    """
    flat = restore_flat(flatten_dict(template), flatten_dict(dict(loaded)), what)

    def build(node, prefix: str):
        if isinstance(node, dict):
            return {k: build(v, f"{prefix}{k}/") for k, v in node.items()}
        return flat[prefix[:-1]]

    return build(template, "")
