"""Global-model weight norm at the end of each FedNAR reproduction run, with and without NAR.

NAR puts the weight decay inside the clip, so on a clipped step the decay shrinks with the
gradient; the weights should end larger than with the decay added after the clip. This reads
the last checkpoint of every run of ``fedforge reproduce fednar`` and prints, per condition,
the mean over seeds of ||x|| and of lambda * ||x|| / A (the decay's size against the clip).

    python examples/fednar_weight_norms.py [runs/reproduce/fednar]
"""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path

import torch
from safetensors.torch import load_file


def final_norm(run: Path) -> tuple[float, float] | None:
    """-> (||x||, lambda * ||x|| / A) at the run's last checkpoint, or None if it has none."""
    checkpoints = sorted((run / "checkpoints").glob("round_*.safetensors"))
    if not checkpoints:
        return None
    tensors = load_file(checkpoints[-1])
    norm = torch.sqrt(sum((t.double() ** 2).sum() for k, t in tensors.items()
                          if k.startswith("params"))).item()
    client = tomllib.loads((run / "config.resolved.toml").read_text())["client"]
    return norm, client["weight_decay"] * norm / client["max_grad_norm"]


def main(root: Path) -> None:
    print("| condition | seeds | ||x|| at the end | λ ||x|| / A |")
    print("|---|---|---|---|")
    for condition in sorted(p for p in root.iterdir() if p.is_dir()):
        norms = [n for run in sorted(condition.glob("seed*")) if (n := final_norm(run))]
        if norms:
            mean = [sum(v) / len(norms) for v in zip(*norms, strict=True)]
            print(f"| {condition.name} | {len(norms)} | {mean[0]:.3f} | {mean[1]:.4f} |")


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "runs/reproduce/fednar"))
