"""Checks of everything a node sends the server. Each returns the parsed value or a one-line
reason; the server logs the reason with the node and drops the reply, so a broken or
malicious node can never crash the server loop."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from flwr.app import RecordDict

from fedforge.flower.common import NUM_EXAMPLES, SERVER_ROUND

METRICS = "metrics"


def validate_reply(content: RecordDict, template: dict[str, dict[str, torch.Tensor]]
                   ) -> tuple[dict, ...] | str:
    """Check a reply's arrays against the expected flat shapes; returns one flat dict per
    template record (in template order) or a reason.

    ``template`` is e.g. ``{"delta": {name: tensor}, "uploads": {name: tensor}}``. Besides
    those records a reply may carry only ``"metrics"`` (see :func:`check_metrics`).
    """
    extra = sorted(set(content.keys()) - set(template) - {METRICS})
    if extra:
        return f"unexpected records {extra}"
    got: dict[str, dict[str, torch.Tensor]] = {}
    for rec, expected in template.items():
        if rec not in content.array_records:
            return f"missing record {rec!r}"
        try:
            flat = content.array_records[rec].to_torch_state_dict()
        except Exception as exc:  # undecodable arrays
            return f"{rec}: cannot decode arrays ({type(exc).__name__}: {exc})"
        missing, unexpected = set(expected) - set(flat), set(flat) - set(expected)
        if missing or unexpected:
            return f"{rec}: missing keys {sorted(missing)}, unexpected keys {sorted(unexpected)}"
        for name, ref in expected.items():
            t = flat[name]
            if tuple(t.shape) != tuple(ref.shape):
                return f"{rec}/{name}: shape {tuple(t.shape)}, expected {tuple(ref.shape)}"
            if t.dtype != ref.dtype:
                return f"{rec}/{name}: dtype {t.dtype}, expected {ref.dtype}"
            if t.is_floating_point() and not bool(torch.isfinite(t).all()):
                return f"{rec}/{name}: NaN or Inf"
        got[rec] = {name: flat[name] for name in expected}  # the template's key order
    return tuple(got[rec] for rec in template)


def _finite_number(v) -> bool:
    return (isinstance(v, (int, float)) and not isinstance(v, bool)
            and math.isfinite(float(v)))


def check_metrics(content: RecordDict, expected_examples: int | None = None
                  ) -> tuple[int, dict] | str:
    """The reply's ``"metrics"`` MetricRecord: every value a finite number (or list of them)
    and ``"num-examples"`` a non-negative integer, equal to ``expected_examples`` when the
    server knows the partition's size. Returns ``(num_examples, metrics)`` or a reason."""
    if METRICS not in content.metric_records:
        return f"missing record {METRICS!r} (a MetricRecord with {NUM_EXAMPLES!r})"
    metrics = dict(content.metric_records[METRICS])
    for key, value in metrics.items():
        values = value if isinstance(value, list) else [value]
        if not all(_finite_number(v) for v in values):
            return f"{METRICS}/{key}: not a finite number ({str(value)[:40]})"
    if NUM_EXAMPLES not in metrics:
        return f"{METRICS}: missing {NUM_EXAMPLES!r}"
    n = metrics[NUM_EXAMPLES]
    if isinstance(n, list) or float(n) != int(n) or int(n) < 0:
        return f"{METRICS}/{NUM_EXAMPLES}: {n!r} is not a non-negative integer"
    if expected_examples is not None and int(n) != expected_examples:
        return (f"{METRICS}/{NUM_EXAMPLES}: {int(n)}, but the partition holds "
                f"{expected_examples} samples")
    return int(n), metrics


def check_reply_round(metrics: dict, round_: int) -> str | None:
    """Why a fedforge-protocol reply's ``metrics`` do not echo ``round_`` (the round of the
    message it answers), or None: the content of an earlier round's reply is refused."""
    echo = metrics.get(SERVER_ROUND)
    if echo is None:
        return f"{METRICS}: missing {SERVER_ROUND!r} (the round the reply answers)"
    if isinstance(echo, list) or float(echo) != round_:
        return (f"{METRICS}/{SERVER_ROUND}: {str(echo)[:20]}, but this is round {round_}'s "
                "message (a stale or replayed reply)")
    return None


def check_partition_claim(content: RecordDict, num_clients: int) -> int | str:
    """A QUERY reply's ``config/partition-id``: an integer in ``[0, num_clients)``."""
    if "config" not in content.config_records:
        return "query reply without a 'config' record"
    conf = content.config_records["config"]
    if "partition-id" not in conf:
        return "query reply without 'partition-id'"
    pid = conf["partition-id"]
    if isinstance(pid, bool) or not isinstance(pid, int):
        return f"partition-id {str(pid)[:40]!r} is not an integer"
    if not 0 <= pid < num_clients:
        return f"partition-id {pid} is outside [0, {num_clients})"
    return pid


def l2_norm(flat: dict[str, torch.Tensor]) -> float:
    """L2 norm over every floating tensor, in float64 (a float32 sum of 1e30**2 overflows)."""
    sq = sum(float(t.double().pow(2).sum()) for t in flat.values() if t.is_floating_point())
    return math.sqrt(sq)


def norm_outliers(norms: Sequence[float], ratio: float | None, bound: float | None
                  ) -> list[str | None]:
    """Per reply: why its norm is out of bounds, or None. ``ratio`` bounds a norm relative to
    the round's (lower) median norm, ``bound`` absolutely; None switches either off."""
    if not norms:
        return []
    median = float(torch.tensor(list(norms), dtype=torch.float64).median())
    out: list[str | None] = []
    for n in norms:
        if bound is not None and n > bound:
            out.append(f"norm {n:.4g} > max_norm {bound:.4g}")
        elif ratio is not None and median > 0 and n > ratio * median:
            out.append(f"norm {n:.4g} > {ratio:g} x the round's median norm {median:.4g}")
        else:
            out.append(None)
    return out
