"""Per-round schedules for hyper-parameters (learning rates, weight decay, ε, clip threshold).

A schedule maps the round index ``t`` (1-based, a 0-d float tensor broadcast by
:func:`fedforge.engine.round.federated_round` as ``ctx.round``) to a value, using tensor
ops only, so it works unchanged under ``vmap``, needs no Python state and no recompilation,
and a run resumed at round ``k`` continues the schedule exactly where it was (the position
*is* the round).

Kinds (the same names in Python and configs; in a config table the kind may be given as
``schedule = "..."`` or ``kind = "..."``, e.g. TOML
``local_lr = {schedule = "exponential", init = 0.01, gamma = 0.998}``)::

    0.01                                               constant
    {kind="constant", value=0.01}
    {kind="exponential", init=0.01, gamma=0.998}       init * gamma**t
    {kind="cosine", init=0.1, rounds=500, final=0.0}   final + (init-final)(1+cos(pi min(t,T)/T))/2
    {kind="step", init=0.1, factor=0.1, every=100}     init * factor**floor(t/every)
    {kind="step", init=0.1, factor=0.1, milestones=[100, 300]}
    {kind="warmup", init=0.1, rounds=10, then={...}}   init * t/rounds for t < rounds, then `then`
                                                         (``then`` defaults to constant ``init``)
    any callable ``f(t: Tensor) -> Tensor | float``     a user schedule

``exponential`` at round ``t`` is ``init * gamma**t``: with the 1-based rounds of this library
this is exactly the FedNAR/FedExP code's ``eta_l * decay**(t+1)`` for its 0-based ``t``.
Values are computed in float64 from the round tensor (``schedule(ctx.round)``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch


class Schedule:
    """Base class: ``schedule(t)`` -> value at round ``t`` (tensor in, tensor or float out)."""

    kind = "schedule"

    def __call__(self, t: torch.Tensor) -> torch.Tensor | float:
        raise NotImplementedError

    @property
    def is_constant(self) -> bool:
        return False

    def at(self, round_: int | float) -> float:
        """The value at an integer round, as a Python float (for tests, logs, docs)."""
        return float(self(torch.tensor(float(round_), dtype=torch.float64)))


def _t(t: torch.Tensor | float | int) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        return torch.tensor(float(t), dtype=torch.float64)
    return t if t.dtype == torch.float64 or t.device.type == "mps" else t.to(torch.float64)


@dataclass(frozen=True)
class Constant(Schedule):
    value: float
    kind = "constant"

    def __call__(self, t):
        return self.value  # a Python float keeps the parameters' dtype and exact arithmetic

    @property
    def is_constant(self) -> bool:
        return True


@dataclass(frozen=True)
class Exponential(Schedule):
    init: float
    gamma: float
    kind = "exponential"

    def __call__(self, t):
        t = _t(t)
        return self.init * torch.pow(torch.tensor(self.gamma, dtype=t.dtype, device=t.device), t)

    @property
    def is_constant(self) -> bool:
        return self.gamma == 1.0


@dataclass(frozen=True)
class Cosine(Schedule):
    init: float
    rounds: int
    final: float = 0.0
    kind = "cosine"

    def __call__(self, t):
        frac = torch.clamp(_t(t) / self.rounds, 0.0, 1.0)
        return self.final + (self.init - self.final) * 0.5 * (1.0 + torch.cos(math.pi * frac))


@dataclass(frozen=True)
class Step(Schedule):
    init: float
    factor: float
    every: int | None = None
    milestones: tuple[int, ...] = ()
    kind = "step"

    def __call__(self, t):
        t = _t(t)
        if self.every is not None:
            n = torch.floor(t / self.every)
        else:
            n = sum((t >= m).to(t.dtype) for m in self.milestones) + torch.zeros_like(t)
        return self.init * torch.pow(torch.tensor(self.factor, dtype=t.dtype, device=t.device), n)


@dataclass(frozen=True)
class Warmup(Schedule):
    """Linear warm-up ``init * t / rounds`` for ``t < rounds``, then ``then(t)``."""

    init: float
    rounds: int
    then: Schedule | None = None
    kind = "warmup"

    def __call__(self, t):
        t = _t(t)
        after = self.then(t) if self.then is not None else self.init
        after = torch.as_tensor(after, dtype=t.dtype, device=t.device)
        return torch.where(t < self.rounds, self.init * t / self.rounds, after)


@dataclass(frozen=True)
class FromCallable(Schedule):
    fn: Callable[[torch.Tensor], Any]
    kind = "callable"

    def __call__(self, t):
        return self.fn(_t(t))


ScheduleLike = float | int | Schedule | Mapping[str, Any] | Callable[[torch.Tensor], Any]

_KINDS: dict[str, type[Schedule]] = {
    "constant": Constant, "exponential": Exponential, "exp": Exponential, "cosine": Cosine,
    "step": Step, "warmup": Warmup, "linear_warmup": Warmup,
}


def as_schedule(value: ScheduleLike, name: str = "value") -> Schedule:
    """A constant, a config dict (``{kind=..., ...}``), a :class:`Schedule` or a callable."""
    if isinstance(value, Schedule):
        return value
    if isinstance(value, bool):
        raise ValueError(f"{name}: expected a number or a schedule, got {value!r}")
    if isinstance(value, (int, float)):
        return Constant(float(value))
    if isinstance(value, Mapping):
        spec = dict(value)
        if "kind" in spec and "schedule" in spec:
            raise ValueError(f"{name}: give the schedule kind as 'schedule' or 'kind', not both")
        kind = spec.pop("kind", spec.pop("schedule", None))
        if kind not in _KINDS:
            raise ValueError(f"{name}: schedule kind {kind!r} unknown; expected one of "
                             f"{sorted(k for k in _KINDS if k not in ('exp', 'linear_warmup'))}")
        cls = _KINDS[kind]
        if cls is Warmup and "then" in spec and spec["then"] is not None:
            spec["then"] = as_schedule(spec["then"], f"{name}.then")
        if cls is Step and "milestones" in spec:
            spec["milestones"] = tuple(int(m) for m in spec["milestones"])
        if cls is Step and ("every" in spec) == ("milestones" in spec):
            raise ValueError(f"{name}: step schedule needs exactly one of 'every' and 'milestones'")
        try:
            return cls(**spec)
        except TypeError as exc:
            fields = sorted(cls.__dataclass_fields__)
            raise ValueError(f"{name}: bad options {sorted(spec)} for schedule {kind!r}; "
                             f"expected {fields}") from exc
    if callable(value):
        return FromCallable(value)
    raise ValueError(f"{name}: expected a number, a schedule dict or a callable, got {value!r}")


def as_optional_schedule(value: ScheduleLike | None, name: str = "value") -> Schedule | None:
    return None if value is None else as_schedule(value, name)


def is_zero(s: Schedule | None) -> bool:
    """True for ``None`` and the constant 0 (the transform can be left out)."""
    return s is None or (isinstance(s, Constant) and s.value == 0.0)


def value_at(s: Schedule, t: torch.Tensor | None) -> torch.Tensor | float:
    """``s(t)``; a constant never reads ``t`` (so it works where no round is broadcast)."""
    if isinstance(s, Constant):
        return s.value
    if t is None:
        raise ValueError(f"a {s.kind} schedule needs the round index, but none was given")
    return s(t)


def first_value(s: Schedule) -> float:
    """The value at round 1 (used to validate signs: ``lr > 0`` and so on)."""
    return s.at(1)


def values(s: ScheduleLike, rounds: Sequence[int]) -> list[float]:
    """``[s(t) for t in rounds]`` as floats (plots, docs, tests)."""
    sched = as_schedule(s)
    return [sched.at(t) for t in rounds]


__all__ = ["Constant", "Cosine", "Exponential", "FromCallable", "Schedule", "ScheduleLike", "Step",
           "Warmup", "as_optional_schedule", "as_schedule", "first_value", "is_zero", "value_at",
           "values"]
