"""What a benchmark table shows: its cells, the machine line, the command, where its record
goes, and the W1 scaling figure."""

from __future__ import annotations

import platform
import sys
from pathlib import Path

import torch

from fedforge.core.machine import read_cpu
from fedforge.experiment.rundir import save_figure


def machine_line(device: torch.device) -> str:
    """e.g. ``x86_64 CPU, 2 threads, AMX`` or the CUDA device name."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    amx = ", AMX" if read_cpu().features["amx_bf16"] else ""
    return f"{platform.machine()} CPU, {torch.get_num_threads()} threads{amx}"


def checkout_results() -> Path | None:
    """``benchmarks/results`` of the fedforge checkout this package is installed from, as a
    path relative to the current folder, when the command runs from the checkout's root;
    else ``None``."""
    repo = Path(__file__).resolve().parents[3]  # src/fedforge/bench/report.py
    if (repo / "benchmarks" / "results").is_dir() and Path.cwd().resolve() == repo:
        return Path("benchmarks") / "results"
    return None


def default_results(folder: Path) -> Path:
    """The folder a bench writes its result record to when ``--results`` is not given: the
    checkout's ``benchmarks/results`` when the command runs from the root of the fedforge
    checkout it is installed from, else ``results`` in the bench's own folder ``folder``
    (``--out``). Run anywhere else, a bench never writes to a folder it does not own."""
    return checkout_results() or folder / "results"


def command_line() -> str:
    """The command line that is running, as a table records it: ``fedforge bench ...`` or
    ``python SCRIPT ...``; ``python -m fedforge`` is the same command as ``fedforge``."""
    program = Path(sys.argv[0])
    is_fedforge = program.name == "fedforge" or (
        program.name == "__main__.py" and program.parent.name == "fedforge")
    words = ["fedforge"] if is_fedforge else ["python", program.name]
    return " ".join(words + sys.argv[1:]).replace("  ", " ").strip()


def cell(v: object) -> str:
    """A table cell: floats to three significant places (one decimal from 10 up)."""
    if isinstance(v, float):
        return f"{v:.1f}" if abs(v) >= 10 else f"{v:.2f}"
    return "" if v is None else str(v)


def plot_scaling(rows: list[list[object]], path: str | Path, title: str) -> None:
    """Client updates/s vs cohort size, one line per engine (rows from ``run_w1``)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for engine in dict.fromkeys(r[0] for r in rows):
        pts = sorted((r[1], r[2]) for r in rows if r[0] == engine)
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=engine)
    ax.set_xscale("log")
    ax.set_xlabel("cohort size (clients per round)")
    ax.set_ylabel("client updates / s")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path = Path(path)
    try:
        save_figure(path.parent, path.name, fig, dpi=120)
    finally:
        plt.close(fig)
