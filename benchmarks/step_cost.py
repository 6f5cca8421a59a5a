"""One client's update on one thread, for every zoo model: fedforge's loop engine against a
plain module trained with ``torch.optim.SGD``, W1's schedule (10 steps of batch 32).

Both rows run one client at a time, as each single-threaded worker process does, so the ratio
is what separates ``auto``'s loop in worker processes from the plain floor of as many plain
processes, at any cohort size. Rows are interleaved, best of three passes; the allocator is
set as in every worker process (``fedforge.core.malloc``).

    python benchmarks/step_cost.py                 # every model of the zoo
    python benchmarks/step_cost.py lenet5,mlp      # some
"""

from __future__ import annotations

import sys
import time

import torch

from fedforge.algorithms import build_algorithm
from fedforge.bench.workload import (
    LR,
    W1,
    fedforge_round,
    for_model,
    make_data,
    make_engine,
    plain_loop,
)
from fedforge.core.malloc import keep_freed_memory
from fedforge.engine import classification_loss
from fedforge.models import MODELS, build_model

PASSES = 3
TARGET_S = 1.5  # seconds of plain training per row and pass (3 to 40 clients)


def rows_for(name: str) -> tuple[int, dict]:
    """The clients timed and the rows (label -> one pass) for model ``name``."""
    work = for_model(W1, name)
    torch.manual_seed(0)
    model = build_model(work.model, work.input_shape, work.num_classes)
    x, y, idx = make_data(2, torch.device("cpu"), work)
    plain_loop(model, x, y, idx)  # the first call pays torch's one-time set-up
    t = time.perf_counter()
    plain_loop(model, x, y, idx)
    n = max(3, min(40, int(TARGET_S / ((time.perf_counter() - t) / 2))))
    x, y, idx = make_data(n, torch.device("cpu"), work)
    algo, loss_fn = build_algorithm("fedavg", local_lr=LR), classification_loss(model)
    rows = {"plain": lambda: plain_loop(model, x, y, idx)}
    layouts = [("loop", False)]
    if any(p.dim() == 4 for p in model.parameters()):
        layouts.append(("loop channels-last", True))
    for label, channels_last in layouts:
        engine = make_engine("loop", "auto", False, n, channels_last)
        rows[label] = (lambda e=engine: fedforge_round(e, model, x, y, idx, algo=algo,
                                                       loss_fn=loss_fn))
    return n, rows


def main(models: list[str]) -> None:
    keep_freed_memory()
    torch.set_num_threads(1)
    print("| model | clients | plain ms / update | fedforge loop | loop channels-last "
          "| fedforge's best ÷ plain (time) |")
    print("|---|---|---|---|---|---|")
    for name in models:
        n, rows = rows_for(name)
        for run in rows.values():  # warm-up
            run()
        best = dict.fromkeys(rows, float("inf"))
        for _ in range(PASSES):
            for label, run in rows.items():
                t = time.perf_counter()
                run()
                best[label] = min(best[label], (time.perf_counter() - t) / n * 1000)
        ours = min(v for k, v in best.items() if k != "plain")
        nhwc = f"{best['loop channels-last']:.1f}" if "loop channels-last" in best else "-"
        print(f"| {name} | {n} | {best['plain']:.1f} | {best['loop']:.1f} | {nhwc} "
              f"| {ours / best['plain']:.2f} |", flush=True)


if __name__ == "__main__":
    main(sys.argv[1].split(",") if len(sys.argv) > 1 else list(MODELS))
