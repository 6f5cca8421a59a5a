"""Seeds as a batch: runs of one config that differ only in ``seed``, trained together.

Each run is an ordinary run (:func:`fedforge.experiment.runner.drive`) in its own folder and
thread, with its own sampling, RNG streams, client store, server state, evaluation,
``metrics.jsonl`` and checkpoints, so a killed batch resumes each run from its own
checkpoint. Only their local rounds are shared, through one
:class:`~fedforge.engine.seed_batch.CohortBatch`: each run's cohort in its own engine's
chunks, equal chunks of different seeds stacked under one ``vmap``. Every metric but the
wall-clock ones and every final model equal the separate runs' bit for bit.
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from fedforge.engine.seed_batch import CohortBatch
from fedforge.engine.threads import choose_threads
from fedforge.experiment.build import resolve_run
from fedforge.experiment.config import RunConfig
from fedforge.experiment.drivers import Driver, RoundsDriver, run_folder
from fedforge.experiment.runner import Experiment, drive, run_experiment

# models whose batched runs were checked bit for bit against separate runs; FedNAR's
# transformer_lm on Shakespeare was not bit-equal (and slower) when measured, so other
# models run one by one until checked
CHECKED_MODELS = ("logreg", "mlp")
_BUILDING = threading.Lock()  # building a run seeds torch's global generator (model init)


def batch_refusal(cfgs: Sequence[RunConfig]) -> str | None:
    """Why these runs cannot train as one batch of seeds, or ``None`` if they can."""
    first = cfgs[0]
    if len(cfgs) < 2:
        return "one run is not a batch"
    if first.multitask:
        return "multi-task runs step their own schedulers, not rounds of one cohort"
    if any(c.model_copy(update={"seed": first.seed}) != first for c in cfgs[1:]):
        return "the configs differ in more than their seed"
    if len({c.seed for c in cfgs}) < len(cfgs):
        return "two runs have the same seed"
    if first.engine.name != "vmap":
        return f"engine.name = {first.engine.name!r} does not vmap its cohorts (use 'vmap')"
    if first.engine.compile:
        return "compiled chunks (engine.compile) are not stacked across seeds"
    if (threads := choose_threads(first.engine.threads).threads) > 1:
        return (f"{threads} intra-op threads split a stacked chunk's sums otherwise than a "
                "run's own chunk (engine.threads = 1 or OMP_NUM_THREADS=1 batches them)")
    if first.model.name not in CHECKED_MODELS:
        return (f"model {first.model.name!r}: batched seeds are checked bit for bit on "
                f"{', '.join(CHECKED_MODELS)} only")
    if first.privacy.on:
        return "a private run's mechanism is built for its own run"
    if first.sim.stragglers:
        return "straggler rounds keep their own clock per run"
    return None


def run_seeds(cfgs: Sequence[RunConfig], out_dirs: Sequence[str | Path], *,
              resume: bool = False, overwrite: bool = False) -> list[list[dict]]:
    """Run ``cfgs`` (one config, several seeds) into ``out_dirs`` -> each run's records.

    Where they can train as a batch (:func:`batch_refusal`) they do, and their metrics and
    models equal separate runs' bit for bit; otherwise they run one after the other. The
    first run's error, if any, is raised once every run has ended."""
    if (refusal := batch_refusal(cfgs)) is not None:
        warnings.warn(f"seeds run one by one: {refusal}", stacklevel=2)
        return [run_experiment(c, d, resume=resume, overwrite=overwrite, progress=False)
                for c, d in zip(cfgs, out_dirs, strict=True)]
    outcomes = train_seeds(cfgs, out_dirs, resume=resume, overwrite=overwrite)
    for outcome in outcomes:
        if isinstance(outcome, BaseException):
            raise outcome
    return outcomes


def train_seeds(cfgs: Sequence[RunConfig], out_dirs: Sequence[str | Path], *,
                resume: bool = False, overwrite: bool = False) -> list:
    """The batch itself (``batch_refusal(cfgs)`` must be ``None``) -> per run its records,
    or the exception it ended with (a diverged run ends alone; the others go on)."""
    if len(cfgs) != len(out_dirs):
        raise ValueError(f"out_dirs: {len(out_dirs)} folders for {len(cfgs)} runs")
    batch = CohortBatch(len(cfgs))
    with ThreadPoolExecutor(max_workers=len(cfgs), thread_name_prefix="seed") as pool:
        futures = [pool.submit(_member_run, batch, c, Path(d), resume, overwrite)
                   for c, d in zip(cfgs, out_dirs, strict=True)]
        return [f.exception() or f.result() for f in futures]


def _member_run(batch: CohortBatch, cfg: RunConfig, out_dir: Path, resume: bool,
                overwrite: bool) -> list[dict]:
    """One run of the batch, as :func:`run_experiment` runs it, its engine a batch member."""
    try:
        cfg, algorithm = resolve_run(cfg)
        folder = run_folder(cfg, out_dir)

        def build() -> Driver:
            with _BUILDING:
                exp = Experiment.from_config(cfg, algorithm=algorithm)
                exp.engine = batch.member(exp.engine)
                return RoundsDriver(exp, folder, verbose=False)

        return drive(cfg, folder, build, resume=resume, overwrite=overwrite)
    finally:
        batch.leave()
