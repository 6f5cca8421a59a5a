"""The client samplers by name (``server.sampler``): building one from its options.

``uniform`` is no sampler: the round draws its cohort as it always has.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

from fedforge.algorithms.defaults import SAMPLER_DEFAULTS
from fedforge.sim.oort import oort
from fedforge.sim.selection import Factory, Sampler, power_of_choice

SAMPLERS: dict[str, Callable[..., Factory]] = {"power_of_choice": power_of_choice,
                                               "oort": oort}
"""Each sampler's factory: its keyword arguments are its ``server.sampler_options``."""


def sampler_names() -> tuple[str, ...]:
    """Every ``server.sampler`` value, ``uniform`` (no sampler) first."""
    return ("uniform", *SAMPLER_DEFAULTS)


def build_sampler(name: str, options: dict, *, num_clients: int, clients_per_round: int,
                  batch_size: int) -> Sampler | None:
    """``server.sampler`` with its ``server.sampler_options``; ``None`` for ``uniform``."""
    if name == "uniform":
        if options:
            raise ValueError(f"server.sampler_options: the uniform sampler takes no options, "
                             f"got {sorted(options)}")
        return None
    if name not in SAMPLERS:
        raise ValueError(f"server.sampler: unknown sampler {name!r}; expected one of "
                         f"{list(sampler_names())}")
    factory = SAMPLERS[name]
    allowed = [p.name for p in inspect.signature(factory).parameters.values()
               if p.kind is p.KEYWORD_ONLY]
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        raise ValueError(f"server.sampler_options: unknown option {unknown[0]!r} for {name}; "
                         f"expected one of {allowed}")
    return factory(**options)(num_clients, clients_per_round, batch_size)
