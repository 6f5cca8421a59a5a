"""Which parameters form a model's head and which its body, by parameter name.

A split is a list of patterns over ``named_parameters`` names: shell-style (``"fc2.*"``,
:mod:`fnmatch`) or, with a ``re:`` prefix, a regular expression matched against the whole
name (``"re:classifier\\.[24]\\..*"``). Without patterns the head is the model's last layer:
the parameters sharing the module path of the last parameter (``fc.weight``, ``fc.bias``).
The zoo models declare their head the same way (``fedforge.models.head_patterns``; the MLP
takes its last layer); a config overrides it with ``[model] head``.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable, Sequence

import torch

from fedforge.client.transforms import Transform
from fedforge.core.tree import Params

PARTS = ("none", "head", "body", "all")
"""What a method may name: no parameter, the head, the body (everything but the head), all."""


def _matches(pattern: str, name: str) -> bool:
    if pattern.startswith("re:"):
        return re.fullmatch(pattern[3:], name) is not None
    return fnmatch.fnmatchcase(name, pattern)


def last_layer(names: Sequence[str]) -> tuple[str, ...]:
    """The parameters of the last layer: those sharing the last parameter's module path."""
    if not names:
        return ()
    module = names[-1].rpartition(".")[0]
    return tuple(n for n in names if n.rpartition(".")[0] == module)


def head_names(names: Sequence[str], patterns: Sequence[str] | None,
               field: str = "model.head") -> tuple[str, ...]:
    """The head's parameter names (in model order); a pattern matching nothing is an error."""
    names = list(names)
    if patterns is None:
        return last_layer(names)
    for p in patterns:
        if not any(_matches(p, n) for n in names):
            shown = ", ".join(names[:8]) + (" ..." if len(names) > 8 else "")
            raise ValueError(f"{field}: pattern {p!r} matches no parameter of the model "
                             f"(parameters: {shown})")
    return tuple(n for n in names if any(_matches(p, n) for p in patterns))


def select(names: Iterable[str], part: str, patterns: Sequence[str] | None) -> frozenset[str]:
    """The names of ``part`` (one of :data:`PARTS`) under the split ``patterns``."""
    names = list(names)
    if part not in PARTS:
        raise ValueError(f"personal part: expected one of {PARTS}, got {part!r}")
    if part == "none":
        return frozenset()
    if part == "all":
        return frozenset(names)
    head = set(head_names(names, patterns))
    return frozenset(head if part == "head" else set(names) - head)


def freeze(part: str, patterns: Sequence[str] | None, name: str = "freeze") -> Transform:
    """A local-optimizer piece that leaves ``part``'s parameters unchanged: their update is
    zero, whatever came before it in the chain (momentum, decay, Adam moments)."""

    def init(params: Params, ctx) -> dict:
        return {}

    def update(updates: Params, state: dict, params: Params, ctx):
        frozen = select(updates, part, patterns)
        return {k: torch.zeros_like(u) if k in frozen else u for k, u in updates.items()}, state

    return Transform(name, init, update, keeps_params=False)  # stateless
