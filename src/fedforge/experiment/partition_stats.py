"""How a run's data is split: client sizes and the label-by-client counts (``partition.json``).

Written once at the start of every run, so the heterogeneity a result was measured under is
kept beside the result (and drawn by ``fedforge report``). Next-token tasks (the label space
is the vocabulary) keep the sizes only: a histogram over thousands of tokens per client says
little and is large.
"""

from __future__ import annotations

import json
import os
import statistics
from pathlib import Path

from fedforge.data import FederatedDataset

FILE = "partition.json"


def partition_stats(data: FederatedDataset) -> dict:
    """``{dataset, num_clients, num_classes, sizes, label_counts | None, client_names}``."""
    sizes = [int(s) for s in data.client_sizes().cpu().tolist()]
    next_token = data.vocab_size is not None and data.num_classes == data.vocab_size
    counts = None
    if not next_token and data.train_y.dim() == 1:
        counts = data.label_counts().cpu().tolist()
    return {"dataset": data.name, "num_clients": data.num_clients,
            "num_classes": data.num_classes, "sizes": sizes, "label_counts": counts,
            "client_names": data.client_names}


def save_partition_stats(data: FederatedDataset, out: Path) -> Path:
    """Write :func:`partition_stats` to ``out/partition.json`` atomically (replaced, never
    written through, so a planted link is not followed) -> the path."""
    path = Path(out) / FILE
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(partition_stats(data)) + "\n", encoding="utf-8")
    os.replace(tmp, path)
    return path


def load_partition_stats(run_dir: Path) -> dict | None:
    """The run's ``partition.json`` (None if it has none: a run from before it was written)."""
    path = Path(run_dir) / FILE
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise ValueError(f"{path}: not valid JSON ({exc})") from None


def partition_summary(stats: dict) -> str:
    """``30 clients, 4587 training samples; per client: min 41, median 77, max 937``."""
    sizes = stats["sizes"]
    if not sizes:
        return "no clients"
    return (f"{stats['num_clients']} clients, {sum(sizes)} training samples; per client: "
            f"min {min(sizes)}, median {statistics.median(sizes):g}, max {max(sizes)}")
