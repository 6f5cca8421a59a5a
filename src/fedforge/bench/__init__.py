"""Benchmarks (``fedforge bench WORKLOAD``): W1/W2 throughput, W3 time to accuracy, the
population's cost, and pfl-research's CIFAR-10 and Ditto workloads side by side.

Benchmarks live in the package so ``fedforge bench`` runs them on any install; the scripts
in ``benchmarks/`` are thin wrappers. Each workload's module holds its command, a function
whose parameters are its options (:mod:`fedforge.bench.options`). Results are appended to
``benchmarks/RESULTS.md`` with the machine, date, torch version and command (run from the
checkout; elsewhere to ``RESULTS.md`` in the bench's own folder,
:func:`fedforge.bench.report.default_results`) — speed targets are checked here, never in
unit tests.
"""

from fedforge.bench.report import append_results, machine_line

__all__ = ["append_results", "machine_line"]
