"""Per-request delay laws: how long one local-training request occupies a client.

Every law maps ``(rng, client speed s, local steps tau, per-step time e)`` to seconds of
simulated time; one draw per request (the authors' ``utils/delay.py`` draws once and scales
by tau, not tau draws).

* :class:`ShiftedExponential` (FedAST, Sec. 5.1): ``tau * (Exp(mean=e*s) + shift*e*s)`` with
  ``shift = 1/2``, so ``E[delay] = 1.5 * tau * e * s`` and the minimum is ``0.5 * tau * e * s``.
* :class:`ConstantDelay`: ``tau * e * s`` (no randomness; handy for hand-built tests).
* :class:`TraceDelay`: replays measured durations (seconds per request, optionally per
  client), cycling through each list; ``scale_by_speed`` multiplies by ``s``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np


class DelayLaw:
    name = "base"

    def sample(self, rng: np.random.Generator, client: int, speed: float, tau: int,
               step_time: float) -> float:
        raise NotImplementedError

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        del state


class ShiftedExponential(DelayLaw):
    """``tau * (Exp(mean = e*s) + shift * e*s)``; mean ``(1 + shift) tau e s``."""

    name = "shifted_exp"

    def __init__(self, shift: float = 0.5) -> None:
        if shift < 0:
            raise ValueError(f"system.delay_shift: expected >= 0, got {shift}")
        self.shift = shift

    def sample(self, rng, client, speed, tau, step_time):
        scale = step_time * speed
        return float(tau * (rng.exponential(scale) + self.shift * scale))

    def mean(self, speed: float, tau: int, step_time: float) -> float:
        return (1.0 + self.shift) * tau * step_time * speed


class ConstantDelay(DelayLaw):
    """``tau * e * s`` exactly."""

    name = "constant"

    def sample(self, rng, client, speed, tau, step_time):
        del rng, client
        return float(tau * step_time * speed)


class TraceDelay(DelayLaw):
    """Replays durations: one shared list, or one list per client (``{client: [s, ...]}``)."""

    name = "trace"

    def __init__(self, trace: Sequence[float] | dict, scale_by_speed: bool = False) -> None:
        if isinstance(trace, dict):
            self.per_client = {int(k): [float(x) for x in v] for k, v in trace.items()}
            lists = list(self.per_client.values())
        else:
            self.per_client = None
            self.shared = [float(x) for x in trace]
            lists = [self.shared]
        if not lists or any(len(v) == 0 for v in lists) or any(x < 0 for v in lists for x in v):
            raise ValueError("system.delay_trace: expected non-empty lists of durations >= 0")
        self.scale_by_speed = scale_by_speed
        self.cursor: dict[int, int] = {}

    @classmethod
    def from_file(cls, path: str | Path, scale_by_speed: bool = False) -> TraceDelay:
        p = Path(path)
        if not p.is_file():
            raise ValueError(f"system.delay_trace: file {str(p)!r} not found")
        text = p.read_text()
        if p.suffix == ".json":
            return cls(json.loads(text), scale_by_speed)
        return cls([float(x) for x in text.replace(",", "\n").split()], scale_by_speed)

    def sample(self, rng, client, speed, tau, step_time):
        del rng, tau, step_time
        key = client if self.per_client is not None else -1
        seq = self.per_client.get(client) if self.per_client is not None else self.shared
        if seq is None:
            raise ValueError(f"system.delay_trace: no durations for client {client}")
        i = self.cursor.get(key, 0)
        self.cursor[key] = i + 1
        return seq[i % len(seq)] * (speed if self.scale_by_speed else 1.0)

    def state_dict(self) -> dict:
        return {"cursor": {str(k): v for k, v in self.cursor.items()}}

    def load_state_dict(self, state: dict) -> None:
        self.cursor = {int(k): v for k, v in state.get("cursor", {}).items()}


def build_delay(name: str, *, shift: float = 0.5, trace: str | None = None,
                scale_by_speed: bool = False) -> DelayLaw:
    if name == "shifted_exp":
        return ShiftedExponential(shift)
    if name == "constant":
        return ConstantDelay()
    if name == "trace":
        if trace is None:
            raise ValueError("system.delay_trace: the trace law needs a file")
        return TraceDelay.from_file(trace, scale_by_speed)
    raise ValueError(f"system.delay: unknown law {name!r}; expected one of "
                     "['constant', 'shifted_exp', 'trace']")


def delay_from(timing) -> DelayLaw:
    """The delay law a ``[sim]`` or ``[system]`` section (``ClientTiming``) describes."""
    return build_delay(timing.delay, shift=timing.delay_shift, trace=timing.delay_trace,
                       scale_by_speed=timing.trace_scale_by_speed)
