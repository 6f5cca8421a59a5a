"""``fedforge pretrain``: ordinary centralised training that a federated run can start from.

Fine-tuning regimes (SAFL's BERT-on-SST-2, ViT-on-CIFAR-10) start from a model trained on
other data. Offline, the "other data" is a disjoint part of a dataset the loaders already read:
by default the ``public`` part of the training set (``data.options.train_part``, see
:mod:`fedforge.data.subsets`) while the federated run trains on the ``private`` part. The
model and dataset come from the same run config, so the weights fit ``model.init_from``.

Writes ``OUT/model.safetensors`` (the parameters) and ``OUT/pretrain.json`` (settings, loss
per epoch, test accuracy); refuses an ``OUT`` that already holds them.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Literal, get_args

import torch
import torch.nn.functional as F

from fedforge.data import load_dataset
from fedforge.engine.evaluate import evaluate
from fedforge.experiment.config import RunConfig
from fedforge.experiment.rundir import write_bytes, write_text
from fedforge.models import build_model, num_parameters

WEIGHTS, SUMMARY = "model.safetensors", "pretrain.json"
Part = Literal["public", "private", "all"]


def pretrain(cfg: RunConfig, out: str | Path, *, part: Part = "public", epochs: int = 1,
             lr: float = 1e-3, batch_size: int = 64, optimizer: str = "adam",
             max_steps: int | None = None) -> dict:
    """Train ``cfg``'s model centrally on ``part`` of ``cfg``'s training set -> the summary.

    ``part="all"`` keeps the config's data options as they are (for pretraining on another
    dataset named in the config). ``model.init_from`` is ignored: the fine-tuning config that
    names this run's output can be pretrained from as it is.
    """
    if part not in get_args(Part):
        raise ValueError(f"--part: expected public, private or all, got {part!r}")
    if epochs < 1 or batch_size < 1 or lr <= 0:
        raise ValueError(f"pretrain: need epochs >= 1, batch_size >= 1 and lr > 0, got "
                         f"{epochs}, {batch_size}, {lr}")
    if optimizer not in ("adam", "sgd"):
        raise ValueError(f"pretrain --optimizer: expected 'adam' or 'sgd', got {optimizer!r}")
    out = Path(out)
    for name in (WEIGHTS, SUMMARY):
        if (out / name).exists() or (out / name).is_symlink():  # a dangling link too
            raise FileExistsError(f"{out / name}: already exists; choose another --out")
    options = dict(cfg.data.options)
    if part != "all":
        options["train_part"] = part
    splits = load_dataset(cfg.data.dataset, cfg.data.root, **options)
    torch.manual_seed(cfg.seed)
    net = build_model(cfg.model.name, splits.input_shape, splits.num_classes,
                      **cfg.model.options)
    opt = (torch.optim.Adam(net.parameters(), lr=lr) if optimizer == "adam"
           else torch.optim.SGD(net.parameters(), lr=lr, momentum=0.9))
    x, y = splits.train_x, splits.train_y
    gen = torch.Generator().manual_seed(cfg.seed)
    losses, steps, t0 = [], 0, time.perf_counter()
    for _ in range(epochs):
        order, total, count = torch.randperm(len(y), generator=gen), 0.0, 0
        for start in range(0, len(y), batch_size):
            idx = order[start: start + batch_size]
            loss = F.cross_entropy(net(x[idx]), y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
            total, count, steps = total + loss.item() * len(idx), count + len(idx), steps + 1
            if max_steps is not None and steps >= max_steps:
                break
        losses.append(total / max(count, 1))
        if max_steps is not None and steps >= max_steps:
            break
    params = {k: v.detach() for k, v in net.named_parameters()}
    summary = {
        "dataset": cfg.data.dataset, "data_options": options, "model": cfg.model.name,
        "model_options": cfg.model.options, "parameters": num_parameters(net),
        "train_samples": len(y), "epochs": len(losses), "steps": steps, "lr": lr,
        "batch_size": batch_size, "optimizer": optimizer, "seed": cfg.seed,
        "train_loss": losses, "wall_s": round(time.perf_counter() - t0, 3),
        **evaluate(net, params, splits.test_x, splits.test_y),
    }
    from safetensors.torch import save  # noqa: PLC0415

    write_bytes(out, WEIGHTS, save({k: v.contiguous() for k, v in params.items()}))
    write_text(out, SUMMARY, json.dumps(summary, indent=2) + "\n")
    return summary


def summary_line(summary: dict, out: str | Path) -> str:
    """What ``fedforge pretrain`` prints when it is done."""
    return (f"pretrained {summary['model']} on {summary['train_samples']} samples: "
            f"test_accuracy={summary['test_accuracy']:.4f} -> {out}")
