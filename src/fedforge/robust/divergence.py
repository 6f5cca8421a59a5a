"""The three divergence policies: what the runner does when a round diverges.

``divergence`` (config, top level) says what a non-finite loss, gradient or client update
does:

* ``stop`` (default): raise :class:`DivergenceError` naming the round, the clients and the
  parameters; the runner has not yet checkpointed the round, so the last checkpoint on disk
  is the last good state.
* ``skip_client``: drop the offending clients and re-run the round's aggregation on the rest
  with their weights renormalised to sum to one (their persistent state is not updated).
* ``rollback``: raise, and the runner reloads the last good checkpoint and continues with
  the local learning rate multiplied by ``rollback_lr_factor``.

The round's own screening (finding the clients and parameters, re-running the others) is
:mod:`fedforge.engine.screening`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from fedforge.algorithms import algorithm_hparams
from fedforge.engine.screening import POLICIES, DivergenceError  # noqa: F401 (the runner's names)


def scale_lr(name: str, hparams: dict, factor: float) -> dict:
    """Algorithm ``name``'s ``hparams`` with ``local_lr`` (given or default) times ``factor``."""
    lr = hparams.get("local_lr", algorithm_hparams(name).get("local_lr"))
    if lr is None:
        raise ValueError("divergence: rollback needs a numeric algorithm.local_lr (or client.lr)")
    if not isinstance(lr, (int, float)) or isinstance(lr, bool):
        raise ValueError(f"divergence: rollback scales a numeric algorithm.local_lr; got {lr!r} "
                         "(a schedule); use divergence='stop' or 'skip_client'")
    return {**hparams, "local_lr": lr * factor}


def log_event(out_dir, record: dict) -> None:
    """Append one divergence event to ``out_dir/divergence.jsonl`` (flushed, whole lines)."""
    with open(Path(out_dir) / "divergence.jsonl", "a", encoding="utf-8") as f:
        f.write(json.dumps(record) + "\n")
        f.flush()
        os.fsync(f.fileno())
