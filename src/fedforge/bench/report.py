"""Appending a benchmark table to ``benchmarks/RESULTS.md`` with what it ran on."""

from __future__ import annotations

import datetime as dt
import platform
import sys
from pathlib import Path

import torch

from fedforge.experiment.rundir import append_text, save_figure


def machine_line(device: torch.device) -> str:
    """e.g. ``x86_64, 2 threads, AMX`` or the CUDA device name."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    flags = ""
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text()
        flags = ", AMX" if "amx_bf16" in cpuinfo else ""
    except OSError:
        pass
    return f"{platform.machine()} CPU, {torch.get_num_threads()} threads{flags}"


def default_results(folder: Path) -> Path:
    """Where a bench appends its table when ``--results`` is not given: the checkout's
    ``benchmarks/RESULTS.md`` when the command runs from the root of the fedforge checkout it
    is installed from, else ``RESULTS.md`` in the bench's own folder ``folder`` (``--out``).
    Run anywhere else, a bench never appends to a file of the current folder it does not
    own."""
    repo = Path(__file__).resolve().parents[3]  # src/fedforge/bench/report.py
    if (repo / "benchmarks" / "RESULTS.md").is_file() and Path.cwd().resolve() == repo:
        return Path("benchmarks") / "RESULTS.md"
    return folder / "RESULTS.md"


def command_line() -> str:
    """The command line that is running, as a table records it: ``fedforge bench ...`` or
    ``python SCRIPT ...``."""
    program = sys.argv[0]
    words = (["fedforge"] if program.endswith("fedforge")
             else ["python", Path(program).name])
    return " ".join(words + sys.argv[1:]).replace("  ", " ").strip()


def append_results(path: str | Path, title: str, device: torch.device, header: list[str],
                   rows: list[list[object]], note: str = "", command: str | None = None) -> str:
    """Append ``### title · date · machine · torch · command`` and a markdown table.
    ``command``: the line that reproduces the table, when ``sys.argv`` does not show it
    (``python -m`` modules)."""
    cmd = command or command_line()
    lines = [f"\n### {title} · {dt.date.today().isoformat()} · {machine_line(device)} · "
             f"torch {torch.__version__}\n", f"\nCommand: `{cmd.strip()}`\n",
             "\n| " + " | ".join(header) + " |\n", "|" + "---|" * len(header) + "\n"]
    lines += ["| " + " | ".join(_fmt(v) for v in row) + " |\n" for row in rows]
    if note:
        lines.append(f"\n{note}\n")
    text = "".join(lines)
    path = Path(path)
    append_text(path.parent, path.name, text)
    return text


def _fmt(v: object) -> str:
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
