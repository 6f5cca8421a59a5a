"""Built-in reproductions; importing this package registers them, so names are looked up here."""

from fedforge.reproduce.papers import (  # noqa: F401
    baselines,
    fadamgc,
    fedast,
    fednar,
    fedptr,
    lora,
    pfl,
    safl,
)
from fedforge.reproduce.spec import REPRODUCTIONS, Reproduction


def get_reproduction(name: str) -> Reproduction:
    """The registered spec ``name``: a built-in one or one registered by the user."""
    if name not in REPRODUCTIONS:
        raise KeyError(f"unknown reproduction {name!r}; known: {', '.join(sorted(REPRODUCTIONS))}")
    return REPRODUCTIONS[name]()
