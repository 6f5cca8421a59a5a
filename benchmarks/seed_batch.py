"""Seconds for S seeds of one config run one by one against one batch of S (issue 55).

    python benchmarks/seed_batch.py examples/quickstart.toml --seeds 3 --repeats 2 rounds=10

Each repeat times the separate runs, then the batch (interleaved, so a change in the
machine's load falls on both), checks that every batched run's metrics (wall clock aside)
and checkpoint equal the separate run's, and prints the seconds and the load average.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path

import torch

from fedforge.core.checkpoint import load_checkpoint
from fedforge.experiment.config import load_config
from fedforge.experiment.runner import read_metrics, run_experiment
from fedforge.experiment.seed_batch import run_seeds
from fedforge.study.labels import without_wall_clock


def same(a: Path, b: Path) -> bool:
    ra, rb = ([without_wall_clock(r) for r in read_metrics(d)] for d in (a, b))
    ta, tb = (torch.utils._pytree.tree_flatten(
        load_checkpoint(d / "checkpoints", torch.device("cpu"))[0])[0] for d in (a, b))
    return ra == rb and len(ta) == len(tb) and all(map(torch.equal, ta, tb))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("config")
    parser.add_argument("overrides", nargs="*")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_intermixed_args()
    overrides = ["engine.name=vmap", *args.overrides]
    cfgs = [load_config(args.config, [*overrides, f"seed={s}"]) for s in range(args.seeds)]
    root = Path(tempfile.mkdtemp(prefix="seed-batch-"))
    try:  # warm-up: the first run in a process pays for imports and first kernel calls
        run_experiment(cfgs[0].model_copy(update={"rounds": 1}), root / "warm", progress=False)
        for rep in range(args.repeats):
            alone = [root / f"r{rep}" / f"alone{s}" for s in range(args.seeds)]
            batch = [root / f"r{rep}" / f"batch{s}" for s in range(args.seeds)]
            load = os.getloadavg()[0]
            t0 = time.perf_counter()
            for cfg, d in zip(cfgs, alone, strict=True):
                run_experiment(cfg, d, progress=False)
            t1 = time.perf_counter()
            run_seeds(cfgs, batch)
            t2 = time.perf_counter()
            equal = all(same(a, b) for a, b in zip(alone, batch, strict=True))
            print(f"repeat {rep}: {args.seeds} separate {t1 - t0:.1f} s, batch {t2 - t1:.1f} s,"
                  f" speed-up {(t1 - t0) / (t2 - t1):.2f}x, bit-equal {equal}, "
                  f"load {load:.1f}->{os.getloadavg()[0]:.1f}", flush=True)
    finally:
        shutil.rmtree(root)


if __name__ == "__main__":
    main()
