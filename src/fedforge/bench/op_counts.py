"""Per-step op counts of one client's local round: fedforge's loop against a plain module.

Wall time on a shared CPU says little about per-step overhead; counts do not depend on the
load. For the pfl-cifar10 workload's model and batches, :func:`op_counts` runs one client's
round (its local SGD steps) with fedforge's local update, as the in-process loop and each
worker of ``procs`` run it, and with the hand-written ``torch.optim.SGD`` loop of the
benchmark's plain row, and counts per step:

* ``aten ops``: the operators the torch profiler records (every dispatched call, nested
  ones included), which each cost a dispatch whatever their size;
* ``python calls``: the function calls ``cProfile`` sees (Python and builtins), the
  interpreter's share of a step.

``fedforge bench pfl-cifar10`` prints them under its table and records them in its note
(:func:`op_count_note`), so a change that adds per-step work shows there.
"""

from __future__ import annotations

import cProfile
import pstats
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn
from torch.profiler import ProfilerActivity, profile

from fedforge.models import build_model

BATCH, STEPS, LR = 10, 5, 0.1


def _fedforge_round(model: nn.Module, precision: str, x, y) -> Callable[[], object]:
    from fedforge.algorithms import build_algorithm
    from fedforge.engine import LoopEngine, classification_loss

    algo = build_algorithm("fedavg", local_lr=LR, server_lr=1.0)
    loss = classification_loss(model, precision)
    fn = LoopEngine().local_update(algo, loss, masked=False)
    params = {k: v.detach().clone() for k, v in model.named_parameters()}
    broadcast = {**algo.broadcast(algo.server_init(params)), "round": torch.tensor(1.0)}
    ws = torch.ones(1, STEPS, BATCH)
    return lambda: fn(params, broadcast, {}, {}, x[None], y[None], ws)


def _plain_round(model: nn.Module, precision: str, x, y) -> Callable[[], object]:
    def run() -> None:
        opt = torch.optim.SGD(model.parameters(), lr=LR)
        for k in range(STEPS):
            opt.zero_grad(set_to_none=True)
            with torch.autocast("cpu", torch.bfloat16, enabled=precision == "bf16"):
                logits = model(x[k])
            F.cross_entropy(logits.float(), y[k]).backward()
            opt.step()

    return run


def _counts(run: Callable[[], object]) -> tuple[float, float]:
    run()  # warm-up: first-call caches are not per-step work
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        run()
    aten = sum(1 for e in prof.events() if e.name.startswith("aten::"))
    calls = cProfile.Profile()
    calls.runcall(run)
    python = pstats.Stats(calls).total_calls
    return aten / STEPS, python / STEPS


def op_counts(model_name: str = "pfl_simple_cnn", precision: str = "fp32",
              seed: int = 0) -> dict[str, tuple[float, float]]:
    """``{"fedforge": (aten ops, python calls), "plain": (...)}`` per local step."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(STEPS, BATCH, 3, 32, 32, generator=g)
    y = torch.randint(0, 10, (STEPS, BATCH), generator=g)
    def model() -> nn.Module:  # one each: fedforge's loss reroutes its model's pooling
        torch.manual_seed(seed)
        return build_model(model_name, (3, 32, 32), 10)

    return {"fedforge": _counts(_fedforge_round(model(), precision, x, y)),
            "plain": _counts(_plain_round(model(), precision, x, y))}


def op_count_note(precision: str = "fp32", model_name: str = "pfl_simple_cnn") -> str:
    """One line for the benchmark's note: both rows' counts per step and their ratio."""
    c = op_counts(model_name, precision)
    (fa, fp), (pa, pp) = c["fedforge"], c["plain"]
    return (f"Per local step ({model_name}, batch {BATCH}, {precision}, one client, counted, "
            f"not timed): fedforge's loop {fa:.0f} aten ops and {fp:.0f} Python calls, the "
            f"plain module {pa:.0f} and {pp:.0f} ({fa / pa:.2f}x and {fp / pp:.2f}x).")


if __name__ == "__main__":
    import sys

    print(op_count_note(*(sys.argv[1:2] or ["fp32"])))
