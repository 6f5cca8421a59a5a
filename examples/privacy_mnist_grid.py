"""Accuracy against ε on MNIST: ε ∈ {1, 4, 8, ∞} × seeds {0, 1, 2} with
examples/privacy_mnist.toml, then the table (markdown) and plot.

    python examples/privacy_mnist_grid.py [--out runs/privacy_mnist_grid] [--rounds 100]

One torch thread by default (``--threads``): the MLP is small, and on a busy 2-core machine
extra threads spin (2 s a round with one thread, 14 s with two, measured under load).

A finished run is skipped (its folder is resumed), so the grid can be interrupted.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import torch

from fedforge.experiment.config import load_config
from fedforge.experiment.runner import run_experiment
from fedforge.study.privacy_plots import (
    accuracy_table,
    plot_accuracy_vs_epsilon,
    table_markdown,
)

CONFIG = Path(__file__).with_name("privacy_mnist.toml")
EPSILONS = (1.0, 4.0, 8.0, math.inf)
SEEDS = (0, 1, 2)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="runs/privacy_mnist_grid")
    ap.add_argument("--rounds", type=int, default=None)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    out = Path(args.out)
    runs: dict[float, list[Path]] = {}
    for eps in EPSILONS:
        for seed in SEEDS:
            over = [f"seed={seed}"]
            over += ["privacy.mode=off"] if math.isinf(eps) else [f"privacy.target_epsilon={eps}"]
            if args.rounds:
                over.append(f"rounds={args.rounds}")
            run_dir = out / f"eps{eps:g}_seed{seed}"
            run_experiment(load_config(CONFIG, over), run_dir, resume=run_dir.exists())
            runs.setdefault(eps, []).append(run_dir)
    rows = accuracy_table(runs)
    (out / "accuracy_vs_epsilon.md").write_text(table_markdown(rows), encoding="utf-8")
    plot_accuracy_vs_epsilon(rows, out / "accuracy_vs_epsilon.png")
    print(table_markdown(rows))


if __name__ == "__main__":
    main()
