"""Run every (condition, seed) of a reproduction, resuming what already exists.

Runs go to ``<runs>/<name>/<condition>/seed<k>``; a finished run is skipped, an unfinished one
resumes from its last checkpoint, and a run with no folder whose metrics are already committed
in ``<data>`` complete is skipped too (a fresh clone does not redo the grid). Each finished
run's ``metrics.jsonl`` is copied to ``<data>/<name>/<condition>/seed<k>.jsonl``, the file the
report reads. A multi-task spec
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
from fedforge.robust.divergence import log_event


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


def committed(data: Path, spec: Reproduction, cond: str, cfg: RunConfig) -> bool:
    """The run's committed metrics in ``data`` are complete: a new machine (no run folders)
    reports from them instead of running the grid again."""
    if spec.multitask:
        return summary_path(data, spec, cond, cfg.seed).is_file()
    if diverged_path(data, spec, cond, cfg.seed).is_file():
        return True
    records = read_metrics(data_path(data, spec, cond, cfg.seed))
    return bool(records) and records[-1].get("round") == cfg.rounds


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


def diverged_path(data: Path, spec: Reproduction, cond: str, seed: int) -> Path:
    return data / spec.name / cond / f"seed{seed}.diverged.json"


def divergence_stop(run_dir: Path) -> dict | None:
    """The event that stopped a run for non-finite values (``divergence = "stop"``), if any."""
    events = read_metrics(run_dir / "divergence.jsonl")
    return next((e for e in reversed(events) if e.get("policy") == "stop"), None)


def _capacity(cfg: RunConfig) -> int:
    from fedforge.sim.population import Population

    return Population.build(cfg.system.num_clients, available_fraction=
                            cfg.system.available_fraction).max_busy


def run_grid(
    spec: Reproduction, *, root: Path, runs: Path, data: Path, progress: bool = True,
    log: Callable[[str], None] = print,
) -> dict[str, int]:
    """Run what is missing; -> counts ``{"skipped", "ran", "diverged", "total"}``.

    A run stopped by non-finite values is an outcome, not a failure of the grid: its metrics
    up to the divergence are kept, ``seed<k>.diverged.json`` records the round, and the grid
    goes on (rerunning it would diverge again: every run is deterministic)."""
    counts = {"skipped": 0, "ran": 0, "diverged": 0, "total": 0}
    plan = grid_plan(spec, root, runs)
    from_data = [not out.exists() and committed(data, spec, cond.name, cfg)
                 for cond, cfg, out in plan]
    finished = [known or is_finished(out, cfg.rounds, spec.multitask)
                or divergence_stop(out) is not None
                for known, (_, cfg, out) in zip(from_data, plan)]
    if spec.prepare is not None and not all(finished):  # nothing to run, nothing to prepare
        spec.prepare(root)
    for (cond, cfg, out), known, done in zip(plan, from_data, finished):
        counts["total"] += 1
        dest = data_path(data, spec, cond.name, cfg.seed)
        if known:
            counts["skipped"] += 1
            continue
        if done:
            counts["skipped"] += 1
        else:
            log(f"[reproduce {spec.name}] {cond.name} seed {cfg.seed} -> {out}")
            try:
                run_experiment(cfg, out, resume=out.exists(), progress=progress)
            except FloatingPointError as err:  # DivergenceError or a non-finite loss
                log(f"[reproduce {spec.name}] {cond.name} seed {cfg.seed} diverged: {err}")
                if divergence_stop(out) is None:  # the loss check stops without an event
                    done = read_metrics(out / "metrics.jsonl")
                    log_event(out, {"round": done[-1]["round"] + 1 if done else 1,
                                    "policy": "stop", "faults": [], "action": str(err)})
            counts["ran"] += 1
        dest.parent.mkdir(parents=True, exist_ok=True)
        stop = divergence_stop(out)
        marker = diverged_path(data, spec, cond.name, cfg.seed)
        if stop is not None:
            counts["diverged"] += 1
            marker.write_text(json.dumps({"round": stop["round"], "budget": cfg.rounds}),
                              encoding="utf-8")
        elif marker.exists():
            marker.unlink()
        if not (out / "metrics.jsonl").is_file():  # diverged before its first record
            (out / "metrics.jsonl").touch()
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
