"""Run every (condition, seed) of a reproduction, resuming what already exists.

Runs go to ``<runs>/<name>/<condition>/seed<k>``; a finished run is skipped, an unfinished one
resumes from its last checkpoint. Each finished run's ``metrics.jsonl`` is copied to
``<data>/<name>/<condition>/seed<k>.jsonl``, the file the report reads. A multi-task spec
(``spec.multitask``: a config with ``[[tasks]]``, ``Condition.algorithm`` names the method)
also writes ``seed<k>.summary.json``: the run's ``summary.json`` (time to target per task and
overall) plus the share of available client time left idle (``fedforge.sim.diagnostics``).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

from fedforge.experiment.compare import comparison_configs
from fedforge.experiment.config import RunConfig, load_config
from fedforge.experiment.runner import run_experiment
from fedforge.reproduce.spec import Condition, Reproduction


def condition_configs(spec: Reproduction, cond: Condition, root: Path) -> list[RunConfig]:
    """One config per seed: the file, its ``[compare.<algorithm>]`` table, the overrides."""
    path = root / (cond.config or spec.config)
    overrides = [*spec.overrides, *cond.overrides]
    if spec.multitask:  # the condition's algorithm is the multi-task method
        base = load_config(path, [f"method={cond.algorithm}", *overrides])
        return [base.model_copy(update={"seed": s}) for s in spec.seeds]
    return comparison_configs(path, [cond.algorithm], overrides, list(spec.seeds))[cond.algorithm]


def read_metrics(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    lines = path.read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def is_finished(run_dir: Path, rounds: int, multitask: bool = False) -> bool:
    """The run's metrics reach its last round (the runner evaluates the last round); a
    multi-task run has written its ``summary.json``."""
    if multitask:
        return (run_dir / "summary.json").is_file()
    records = read_metrics(run_dir / "metrics.jsonl")
    return bool(records) and records[-1].get("round") == rounds


def grid_plan(
    spec: Reproduction, root: Path, runs: Path
) -> list[tuple[Condition, RunConfig, Path]]:
    """``(condition, config, run folder)`` in execution order: stage after stage (the spec's
    ``stages``, then the conditions in none), every seed of a stage before the next, so a
    stopped grid holds whole seeds of the claim's core (paired comparisons need them)."""
    per_cond = {c.name: condition_configs(spec, c, root) for c in spec.conditions}
    staged = [n for stage in spec.stages for n in stage]
    stages = [[spec.condition(n) for n in stage] for stage in spec.stages]
    stages.append([c for c in spec.conditions if c.name not in staged])
    plan = []
    for stage in stages:
        for i, seed in enumerate(spec.seeds):
            for cond in stage:
                out = runs / spec.name / cond.name / f"seed{seed}"
                plan.append((cond, per_cond[cond.name][i], out))
    return plan


def data_path(data: Path, spec: Reproduction, cond: str, seed: int) -> Path:
    return data / spec.name / cond / f"seed{seed}.jsonl"


def summary_path(data: Path, spec: Reproduction, cond: str, seed: int) -> Path:
    return data / spec.name / cond / f"seed{seed}.summary.json"


def _capacity(cfg: RunConfig) -> int:
    from fedforge.sim.population import Population

    return Population.build(cfg.system.num_clients, available_fraction=
                            cfg.system.available_fraction).max_busy


def run_grid(
    spec: Reproduction, *, root: Path, runs: Path, data: Path, progress: bool = True,
    log: Callable[[str], None] = print,
) -> dict[str, int]:
    """Run what is missing; -> counts ``{"skipped", "ran", "total"}``."""
    counts = {"skipped": 0, "ran": 0, "total": 0}
    for cond, cfg, out in grid_plan(spec, root, runs):
        counts["total"] += 1
        dest = data_path(data, spec, cond.name, cfg.seed)
        if is_finished(out, cfg.rounds, spec.multitask):
            counts["skipped"] += 1
        else:
            log(f"[reproduce {spec.name}] {cond.name} seed {cfg.seed} -> {out}")
            run_experiment(cfg, out, resume=out.exists(), progress=progress)
            counts["ran"] += 1
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(out / "metrics.jsonl", dest)
        if spec.multitask:
            from fedforge.sim.diagnostics import run_diagnostics

            summary = run_diagnostics(out, _capacity(cfg))
            summary.pop("allocation_log", None)  # in the run folder; long
            summary_path(data, spec, cond.name, cfg.seed).write_text(
                json.dumps(summary, indent=1), encoding="utf-8")
    return counts


def run_dirs(spec: Reproduction, runs: Path) -> list[Path]:
    return [runs / spec.name / c.name / f"seed{s}" for s in spec.seeds for c in spec.conditions]
