"""Algorithm registry: name -> factory. Each factory's keyword arguments are its hparams."""

from __future__ import annotations

import inspect
from collections.abc import Callable

from fedforge.algorithms import fadamgc, momentum
from fedforge.algorithms.clustered import cfl, ifca
from fedforge.algorithms.compressed import fetchsgd, marina, onebit_adam, safl, topk_ef
from fedforge.algorithms.fairness import afl, qffl
from fedforge.algorithms.fedavg import fedavg, fedavgm, fedprox
from fedforge.algorithms.feddc import feddc
from fedforge.algorithms.feddyn import feddyn
from fedforge.algorithms.fedexp import fedexp
from fedforge.algorithms.fedgen import fedgen
from fedforge.algorithms.fednova import fednova
from fedforge.algorithms.fedopt import fedadagrad, fedadam, fedams, fedyogi
from fedforge.algorithms.fedptr import fedptr, fedptr_s
from fedforge.algorithms.flora import flora
from fedforge.algorithms.moon import moon
from fedforge.algorithms.personal import PERSONAL_ALGORITHMS
from fedforge.algorithms.scaffold import scaffold
from fedforge.protocol.algorithm import Algorithm, FinalizeInputs, Part

ALGORITHMS: dict[str, Callable[..., Algorithm]] = {
    "fedavg": fedavg,
    "fedavg_server_momentum": fedavgm,
    "fedprox": fedprox,
    "scaffold": scaffold,
    "fedadam": fedadam,
    "fedyogi": fedyogi,
    "fedadagrad": fedadagrad,
    "fedams": fedams,
    "fedexp": fedexp,
    "fadamgc": fadamgc.fadamgc,
    "fa_nt": fadamgc.fa_nt,
    "localadam": fadamgc.localadam,
    "fedavg_global_momentum": momentum.fedavg_m,
    "scaffold_m": momentum.scaffold_m,
    "feddyn": feddyn,
    "feddc": feddc,
    "fedptr": fedptr,
    "fedptr_s": fedptr_s,
    "safl": safl,
    "fetchsgd": fetchsgd,
    "topk_ef": topk_ef,
    "onebit_adam": onebit_adam,
    "marina": marina,
    "fednova": fednova,
    "qffl": qffl,
    "afl": afl,
    "ifca": ifca,  # clustered FL (docs/baselines.md)
    "cfl": cfl,
    "moon": moon,
    "flora": flora,  # federated LoRA over a pretrained model (docs/finetuning.md)
    "fedgen": fedgen,
    **PERSONAL_ALGORITHMS,  # personalised FL (docs/personalised.md)
}


ALIASES: dict[str, str] = {
    "fedavgm": "fedavg_server_momentum",  # Hsu et al. 2019's name
    "fedavg_m": "fedavg_global_momentum",  # Cheng et al. 2024's name
    "qfedavg": "qffl",  # the solver's name (Li et al. 2020; Flower's QFedAvg)
}
"""Older or paper names that stay accepted; ``fedforge algorithms`` lists the canonical ones."""


def canonical_name(name: str) -> str:
    return ALIASES.get(name, name)


def register(name: str, factory: Callable[..., Algorithm]) -> None:
    """Add an algorithm factory to the registry (used by later algorithm modules and users)."""
    ALGORITHMS[name] = factory


def algorithm_hparams(name: str) -> dict[str, object]:
    """The hyper-parameters of a registered algorithm and their defaults."""
    factory = _factory(name)
    return {
        p.name: p.default for p in inspect.signature(factory).parameters.values()
        if p.default is not inspect.Parameter.empty
    }


def resolved_hparams(name: str, given: dict) -> dict:
    """The full hyper-parameter set of algorithm ``name``: ``given`` over every default.

    Unknown names or keys raise the same ``ValueError`` as :func:`build_algorithm`; the
    order is the factory's (a run records every value it used, not only the given ones).
    """
    defaults = algorithm_hparams(name)
    unknown = sorted(set(given) - set(defaults))
    if unknown:
        raise ValueError(f"algorithm.{unknown[0]}: not a hyper-parameter of {name!r}; "
                         f"expected one of {sorted(defaults)}")
    return {key: given.get(key, value) for key, value in defaults.items()}


def _factory(name: str) -> Callable[..., Algorithm]:
    name = canonical_name(name)
    if name not in ALGORITHMS:
        raise ValueError(f"algorithm.name: unknown algorithm {name!r}; expected one of "
                         f"{sorted(ALGORITHMS)}")
    return ALGORITHMS[name]


def build_algorithm(name: str, **hparams) -> Algorithm:
    """Build a registered algorithm; unknown hyper-parameters are an error naming them."""
    allowed = algorithm_hparams(name)
    unknown = sorted(set(hparams) - set(allowed))
    if unknown:
        raise ValueError(f"algorithm.{unknown[0]}: not a hyper-parameter of {name!r}; "
                         f"expected one of {sorted(allowed)}")
    for key, value in hparams.items():
        if key.endswith("lr") and isinstance(value, (int, float)) and value <= 0:
            raise ValueError(f"algorithm.{key}: expected a positive learning rate, got {value}")
    return _factory(name)(**hparams)


def describe_algorithms() -> dict[str, str]:
    """name -> one-line description (``fedforge algorithms``)."""
    return {name: build_algorithm(name).description for name in sorted(ALGORITHMS)}


__all__ = ["ALGORITHMS", "ALIASES", "Algorithm", "FinalizeInputs", "Part", "algorithm_hparams",
           "build_algorithm", "canonical_name", "describe_algorithms", "register",
           "resolved_hparams"]
