"""W3: wall time (and rounds) until a run first reaches a test-accuracy target.

One ``fedforge bench w3`` command runs the same config with up to three engines and gives
each a row of :data:`W3_HEADER`:

* ``fedforge``: an ordinary ``fedforge run`` of the config (its engine, checkpoints and
  metrics), stopped after its first evaluation at or above the target. Its times are the
  ``wall_s`` of ``metrics.jsonl``: the clock starts after the data are loaded and the model,
  algorithm and engine are built, and includes training, evaluation (test accuracy and loss,
  and the per-client mean when ``eval.per_client`` is on), metric records and the
  checkpoints written so far.
* ``plain``: FedAvg as a hand-written PyTorch loop (:mod:`fedforge.bench.plain_fl`).
* ``flower``: Flower's simulation engine (:mod:`fedforge.bench.flower_w3`).

The three use the same data and partition, initial model, cohorts and mini-batch order,
local SGD and sample-weighted averaging, and the same evaluation rounds. "wall s to target"
ends with the first evaluation at or above the target; "total wall s" is the engine's whole
call, data loading (and for Flower Ray's start-up) included; "final acc" is the accuracy of
the last evaluation, the one at the target when it was reached; "vs fedforge" divides the
engine's wall s to target by fedforge's.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Annotated

import typer

from fedforge.bench.options import Device, Out, Profile, Results, folders
from fedforge.bench.plain_fl import W3Result, baseline_lr, run_plain
from fedforge.bench.profiling import profiled
from fedforge.bench.results import record_results, run_info
from fedforge.experiment.build import resolve_device
from fedforge.experiment.config import RunConfig, load_config
from fedforge.experiment.metrics import evaluated
from fedforge.experiment.runner import run_experiment

W3_ENGINES = ("fedforge", "plain", "flower")
W3_HEADER = ["engine", "config", "target", "round reached", "wall s to target", "final acc",
             "total wall s", "vs fedforge"]


def first_reaching(history: list[dict], target: float) -> dict | None:
    """The first evaluated record with ``test_accuracy >= target`` (None if never)."""
    return next((r for r in evaluated(history) if r["test_accuracy"] >= target), None)


def run_w3(config: str | Path, out: str | Path, target: float = 0.8,
           overrides: list[str] | None = None) -> list[object]:
    """Row ``[config, target, round reached, wall s to target, final accuracy, total wall s]``
    of the fedforge engine alone (the run stops at the target)."""
    res = run_fedforge(load_config(config, overrides or []), out, target)
    return [Path(config).name, target, res.round, res.wall_s, res.accuracy, res.total_s]


def run_fedforge(cfg: RunConfig, out: str | Path, target: float) -> W3Result:
    """``fedforge run`` of ``cfg`` into ``out`` (overwritten), stopped at the target."""
    started = time.perf_counter()
    history = run_experiment(cfg, out, progress=False, overwrite=True, stop_at=target)
    hit = first_reaching(history, target)
    return W3Result("fedforge", hit and hit["round"], hit and hit["wall_s"],
                    evaluated(history)[-1]["test_accuracy"], history[-1]["round"],
                    time.perf_counter() - started)


def check_w3_engines(engines: list[str]) -> list[str]:
    """The engine names, or a one-line ``ValueError`` naming ``--engines``."""
    names = [e.strip() for e in engines if e.strip()]
    if not names:
        raise ValueError(f"--engines: no engine given; expected some of {', '.join(W3_ENGINES)}")
    for name in names:
        if name not in W3_ENGINES:
            raise ValueError(f"--engines: unknown w3 engine {name!r}; expected some of "
                             f"{', '.join(W3_ENGINES)}")
    if len(set(names)) != len(names):
        raise ValueError(f"--engines: an engine is named twice in {','.join(names)!r}")
    return names


def run_w3_engines(config: str | Path, engines: list[str], out: str | Path,
                   target: float = 0.8, overrides: list[str] | None = None
                   ) -> list[list[object]]:
    """Rows of :data:`W3_HEADER`, one per engine, in the order given. Engine names, a
    missing Flower and a config the baselines cannot run are refused before anything runs."""
    names = check_w3_engines(engines)
    if "flower" in names:
        from fedforge.bench.flower_w1 import check_flower  # optional dependency

        check_flower()
    cfg = load_config(config, overrides or [])
    if "flower" in names and resolve_device(cfg.engine.device).type != "cpu":
        raise ValueError("--engines: the flower row trains on the CPU only (--device cpu)")
    if {"plain", "flower"} & set(names):
        baseline_lr(cfg)
    results: list[W3Result] = []
    for name in names:
        if name == "fedforge":
            res = run_fedforge(cfg, out, target)
        elif name == "plain":
            res = run_plain(cfg, target)
        else:
            from fedforge.bench.flower_w3 import run_flower

            res = run_flower(cfg, target)
        print(f"W3 {name:8s}: round {res.round}, {_s(res.wall_s)} to {target}, accuracy "
              f"{res.accuracy:.4f} after {res.rounds_run} rounds, {res.total_s:.1f} s in all",
              flush=True)
        results.append(res)
    base = next((r.wall_s for r in results if r.engine == "fedforge"), None)
    return [[r.engine, Path(config).name, target, r.round, r.wall_s, r.accuracy, r.total_s,
             None if not base or r.wall_s is None else f"{r.wall_s / base:.2f}x"]
            for r in results]


def _s(seconds: float | None) -> str:
    return "not reached" if seconds is None else f"{seconds:.1f} s"


# ------------------------------------------------------------------- fedforge bench w3

Config = Annotated[Path, typer.Option(
    help="run config (FedAvg; every engine reads its data, model, rounds, cohorts, local "
         "work and evaluation)")]
Target = Annotated[float, typer.Option(
    help="test-accuracy target; each engine stops at its first evaluation at or above it")]
Engines = Annotated[str, typer.Option(
    help="the config as a fedforge run, as a plain PyTorch FedAvg loop and on Flower's "
         "simulation engine, each stopped at the target")]


def w3(config: Config = Path("examples/femnist_fedavg.toml"), target: Target = 0.8,
       engines: Engines = "fedforge,plain,flower", device: Device = "cpu",
       profile: Profile = False, out: Out = "runs/bench_w3", results: Results = None) -> str:
    """W3 time to accuracy: wall time of one config to a test-accuracy target, per engine."""
    folder, results = folders(out, results)
    load_before = os.getloadavg()
    with profiled(folder / "profile", "w3", enabled=profile):
        rows = run_w3_engines(config, engines.split(","), folder, target,
                              [f"engine.device={device}"])
    return record_results(results, "w3", config.stem, "W3 time to accuracy", W3_HEADER, rows,
                          run_info(device, load_before))
