"""Golden metrics: every registered algorithm on two small tasks, recorded once.

``python -m tests.golden.golden`` rewrites ``golden_metrics.json``; ``test_golden.py`` re-runs
the same runs and requires identical numbers. A change to the round's plumbing must leave
every record untouched; a change that moves a number is explained in the commit that
re-records the file. Wall-clock fields are dropped.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import torch

from fedforge.algorithms import ALGORITHMS, build_algorithm
from fedforge.experiment.config import load_config
from fedforge.experiment.runner import run_experiment
from fedforge.study.labels import without_wall_clock
from tests.data_location import TEST_DATA

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = Path(__file__).with_name("golden_metrics.json")
DATA = TEST_DATA

TASKS: dict[str, list[str]] = {
    "quickstart": ["rounds=6", "eval.every=2", "checkpoint.every=100"],
    "mnist_cnn": [
        "rounds=3", "eval.every=3", "checkpoint.every=100", f"data.root={DATA}",
        "model.name=lenet5", "data.num_clients=20", "server.clients_per_round=4",
        "client.local_steps=3", "client.batch_size=16", "data.partition_options.alpha=0.3",
    ],
}
CONFIGS = {"quickstart": "examples/quickstart.toml", "mnist_cnn": "examples/mnist_dirichlet.toml"}
CLIENTS = {"quickstart": 30, "mnist_cnn": 20}  # each task's population


def algorithm_names() -> list[str]:
    """Every registered algorithm, aliases included only once (by factory)."""
    seen, names = set(), []
    for name, factory in sorted(ALGORITHMS.items()):
        if id(factory) not in seen:
            seen.add(id(factory))
            names.append(name)
    return names


GOLDEN_THREADS = 2
"""Intra-op threads of every golden run: a CPU reduction's rounding depends on how many threads
split it, so the recorded numbers hold for this count (the 2-core machine they were taken on)
whatever the machine or ``OMP_NUM_THREADS``."""


def golden_run(task: str, algorithm: str) -> list[dict]:
    overrides = [*TASKS[task], *participation(task, algorithm), f"algorithm.name={algorithm}"]
    cfg = load_config(ROOT / CONFIGS[task], overrides)
    threads = torch.get_num_threads()
    torch.set_num_threads(GOLDEN_THREADS)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            records = run_experiment(cfg, Path(tmp) / "run", progress=False)
    finally:
        torch.set_num_threads(threads)
    return [without_wall_clock(r) for r in records]


def participation(task: str, algorithm: str) -> list[str]:
    """Every client every round for an algorithm whose maths needs it (MARINA)."""
    if "full_participation" not in build_algorithm(algorithm).requires:
        return []
    return [f"server.clients_per_round={CLIENTS[task]}"]


def record() -> dict:
    out: dict = {}
    for task in TASKS:
        if task == "mnist_cnn" and not (DATA / "mnist").is_dir():
            continue
        out[task] = {name: golden_run(task, name) for name in algorithm_names()}
        print(task, "done", flush=True)
    return out


if __name__ == "__main__":
    GOLDEN.write_text(json.dumps(record(), indent=1, sort_keys=True) + "\n")
    print("wrote", GOLDEN)
