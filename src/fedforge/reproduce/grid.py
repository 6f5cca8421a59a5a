"""Run every (condition, seed) of a reproduction, resuming what already exists.

Runs go to ``<runs>/<name>/<condition>/seed<k>``; a finished run is skipped, an unfinished one
resumes from its last checkpoint, and a run with no folder whose metrics are already committed
in ``<data>`` complete is skipped too (a fresh clone does not redo the grid). Each finished
run's ``metrics.jsonl`` is copied to ``<data>/<name>/<condition>/seed<k>.jsonl``, the file the
report reads. A multi-task spec
(``spec.multitask``: a config with ``[[tasks]]``, ``Condition.algorithm`` names the method)
also writes ``seed<k>.summary.json``: the run's ``summary.json`` (time to target per task and
overall) plus the share of available client time left idle
(``fedforge.study.multitask_diagnostics``).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from fedforge.experiment.config import RunConfig, load_config
from fedforge.experiment.rundir import write_bytes
from fedforge.experiment.runner import run_experiment
from fedforge.experiment.seed_batch import batch_refusal, train_seeds
from fedforge.reproduce.spec import Condition, Reproduction
from fedforge.robust.divergence import log_event
from fedforge.study.compare import comparison_configs
from fedforge.study.plots import read_metrics as read_records


def condition_configs(spec: Reproduction, cond: Condition, root: Path) -> list[RunConfig]:
    """One config per seed: the file, its ``[compare.<algorithm>]`` table, the overrides."""
    path = root / (cond.config or spec.config)
    overrides = [*spec.overrides, *cond.overrides]
    if spec.multitask:  # the condition's algorithm is the multi-task method
        base = load_config(path, [f"method={cond.algorithm}", *overrides])
        return [base.model_copy(update={"seed": s}) for s in spec.seeds]
    return comparison_configs(path, [cond.algorithm], overrides, list(spec.seeds))[cond.algorithm]


def read_metrics(path: Path) -> list[dict]:
    """The JSON records of ``path`` ([] if absent); a damaged line is a ValueError naming the
    file (:func:`fedforge.study.plots.read_metrics`)."""
    if not path.is_file():
        return []
    return read_records(path)


def read_marker(path: Path) -> dict | None:
    """``seed<k>.diverged.json`` -> ``{"round", "budget"}`` (None if absent). Anything else
    in it is a ValueError naming the file: a marker is trusted only for what it says."""
    if not path.exists() and not path.is_symlink():
        return None
    try:
        marker = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ValueError(f"{path}: unreadable divergence marker ({exc}); delete it to rerun "
                         "the run") from None
    ok = isinstance(marker, dict) and all(
        type(marker.get(k)) is int and marker[k] >= 1 for k in ("round", "budget"))
    if not ok:
        raise ValueError(f"{path}: not a divergence marker (expected "
                         '{"round": int >= 1, "budget": int >= 1}); delete it to rerun the run')
    return {"round": marker["round"], "budget": marker["budget"]}


def is_finished(run_dir: Path, cfg: RunConfig) -> bool:
    """The run's metrics reach its last round (the runner evaluates the last round); a
    multi-task run has written its ``summary.json``."""
    if cfg.multitask:
        return (run_dir / "summary.json").is_file()
    records = read_metrics(run_dir / "metrics.jsonl")
    return bool(records) and records[-1].get("round") == cfg.rounds


def committed(data: Path, spec: Reproduction, cond: str, cfg: RunConfig) -> bool:
    """The run's committed metrics in ``data`` are complete: a new machine (no run folders)
    reports from them instead of running the grid again."""
    if spec.multitask:
        return summary_path(data, spec, cond, cfg.seed).is_file()
    metrics = data_path(data, spec, cond, cfg.seed)
    marker = read_marker(diverged_path(data, spec, cond, cfg.seed))
    if marker is not None:  # a divergence of this very run: same budget, its metrics kept
        return marker["budget"] == cfg.rounds and metrics.is_file()
    records = read_metrics(metrics)
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
    log: Callable[[str], None] = print, allow_processes: bool = False,
    only: tuple[str, ...] | None = None, batch_seeds: bool = False,
) -> dict[str, int]:
    """Run what is missing; -> counts ``{"skipped", "ran", "diverged", "total"}``.
    ``allow_processes``: whether ``engine.name = "auto"`` may start worker processes.

    A run stopped by non-finite values is an outcome, not a failure of the grid: its metrics
    up to the divergence are kept, ``seed<k>.diverged.json`` records the round, and the grid
    goes on (rerunning it would diverge again: every run is deterministic). ``only``: the
    conditions to run (default: all). ``batch_seeds``: train each condition's missing seeds
    as one batch where they can (:mod:`fedforge.experiment.seed_batch`; the same numbers as
    one by one), saying why where they cannot."""
    counts = {"skipped": 0, "ran": 0, "diverged": 0, "total": 0}
    plan = [step for step in grid_plan(spec, root, runs) if only is None or step[0].name in only]
    from_data = [not out.exists() and committed(data, spec, cond.name, cfg)
                 for cond, cfg, out in plan]
    finished = [known or is_finished(out, cfg)
                or divergence_stop(out) is not None
                for known, (_, cfg, out) in zip(from_data, plan)]
    if spec.prepare is not None and not all(finished):  # nothing to run, nothing to prepare
        spec.prepare(root)
    todo = [step for step, known, done in zip(plan, from_data, finished) if not (known or done)]
    batched = _run_batches(spec, todo, log) if batch_seeds else {}
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
                if out in batched:  # trained already, with the condition's other seeds
                    if isinstance(batched[out], BaseException):
                        raise batched[out]
                else:
                    run_experiment(cfg, out, resume=out.exists(), progress=progress,
                                   allow_processes=allow_processes)
            except FloatingPointError as err:  # DivergenceError or a non-finite loss
                log(f"[reproduce {spec.name}] {cond.name} seed {cfg.seed} diverged: {err}")
                if divergence_stop(out) is None:  # the loss check stops without an event
                    done = read_metrics(out / "metrics.jsonl")
                    log_event(out, {"round": done[-1]["round"] + 1 if done else 1,
                                    "policy": "stop", "faults": [], "action": str(err)})
            counts["ran"] += 1
        stop = divergence_stop(out)
        marker = diverged_path(data, spec, cond.name, cfg.seed)
        if stop is not None:
            counts["diverged"] += 1
            _put(data, marker, json.dumps({"round": stop["round"], "budget": cfg.rounds}))
        elif marker.exists() or marker.is_symlink():
            marker.unlink()
        metrics = out / "metrics.jsonl"  # absent: diverged before its first record
        _put(data, dest, metrics.read_bytes() if metrics.is_file() else b"")
        if spec.multitask:
            from fedforge.study.multitask_diagnostics import run_diagnostics

            summary = run_diagnostics(out, _capacity(cfg))
            summary.pop("allocation_log", None)  # in the run folder; long
            _put(data, summary_path(data, spec, cond.name, cfg.seed),
                 json.dumps(summary, indent=1))
    return counts


def _run_batches(spec: Reproduction, todo: list[tuple[Condition, RunConfig, Path]],
                 log: Callable[[str], None]) -> dict[Path, object]:
    """Each condition's missing seeds as one batch -> per run folder its outcome (records or
    the exception); a condition whose seeds cannot be batched is left out, saying why.
    ``engine.name = "auto"`` trains on the vmapped engine, the one a batch stacks."""
    outcomes: dict[Path, object] = {}
    for name in dict.fromkeys(cond.name for cond, _, _ in todo):
        steps = [(cfg, out) for cond, cfg, out in todo if cond.name == name]
        cfgs = [vmapped(cfg) for cfg, _ in steps]
        if (refusal := batch_refusal(cfgs)) is not None:
            log(f"[reproduce {spec.name}] {name}: seeds run one by one: {refusal}")
            continue
        seeds = ",".join(str(cfg.seed) for cfg in cfgs)
        log(f"[reproduce {spec.name}] {name} seeds {seeds} as one batch")
        dirs = [out for _, out in steps]
        outcomes.update(zip(dirs, train_seeds(cfgs, dirs, resume=True), strict=True))
    return outcomes


def vmapped(cfg: RunConfig) -> RunConfig:
    """``cfg`` on the vmapped engine where it leaves the choice to ``auto``."""
    if cfg.multitask or cfg.engine.name != "auto":
        return cfg
    return cfg.model_copy(update={"engine": cfg.engine.model_copy(update={"name": "vmap"})})


def _put(data: Path, path: Path, payload: str | bytes) -> None:
    """Write a committed file below ``data`` through the folder's writer (no link followed)."""
    payload = payload.encode("utf-8") if isinstance(payload, str) else payload
    write_bytes(data, path.relative_to(data), payload)


def run_dirs(spec: Reproduction, runs: Path) -> list[Path]:
    return [runs / spec.name / c.name / f"seed{s}" for s in spec.seeds for c in spec.conditions]
