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
"""

from fedforge.bench.report import machine_line
from fedforge.bench.results import record_results, run_info

__all__ = ["machine_line", "record_results", "run_info"]
