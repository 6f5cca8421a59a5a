"""The synchronous round, re-exported: it lives in :mod:`fedforge.engine.round`."""

from fedforge.engine.round import RoundResult, federated_round

__all__ = ["RoundResult", "federated_round"]
