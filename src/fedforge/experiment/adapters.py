"""A finished LoRA run's adapters in PEFT's format: ``<run>/adapters/global`` and, for a
personalised method, ``<run>/adapters/client_<i>`` (the client's personal model: its own
leaves over the global ones), each loadable by ``peft.PeftModel.from_pretrained(base,
folder)``."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from fedforge.core.store import StateStore
from fedforge.core.tree import Params
from fedforge.experiment.personal_eval import personal_models
from fedforge.protocol.algorithm import Algorithm

CHUNK = 64  # clients read from the store at a time


def exports_adapters(network: nn.Module) -> bool:
    """Whether ``network`` is a pretrained model trained through LoRA adapters (not one whose
    adapters are folded into its target weights, which no adapter folder can hold)."""
    return (getattr(network, "mode", None) == "lora" and hasattr(network, "export_peft")
            and not getattr(network, "fold_adapters", False))


def export_adapters(network: nn.Module, algorithm: Algorithm, params: Params,
                    store: StateStore, num_clients: int, run_dir: Path) -> Path:
    """Write the global adapter and every client's personal one; returns the folder."""
    out = Path(run_dir) / "adapters"
    network.export_peft(out / "global", params)
    if algorithm.personal is None or store.empty:
        return out
    for first in range(0, num_clients, CHUNK):
        ids = torch.arange(first, min(first + CHUNK, num_clients))
        models = personal_models(algorithm, params, store.gather(ids), len(ids))
        for row, client in enumerate(ids.tolist()):
            network.export_peft(out / f"client_{client}", {k: v[row] for k, v in models.items()})
    return out
