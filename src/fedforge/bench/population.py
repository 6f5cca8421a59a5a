"""``fedforge bench population``: what a run costs as the population grows to 10^6 clients.

Each configuration (population size, algorithm, client store) is one short run of procedural
``synthetic_population`` data, cohort 1000 by default, with SCAFFOLD and FAdamGC (per-client
state as large as the model, or twice) on an MLP of 54,410 parameters. Each runs in a fresh
subprocess, so its peak resident memory is its own. A row reports the peak RSS, the bytes of
its run folder, the seconds per round (rounds after the first, before the evaluated last) and
the seconds of its checkpoint. The in-memory client store runs beside the disk store wherever
the clients' state fits in half the machine's memory.

The child is ``python -m fedforge.bench.population CONFIG OUT``; it prints one JSON line.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Annotated

import torch
import typer

from fedforge.bench.options import Out, Results, folders
from fedforge.bench.results import record_results, run_info
from fedforge.experiment.rundir import save_figure, subfolder, write_text
from fedforge.study.styles import style_for

HEADER = ["clients", "algorithm", "store", "peak RSS MB", "run folder MB", "s / round",
          "checkpoint s", "note"]
DIM, CLASSES, HIDDEN = 60, 10, (200, 200)  # mlp on Synthetic's 60 features: 54,410 params


@dataclass(frozen=True)
class PopulationBench:
    """What ``fedforge bench population`` runs."""

    populations: tuple[int, ...] = (1_000, 10_000, 100_000, 1_000_000)
    cohort: int = 1000
    rounds: int = 5
    algorithms: tuple[str, ...] = ("scaffold", "fadamgc")
    stores: tuple[str, ...] = ("disk", "memory")
    local_steps: int = 5
    batch_size: int = 10
    max_samples: int = 200  # per client: a cohort's data stays small whatever the tail
    timeout_s: float = 3600.0


QUICK = PopulationBench(populations=(100, 1_000), cohort=10, rounds=3, local_steps=1,
                        timeout_s=300.0)
"""A smoke run: two small populations, cohort 10, three rounds of one local step."""


def run_config(n: int, algorithm: str, store: str, bench: PopulationBench) -> str:
    """The TOML of one configuration."""
    return f"""name = "population-{n}-{algorithm}-{store}"
seed = 0
rounds = {bench.rounds}

[data]
dataset = "synthetic_population"
options = {{ num_clients = {n}, max_samples_per_client = {bench.max_samples} }}

[model]
name = "mlp"
options = {{ hidden = {list(HIDDEN)} }}

[algorithm]
name = "{algorithm}"
local_lr = 0.01

[client]
batch_size = {bench.batch_size}
local_steps = {bench.local_steps}

[server]
clients_per_round = {bench.cohort}

[eval]
every = {bench.rounds}
clients = {min(bench.cohort, n)}

[checkpoint]
every = {bench.rounds}
keep = 1

[engine]
name = "vmap"
client_store = "{store}"
"""


def state_bytes(algorithm: str, n: int) -> int:
    """Bytes of every client's persistent state held in memory (the memory store)."""
    from fedforge.algorithms import build_algorithm  # noqa: PLC0415
    from fedforge.models import build_model  # noqa: PLC0415

    params = dict(build_model("mlp", (DIM,), CLASSES, hidden=HIDDEN).named_parameters())
    init = build_algorithm(algorithm, local_lr=0.01).client_init(
        {k: v.detach() for k, v in params.items()})

    def nbytes(tree) -> int:
        if isinstance(tree, dict):
            return sum(nbytes(v) for v in tree.values())
        return tree.numel() * tree.element_size() if isinstance(tree, torch.Tensor) else 0

    return n * nbytes(init)


def memory_fits(nbytes: int) -> bool:
    """Whether ``nbytes`` fit in half of this machine's physical memory."""
    try:
        total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        return False
    return nbytes <= total // 2


def folder_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file()
               and not p.is_symlink())


def run_one(config: Path, out: Path, timeout_s: float) -> dict:
    """Run one configuration in a fresh interpreter -> its child's JSON line (or an error)."""
    cmd = [sys.executable, "-m", "fedforge.bench.population", str(config), str(out)]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s,
                              check=False)
    except subprocess.TimeoutExpired:
        return {"error": f"over {timeout_s:.0f} s"}
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    if done.returncode != 0 or not lines:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return {"error": tail[:160]}
    return json.loads(lines[-1])


def run_population(bench: PopulationBench, out: Path) -> list[list[object]]:
    """Every configuration of ``bench``, each in its own process -> table rows."""
    rows: list[list[object]] = []
    for n in bench.populations:
        for alg in bench.algorithms:
            for store in bench.stores:
                if store == "memory" and not memory_fits(state_bytes(alg, n)):
                    rows.append([n, alg, store, None, None, None, None,
                                 f"state {state_bytes(alg, n) / 2**30:.0f} GiB: does not fit"])
                    continue
                name = f"{n}-{alg}-{store}"
                config = write_text(subfolder(out, "configs"), f"{name}.toml",
                                    run_config(n, alg, store, bench))
                res = run_one(config, out / "runs" / name, bench.timeout_s)
                if "error" in res:
                    rows.append([n, alg, store, None, None, None, None, res["error"]])
                    continue
                rows.append([n, alg, store, round(res["peak_rss_mb"], 1),
                             round(folder_bytes(out / "runs" / name) / 2**20, 2),
                             res["seconds_per_round"], res["checkpoint_s"], ""])
    return rows


def plot_population(rows: list[list[object]], out: Path) -> Path:
    """Peak RSS, run-folder size and seconds per round against the population, one line
    per algorithm (its style) and store (solid: disk, dashed: memory)."""
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    panels = [(3, "peak RSS (MB)"), (4, "run folder (MB)"), (5, "seconds / round")]
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.6))
    for ax, (col, label) in zip(axes, panels, strict=True):
        for alg, store in dict.fromkeys((r[1], r[2]) for r in rows):
            pts = sorted((r[0], r[col]) for r in rows
                         if r[1] == alg and r[2] == store and r[col] is not None)
            if not pts:
                continue
            st = style_for(str(alg))
            ax.plot([p[0] for p in pts], [p[1] for p in pts], color=st.color, marker=st.marker,
                    linestyle="-" if store == "disk" else "--", label=f"{alg}, {store} store")
        ax.set_xscale("log")
        ax.set_xlabel("clients")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    try:
        return save_figure(out, "population.png", fig, dpi=120)
    finally:
        plt.close(fig)


def title(bench: PopulationBench) -> str:
    """The table's title: the cohort, the rounds and the model."""
    return (f"Population: cohort {bench.cohort}, {bench.rounds} rounds, mlp "
            f"{'x'.join(map(str, HIDDEN))}")


def _child(config: str, out: str) -> None:
    """Run one configuration and print its peak RSS, seconds per round, checkpoint seconds."""
    from fedforge.experiment import runner  # noqa: PLC0415
    from fedforge.experiment.config import load_config  # noqa: PLC0415

    spent: list[float] = []
    save = runner.checkpoint

    def timed(driver) -> None:
        t0 = time.perf_counter()
        save(driver)
        spent.append(time.perf_counter() - t0)

    runner.checkpoint = timed
    records = runner.run_experiment(load_config(config), out, progress=False, overwrite=True)
    walls = [r["wall_s"] for r in records]
    steps = [b - a for a, b in zip(walls[:-1], walls[1:], strict=False)][:-1] or [walls[0]]
    steps.sort()
    print(json.dumps({
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "seconds_per_round": round(steps[len(steps) // 2], 3),
        "checkpoint_s": round(sum(spent) / max(len(spent), 1), 3)}), flush=True)


def quick_or_full(quick: bool, populations: str | None, cohort: int | None,
                  rounds: int | None) -> PopulationBench:
    """The bench the command asks for: ``--quick`` or the full one, with its overrides."""
    bench = QUICK if quick else PopulationBench()
    if populations:
        bench = replace(bench, populations=tuple(int(float(p)) for p in populations.split(",")))
    if cohort is not None:
        bench = replace(bench, cohort=cohort)
    if rounds is not None:
        if rounds < 3:
            raise ValueError("--rounds: at least 3 (the first warms up, the last evaluates)")
        bench = replace(bench, rounds=rounds)
    if bench.cohort > min(bench.populations):
        raise ValueError(f"--cohort: {bench.cohort} is more than the smallest population "
                         f"({min(bench.populations)})")
    return bench



# ------------------------------------------------------------ fedforge bench population

Populations = Annotated[str | None, typer.Option(
    help="comma-separated client counts (default 1000,10000,100000,1000000)")]
Cohort = Annotated[int | None, typer.Option(help="clients per round (default 1000)", min=1)]
Rounds = Annotated[int | None, typer.Option(
    help="rounds per configuration (default 5)", min=3)]
Quick = Annotated[bool, typer.Option(
    "--quick", help="10^2 and 10^3 clients, cohort 10, 3 rounds (a smoke run)")]


def population(populations: Populations = None, cohort: Cohort = None, rounds: Rounds = None,
               quick: Quick = False, out: Out = "runs/bench_population",
               results: Results = None) -> str:
    """Memory, disk and time per round from 10^3 to 10^6 clients."""
    folder, results = folders(out, results)
    load_before = os.getloadavg()
    bench = quick_or_full(quick, populations, cohort, rounds)
    rows = run_population(bench, folder)
    plot_population(rows, folder)
    text = record_results(results, "population", "quick" if quick else None, title(bench),
                          HEADER, rows, run_info("cpu", load_before))
    write_text(folder, "population.md", text)
    return text


if __name__ == "__main__":
    _child(sys.argv[1], sys.argv[2])
