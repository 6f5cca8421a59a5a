"""Sketch speed: sketch + desketch of one d-parameter delta (``python -m fedforge.comm.bench``).

Prints one line per operator: median seconds over ``--reps`` of sk then desk (after one
warm-up), and the sketch size. Used for the sketch tables in benchmarks/history/2026-11.md.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from fedforge.comm.sketch import SRHT, CountSketch, GaussianSketch


def time_op(op, v: torch.Tensor, reps: int) -> float:
    op.desketch(op.sketch(v, 1), 1)  # warm-up
    times = []
    for r in range(reps):
        if v.is_cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        op.desketch(op.sketch(v, r + 2), r + 2)
        if v.is_cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--d", type=int, default=11_173_962)  # ResNet-18 (CIFAR, 10 classes)
    ap.add_argument("--ratio", type=float, default=100.0)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--gaussian-b", type=int, default=16)
    args = ap.parse_args(argv)
    v = torch.randn(args.d, device=args.device)
    b = int(args.d / args.ratio)
    ops = [SRHT(args.d, b), CountSketch(args.d, b // 5, rows=5),
           GaussianSketch(args.d, args.gaussian_b)]
    for op in ops:
        s = time_op(op, v, args.reps)
        print(f"{op.kind:9s} d={args.d} b={op.numel} device={args.device} sk+desk {s:.3f} s")


if __name__ == "__main__":
    main()
