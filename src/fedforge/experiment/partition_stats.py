"""How a run's data is split: client sizes and the label-by-client counts.

Written once at the start of every run, so the heterogeneity a result was measured under is
kept beside the result (and drawn by ``fedforge report``). The per-client numbers are arrays
in ``partition.npz`` (``sizes`` int64 ``[N]``, ``label_counts`` int32 ``[N, classes]`` when
kept); ``partition.json`` is a small summary that names the arrays file. Next-token tasks (the
label space is the vocabulary) and populations generated when drawn keep the sizes only: a
histogram over thousands of tokens per client says little, and counting a population's labels
would generate every client. Run folders written before the arrays (sizes and counts as JSON
lists in ``partition.json``) load the same.
"""

from __future__ import annotations

import io
import json
import zipfile
from pathlib import Path

import numpy as np

from fedforge.experiment.rundir import PARTITION_ARRAYS, PARTITION_NAME, write_bytes, write_text

FILE = PARTITION_NAME
ARRAYS = PARTITION_ARRAYS


def partition_arrays(data) -> dict[str, np.ndarray]:
    """``{sizes: int64 [N], label_counts: int32 [N, classes]}`` (no counts where not kept)."""
    out = {"sizes": data.client_sizes().cpu().numpy().astype(np.int64)}
    next_token = data.vocab_size is not None and data.num_classes == data.vocab_size
    if not next_token and data.train_y.dim() == 1:
        counts = data.label_counts()
        if counts is not None:
            out["label_counts"] = counts.cpu().numpy().astype(np.int32)
    return out


def _summary(sizes: np.ndarray) -> dict:
    if sizes.size == 0:
        return {"total": 0, "min": 0, "median": 0, "max": 0}
    return {"total": int(sizes.sum()), "min": int(sizes.min()),
            "median": float(np.median(sizes)), "max": int(sizes.max())}


def partition_stats(data) -> dict:
    """``{dataset, num_clients, num_classes, sizes, label_counts | None, client_names}``,
    the per-client numbers as lists (what :func:`load_partition_stats` returns)."""
    arrays = partition_arrays(data)
    counts = arrays.get("label_counts")
    return {"dataset": data.name, "num_clients": data.num_clients,
            "num_classes": data.num_classes, "sizes": arrays["sizes"].tolist(),
            "label_counts": None if counts is None else counts.tolist(),
            "client_names": data.client_names}


def save_partition_stats(data, out: Path) -> Path:
    """Write ``partition.npz`` (the arrays) and ``partition.json`` (the summary) through the
    run folder's writer (atomic, never through a link) -> the JSON's path."""
    arrays = partition_arrays(data)
    buf = io.BytesIO()
    np.savez_compressed(buf, **arrays)
    write_bytes(out, ARRAYS, buf.getvalue())
    names = data.client_names
    summary = {"dataset": data.name, "num_clients": data.num_clients,
               "num_classes": data.num_classes, "arrays": ARRAYS,
               "label_counts": "label_counts" in arrays, "sizes": _summary(arrays["sizes"]),
               "client_names": names}
    return write_text(out, FILE, json.dumps(summary) + "\n")


def load_partition_arrays(run_dir: Path) -> dict[str, np.ndarray] | None:
    """The run's per-client arrays (``sizes``, ``label_counts`` if kept), from
    ``partition.npz`` or an older ``partition.json``'s lists; None if the run has neither."""
    stats = _read_json(Path(run_dir))
    if not isinstance(stats, dict):
        return None
    if not _compact(stats):  # before the arrays file: the lists are in the JSON
        out = {"sizes": np.asarray(stats.get("sizes") or [], dtype=np.int64)}
        if stats.get("label_counts"):
            out["label_counts"] = np.asarray(stats["label_counts"], dtype=np.int64)
        return out
    run_dir = Path(run_dir)
    path = run_dir / ARRAYS
    if path.is_symlink() or not path.is_file():
        raise ValueError(f"{path}: missing or not a plain file (partition.json names it)")
    try:
        with np.load(path, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as exc:
        raise ValueError(f"{path}: not a readable .npz ({exc})") from None
    n, counts = stats.get("num_clients"), stats.get("label_counts")
    sizes = arrays.get("sizes")
    if sizes is None or sizes.ndim != 1 or not np.issubdtype(sizes.dtype, np.integer):
        raise ValueError(f"{path}: \"sizes\" must be a 1-D integer array")
    if type(n) is not int or n != len(sizes):
        raise ValueError(f"{run_dir / FILE}: \"num_clients\" must be the {len(sizes)} "
                         f"clients of {ARRAYS}")
    if type(counts) is not bool or counts != ("label_counts" in arrays):
        raise ValueError(f"{run_dir / FILE}: \"label_counts\" must say whether {ARRAYS} "
                         "holds them (true or false)")
    return arrays


def _compact(stats: dict) -> bool:
    """Whether ``partition.json`` is the summary of a ``partition.npz`` (else the older
    format, or a hand-edited file, with the per-client lists in it)."""
    return "arrays" in stats and isinstance(stats.get("sizes"), dict)


def load_partition_stats(run_dir: Path) -> dict | None:
    """The run's partition as :func:`partition_stats` gives it (lists), from either format;
    None if it has none (a run from before it was written)."""
    stats = _read_json(Path(run_dir))
    if not isinstance(stats, dict) or not _compact(stats):
        return stats  # the older format holds the lists itself (or is not an object)
    arrays = load_partition_arrays(run_dir)
    counts = arrays.get("label_counts")
    return {"dataset": stats.get("dataset"), "num_clients": stats.get("num_clients"),
            "num_classes": stats.get("num_classes"), "sizes": arrays["sizes"].tolist(),
            "label_counts": None if counts is None else counts.tolist(),
            "client_names": stats.get("client_names")}


def _read_json(run_dir: Path):
    path = run_dir / FILE
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise ValueError(f"{path}: not valid JSON ({exc})") from None


def partition_summary(stats: dict) -> str:
    """``30 clients, 4587 training samples; per client: min 41, median 77, max 937``."""
    sizes = stats["sizes"]
    if isinstance(sizes, dict):  # the summary of partition.json
        if not stats.get("num_clients"):
            return "no clients"
        return (f"{stats['num_clients']} clients, {sizes['total']} training samples; per "
                f"client: min {sizes['min']}, median {sizes['median']:g}, max {sizes['max']}")
    if not len(sizes):
        return "no clients"
    s = _summary(np.asarray(sizes, dtype=np.int64))
    return (f"{stats['num_clients']} clients, {s['total']} training samples; per client: "
            f"min {s['min']}, median {s['median']:g}, max {s['max']}")
