"""The metric a method is judged by, read back from run folders.

Each algorithm declares it (:attr:`fedforge.protocol.algorithm.Algorithm.judged_by`): the
personalised model's mean per-client accuracy for a personalised method, the global model's
pooled test accuracy otherwise. ``compare``, ``report``, ``plot`` and ``sweep`` default to it;
runs of several kinds are ranked on the personalised metric (for a method without a personal
model it measures the global model on the same per-client data, so the comparison is fair)
and their tables show the pooled test accuracy beside it.
"""

from __future__ import annotations

from collections.abc import Iterable

from fedforge.protocol.algorithm import GLOBAL_METRIC


def algorithm_metric(name: str | None, hparams: dict | None = None) -> str:
    """The metric algorithm ``name`` (with ``hparams``) is judged by; the global metric for
    a name this process cannot build (a plugin not loaded here)."""
    if name is None:
        return GLOBAL_METRIC
    from fedforge.algorithms import algorithm_hparams, build_algorithm  # noqa: PLC0415

    try:
        allowed = algorithm_hparams(name)
        given = {k: v for k, v in (hparams or {}).items() if k in allowed}
        try:
            return build_algorithm(name, **given).judged_by
        except (TypeError, ValueError):
            return build_algorithm(name).judged_by
    except (KeyError, TypeError, ValueError):
        return GLOBAL_METRIC


def run_metric(run) -> str:
    """What ``run`` (a :class:`fedforge.study.plots.Run`) is judged by: its algorithm's
    metric where its records hold it, else the pooled test accuracy."""
    algo = run.config.get("algorithm")
    key = algorithm_metric(run.algorithm, algo if isinstance(algo, dict) else None)
    return key if any(key in r for r in run.records) else GLOBAL_METRIC


def shared_metric(keys: Iterable[str], recorded: Iterable[set[str]]) -> str:
    """One metric for methods judged by ``keys``, each run recording the keys in
    ``recorded``: their metric if they agree, else the first one that is not the global
    metric and that every run records, else the global metric."""
    keys, recorded = list(dict.fromkeys(keys)), list(recorded)
    if len(keys) == 1:
        return keys[0]
    for key in keys:
        if key != GLOBAL_METRIC and all(key in got for got in recorded):
            return key
    return GLOBAL_METRIC


def comparison_metric(runs: list) -> str:
    """The metric runs of several methods are compared on (:func:`shared_metric`)."""
    if not runs:
        return GLOBAL_METRIC
    return shared_metric((run_metric(r) for r in runs),
                         ({k for rec in r.records for k in rec} for r in runs))


def table_metrics(main: str) -> list[str]:
    """The metrics a comparison's table shows: ``main`` and the pooled test accuracy."""
    return list(dict.fromkeys([main, GLOBAL_METRIC]))
