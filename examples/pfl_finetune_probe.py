"""How evaluation-time fine-tuning moves a personalised run's per-client accuracy.

FedAvg-FT and FedBABU score each client after a few local steps from the global model. This
reads a finished run's last checkpoint and scores every client again after each number of
steps, on each part of the model (``all``, ``head``, ``body``) and at each learning rate,
with the run's own batches and its own per-client test data. It also prints the mean norm of
the head's input over the training samples: a plain SGD step on a linear head moves a
sample's logits by about ``lr * ||input||**2`` per unit of error, which is what decides
whether one head step overshoots.

    python examples/pfl_finetune_probe.py RUN [--steps 0,1,3,10] [--parts all,head,body]
        [--lrs 0.05,0.01]

RUN is a ``fedforge run`` output folder of a method that keeps no per-client state
(``fedbabu``, ``fedavg_ft``); the datasets are found as the run found them
(``$FEDFORGE_DATA``). Nothing is written.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from fedforge.algorithms import build_algorithm
from fedforge.algorithms.personal.split import head_names
from fedforge.core.checkpoint import load_checkpoint
from fedforge.engine import classification_loss
from fedforge.experiment.build import Setup
from fedforge.experiment.config import algorithm_kwargs, load_config
from fedforge.experiment.personal_eval import evaluate_personal

STATELESS = ("fedbabu", "fedavg_ft")


def _numbers(text: str, kind: type) -> list:
    return [kind(v) for v in text.split(",") if v.strip()]


def head_input_norm(setup: Setup, params: dict, patterns, samples: int = 1024) -> float:
    """Mean L2 norm of the head's input over the first ``samples`` training samples."""
    head = head_names(list(params), patterns)[0].rpartition(".")[0]
    norms: list[torch.Tensor] = []
    hook = setup.network.get_submodule(head).register_forward_pre_hook(
        lambda _m, args: norms.append(args[0].flatten(1).norm(dim=1)))
    try:
        setup.network.load_state_dict(params, strict=False)
        setup.network.eval()
        with torch.no_grad():
            setup.network(setup.data.train_x[:samples])
    finally:
        hook.remove()
    return float(torch.cat(norms).mean())


def probe(run: Path, steps: list[int], parts: list[str], lrs: list[float] | None = None
          ) -> list[dict]:
    """One row per (part, lr, steps): the per-client accuracy after fine-tuning; ``lrs``
    default to the run's local learning rate."""
    cfg = load_config(run / "config.resolved.toml")
    hparams = algorithm_kwargs(cfg)
    if cfg.algorithm.name not in STATELESS:
        raise SystemExit(f"{run}: algorithm.name {cfg.algorithm.name!r} keeps per-client "
                         f"state; the probe reads {', '.join(STATELESS)} runs")
    if cfg.algorithm.name == "fedavg_ft" and set(parts) != {"all"}:
        raise SystemExit("--parts: fedavg_ft fine-tunes the whole model (all)")
    setup = Setup.from_config(cfg)
    tensors, meta = load_checkpoint(run / "checkpoints")
    params = tensors["params"]
    loss_fn = classification_loss(setup.network, cfg.engine.precision)
    rows = []
    for part in parts:
        for lr in lrs or [hparams["local_lr"]]:
            for n in steps:
                hp = {**hparams, "local_lr": lr, "finetune_steps": n}
                if cfg.algorithm.name == "fedbabu":
                    hp["finetune_part"] = part
                algorithm = build_algorithm(cfg.algorithm.name, **hp)
                got = evaluate_personal(
                    setup.network, algorithm, loss_fn, params, lambda _ids: {},
                    setup.client_tests, setup.data.train_x, setup.data.train_y,
                    held_out_steps=0, batch_size=cfg.eval.batch_size,
                    train_batch_size=cfg.client.batch_size, seed=cfg.seed, round_=meta["round"])
                rows.append({"part": part, "lr": lr, "steps": n, **got})
    patterns = build_algorithm(cfg.algorithm.name, **hparams).personal.head
    print(f"{run}: round {meta['round']}, mean norm of the head's input "
          f"{head_input_norm(setup, params, patterns):.2f}")
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path)
    parser.add_argument("--steps", default="0,1,3,10")
    parser.add_argument("--parts", default="all,head,body")
    parser.add_argument("--lrs", default=None, help="default: the run's local learning rate")
    args = parser.parse_args(argv)
    lrs = _numbers(args.lrs, float) if args.lrs else None
    rows = probe(args.run, _numbers(args.steps, int), _numbers(args.parts, str), lrs)
    print("| part | lr | steps | personal mean | weighted | p10 | worst | global mean |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['part']} | {r['lr']:g} | {r['steps']} | {r['personal_accuracy_mean']:.4f} "
              f"| {r['personal_accuracy_weighted']:.4f} | {r['personal_accuracy_p10']:.4f} "
              f"| {r['personal_accuracy_worst']:.4f} | {r['global_accuracy_mean']:.4f} |")


if __name__ == "__main__":
    main(sys.argv[1:])
