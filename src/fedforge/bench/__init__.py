"""Benchmarks (``fedforge bench WORKLOAD``): W1/W2 throughput, W3 time to accuracy, the
population's cost, and pfl-research's CIFAR-10 and Ditto workloads side by side.

Benchmarks live in the package so ``fedforge bench`` runs them on any install; the scripts
in ``benchmarks/`` are thin wrappers. Each workload's module holds its command, a function
whose parameters are its options (:mod:`fedforge.bench.options`). Each writes its table as
a result record (:mod:`fedforge.bench.results`: rows, machine, CPU features, load, versions
and command) to ``benchmarks/results`` and regenerates ``benchmarks/RESULTS.md`` (run from
the checkout; elsewhere ``results/`` in the bench's own folder,
:func:`fedforge.bench.report.default_results`) — speed targets are checked here, never in
unit tests.

The package itself imports nothing (its names load on first use), so that the command line
builds the ``fedforge bench`` group (:mod:`fedforge.bench.commands`) without torch.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING

_NAMES = {"machine_line": "report", "record_results": "results", "run_info": "results"}
"""A public name -> the module of ``fedforge.bench`` it is loaded from."""
__all__ = list(_NAMES)

if TYPE_CHECKING:
    from fedforge.bench.report import machine_line  # noqa: F401
    from fedforge.bench.results import record_results, run_info  # noqa: F401


def __getattr__(name: str):
    if name in _NAMES:
        return getattr(import_module(f"fedforge.bench.{_NAMES[name]}"), name)
    raise AttributeError(f"module 'fedforge.bench' has no attribute {name!r}")
