"""NaN/Inf screening of a cohort's round: find the clients and parameters that diverged.

:func:`fedforge.engine.round.federated_round` screens each round under the run's
``divergence`` policy (``stop``, ``skip_client``, ``rollback``; what each does is in
:mod:`fedforge.robust.divergence`). A NaN gradient shows up as a non-finite update of the
parameter it reached (the update is ``x^t - x_i``), so checking each client's loss and
per-parameter update is enough to name where it happened; the check is a handful of
reductions per round, and the per-client search only runs in a faulty round.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace

import torch

from fedforge.core.tree import Params, flatten_dict, tree_index, tree_leaves
from fedforge.engine.base import ChunkedEngine, CohortInputs, CohortOutput

POLICIES = ("stop", "skip_client", "rollback")
logger = logging.getLogger(__name__)


class DivergenceError(FloatingPointError):
    """A non-finite loss or update; ``faults`` lists ``(client id, what)``."""

    def __init__(self, round_: int, faults: list[tuple[int, str]], policy: str = "stop"):
        self.round, self.faults, self.policy = round_, faults, policy
        shown = "; ".join(f"client {c}: {what}" for c, what in faults[:3])
        more = f" (+{len(faults) - 3} more clients)" if len(faults) > 3 else ""
        super().__init__(f"round {round_}: diverged (non-finite values), {shown}{more}")


def all_finite(tree) -> bool:
    return all(bool(torch.isfinite(t).all()) for t in tree_leaves(tree) if t.is_floating_point())


def _describe(t: torch.Tensor) -> str:
    return f"{int(t.isnan().sum())} NaN, {int(t.isinf().sum())} Inf"


def locate_faults(
    client_ids: torch.Tensor, loss: torch.Tensor, deltas: Params
) -> list[tuple[int, str]]:
    """Per client: which of the loss and the parameters' updates are non-finite."""
    flat = flatten_dict(deltas)
    faults = []
    for i, cid in enumerate(client_ids.tolist()):
        what = [] if bool(torch.isfinite(loss[i])) else [f"loss={float(loss[i])}"]
        what += [f"update of {name!r} ({_describe(d[i])})" for name, d in flat.items()
                 if not bool(torch.isfinite(d[i]).all())]
        if what:
            faults.append((cid, ", ".join(what)))
    return faults


def subset_inputs(inputs: CohortInputs, keep: torch.Tensor) -> CohortInputs:
    """The cohort restricted to ``keep`` (indices), aggregation weights renormalised."""
    w = inputs.agg_weights[keep]
    return inputs._replace(
        client_states=tree_index(inputs.client_states, keep),
        info=tree_index(inputs.info, keep),
        sample_idx=inputs.sample_idx[keep],
        weights=inputs.weights[keep],
        agg_weights=w / w.sum().clamp_min(1e-12),
    )


def screen_cohort(
    policy: str,
    cohort: CohortOutput,
    run: Callable[[CohortInputs, bool], CohortOutput],
    inputs: CohortInputs,
    client_ids: torch.Tensor,
    round_: int,
) -> tuple[CohortOutput, CohortInputs, torch.Tensor, list[tuple[int, str]]]:
    """-> (cohort, inputs, client_ids, faults) with the policy applied; raises for stop/rollback.

    ``run(inputs, keep_deltas)`` re-runs the engine (deterministic: same inputs, same result).
    """
    if policy not in POLICIES:
        raise ValueError(f"divergence: expected one of {list(POLICIES)}, got {policy!r}")
    if all_finite((cohort.metrics.loss, cohort.mean_delta, cohort.mean_uploads)):
        return cohort, inputs, client_ids, []
    full = cohort if cohort.deltas is not None else run(inputs, True)
    faults = locate_faults(client_ids, full.metrics.loss, full.deltas)
    if not faults:  # only an upload (e.g. a control variate) went non-finite: blame everyone
        faults = [(c, "non-finite upload") for c in client_ids.tolist()]
    if policy != "skip_client":
        raise DivergenceError(round_, faults, policy)
    bad = set(c for c, _ in faults)
    keep = torch.tensor([i for i, c in enumerate(client_ids.tolist()) if c not in bad],
                        dtype=torch.long, device=inputs.sample_idx.device)
    if keep.numel() == 0:
        raise DivergenceError(round_, faults, policy)
    sub = subset_inputs(inputs, keep)
    logger.warning("%s; skip_client: aggregating the other %d clients",
                   DivergenceError(round_, faults), keep.numel())
    out = run(sub, cohort.deltas is not None)
    skipped = torch.tensor(sorted(bad), dtype=torch.long)
    out = out._replace(metrics=replace(out.metrics, skipped_clients=skipped))
    return out, sub, client_ids[keep.to(client_ids.device)], faults


def rerun_fn(engine: ChunkedEngine, algorithm, loss_fn, x_all, y_all) -> Callable:
    """``run(inputs, keep_deltas)`` for :func:`screen_cohort` on the round's engine."""

    def run(inputs: CohortInputs, keep_deltas: bool) -> CohortOutput:
        old = engine.keep_deltas
        engine.keep_deltas = keep_deltas or old
        try:
            return engine.run_cohort(algorithm, loss_fn, x_all, y_all, inputs)
        finally:
            engine.keep_deltas = old

    return run


def check_model(params: Params, round_: int) -> None:
    """The new global model must be finite (a server optimizer can overflow on its own)."""
    bad = [k for k, v in flatten_dict(params).items() if not bool(torch.isfinite(v).all())]
    if bad:
        raise DivergenceError(round_, [(-1, f"server model {k!r} non-finite") for k in bad])
