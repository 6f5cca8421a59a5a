"""Benchmarks (``fedforge bench``): W1 throughput, W2 ResNet rounds/s, W3 time to accuracy.

Benchmarks live in the package so ``fedforge bench`` runs them on any install; the scripts
in ``benchmarks/`` are thin wrappers. Results are appended to ``benchmarks/RESULTS.md`` with
the machine, date, torch version and command (run from the checkout; elsewhere to
``RESULTS.md`` in the bench's own folder, :func:`fedforge.bench.report.default_results`) —
speed targets are checked here, never in unit tests.
"""

from fedforge.bench.report import append_results, machine_line

__all__ = ["append_results", "machine_line"]
