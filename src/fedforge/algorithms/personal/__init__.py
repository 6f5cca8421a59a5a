"""Personalised federated learning: personal parameters per client, and the methods built on
them (docs/personalised.md). ``Personal`` is the spec an algorithm carries; the engine's local
round reads it through ``algorithm.personal`` and never names a method."""

from fedforge.algorithms.personal.base import (
    NAME,
    Personal,
    PersonalAlgorithm,
    PersonalPart,
    Phase,
    personalised,
)
from fedforge.algorithms.personal.methods import PERSONAL_ALGORITHMS
from fedforge.algorithms.personal.split import freeze, head_names, last_layer, select

__all__ = ["NAME", "PERSONAL_ALGORITHMS", "Personal", "PersonalAlgorithm", "PersonalPart",
           "Phase", "freeze", "head_names", "last_layer", "personalised", "select"]
