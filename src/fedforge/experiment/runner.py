"""The one run loop, its entry :func:`run_experiment`, and the object API :class:`Experiment`.

Every kind of run goes through :func:`drive`: claim the run folder, build the run's
:class:`~fedforge.experiment.drivers.Driver`, continue from its last checkpoint, step it,
log the records of each step, checkpoint, show progress and summarise. What a step does is
the driver's (synchronous rounds, several tasks on one clock); what a checkpoint's counters
are is :class:`~fedforge.experiment.state.RunState`'s; how a run is built is
:mod:`fedforge.experiment.build`'s.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from fedforge.algorithms import Algorithm
from fedforge.core.checkpoint import latest_checkpoint_meta, load_checkpoint, save_checkpoint
from fedforge.core.tree import Params, restore_like
from fedforge.engine.distributed import barrier, is_main_rank, world_size
from fedforge.experiment.build import Setup, resolve_config, resolve_run
from fedforge.experiment.checkpoint import resumable
from fedforge.experiment.client_metrics import FILE as CLIENT_METRICS
from fedforge.experiment.config import RunConfig, dump_config
from fedforge.experiment.drivers import (
    Driver,
    RoundsDriver,
    RunFolder,
    TasksDriver,
    read_checkpoint,
    run_folder,
    scatters,
    serve,
)
from fedforge.experiment.metrics import MetricsWriter
from fedforge.experiment.progress import setup_step
from fedforge.experiment.rundir import MULTITASK_MAY_CHANGE, RUN_MAY_CHANGE, claim_run_dir
from fedforge.experiment.state import RunState
from fedforge.robust.divergence import DivergenceError


def drive(cfg: RunConfig, folder: RunFolder, build: Callable[[], Driver], *,
          resume: bool = False, overwrite: bool = False) -> list[dict]:
    """Run the driver ``build()`` makes in ``folder`` -> the records of its log.

    The folder is locked while the run writes it, and one that holds an earlier run needs
    ``resume`` (continue from its last checkpoint) or ``overwrite``
    (:func:`fedforge.experiment.rundir.claim_run_dir`). A diverged step either rolls back to
    the last checkpoint (the log is cut back with it) or ends the run with its error."""
    may_change = MULTITASK_MAY_CHANGE if cfg.multitask else RUN_MAY_CHANGE
    with claim_run_dir(folder.out, lambda path: dump_config(cfg, path), resume=resume,
                       overwrite=overwrite, may_change=may_change):
        driver = build()
        if resume and resume_point(folder):
            driver.load_state_dict(*read_checkpoint(driver))
        driver.start()
        metrics = open_log(folder, driver.state)
        with driver.progress() as show, driver:  # leaving it ends worker processes (procs)
            while not driver.finished():
                try:
                    records = driver.step()
                except DivergenceError as error:
                    if not driver.rollback(error):
                        raise
                    metrics = open_log(folder, driver.state)
                    continue
                metrics.write_many(records)
                if driver.checkpoint_due():
                    checkpoint(driver)
                show(records)
        driver.summarise()
        return metrics.records


def resume_point(folder: RunFolder) -> bool:
    """Whether the run continues from a checkpoint (:func:`resumable`). Where the ranks share
    one checkpoint folder, only the rank that writes it may finish an unfinished first commit
    of ``latest.json``; the others look after it has (or has found nothing to continue)."""
    if not folder.shared:
        return resumable(folder.checkpoints)
    if folder.writes:
        try:
            return resumable(folder.checkpoints)
        finally:
            barrier()
    barrier()
    return resumable(folder.checkpoints)


def open_log(folder: RunFolder, state: RunState) -> MetricsWriter:
    """``metrics.jsonl``, holding only the records of the steps ``state`` includes, and
    the per-client results beside it (``client_metrics.npz``)."""
    keep = None if state.round == 0 else lambda record, _: state.covers(record)
    return MetricsWriter(folder.out / "metrics.jsonl", keep=keep,
                         clients=folder.out / CLIENT_METRICS)


def checkpoint(driver: Driver) -> None:
    """Save the driver's checkpoint (on the ranks that write; every rank takes part)."""
    tensors, state = driver.state_dict()
    folder = driver.folder
    if folder.writes:
        save_checkpoint(folder.checkpoints, state.round, tensors, state.to_meta(),
                        keep=folder.keep)
    if folder.shared:
        barrier()  # the other ranks may read it (resume, rollback)
    driver.checkpointed()  # e.g. the disk store's segments no checkpoint names any more


@dataclass
class Experiment(Setup):
    """Everything a run needs, built once from a config; with a run folder, the object API.

    ``exp = Experiment.from_config(cfg, "runs/a")``, ``exp.run(20)`` (20 more rounds, resumable),
    ``exp.history`` (one record per round), ``exp.model()`` (the current global model as an
    ``nn.Module``), ``exp.personal_model(i)`` (client i's personalised model),
    ``exp.save()``, ``Experiment.load("runs/a")`` (continue a run folder).
    :meth:`run` trains this object's model, algorithm and engine; the state between calls
    lives in the folder's checkpoints, as for ``fedforge run``."""

    out_dir: Path | None = None  # the run folder of the object API

    @classmethod
    def from_config(cls, cfg: RunConfig, out_dir: str | Path | None = None, *,
                    algorithm: Algorithm | None = None,
                    allow_processes: bool = False) -> Experiment:
        """Build everything ``cfg`` names; ``out_dir``: the folder :meth:`run` writes (the
        config is then resolved as ``fedforge run`` records it); ``algorithm``: ``cfg``'s,
        when the caller has built it already; ``allow_processes``: as for
        :func:`run_experiment`."""
        if out_dir is not None:
            cfg = resolve_config(cfg)
        return super().from_config(cfg, algorithm=algorithm, allow_processes=allow_processes,
                                   out_dir=None if out_dir is None else Path(out_dir))

    @classmethod
    def load(cls, run_dir: str | Path) -> Experiment:
        """The experiment of a run folder, at its last checkpoint (:meth:`run` continues it)."""
        from fedforge.experiment.config import load_config
        from fedforge.experiment.rundir import CONFIG_NAME

        path = Path(run_dir) / CONFIG_NAME
        if not path.is_file():
            raise FileNotFoundError(f"{path}: no resolved config (is {run_dir} a run folder?)")
        return cls.from_config(load_config(path, []), run_dir)

    def _folder(self) -> Path:
        if self.out_dir is None:
            raise ValueError("out_dir: this Experiment has no run folder; build it with "
                             "Experiment.from_config(cfg, out_dir)")
        return self.out_dir

    @property
    def rounds_done(self) -> int:
        """The round of the folder's last checkpoint (0 before any)."""
        ckpt = self._folder() / "checkpoints"
        return latest_checkpoint_meta(ckpt)[1]["round"] if (ckpt / "latest.json").is_file() else 0

    def run(self, rounds: int | None = None, *, progress: bool = False) -> list[dict]:
        """Train ``rounds`` more rounds (default: up to ``cfg.rounds``) from the last
        checkpoint -> the records this call logged. The last round is always evaluated and
        checkpointed; the rounds drawn are those of one uninterrupted run. ``cfg`` is left
        as it is, so ``run(2)`` then ``run()`` ends at ``cfg.rounds``."""
        if rounds is not None and rounds < 1:
            raise ValueError(f"rounds: expected at least 1, got {rounds}")
        done = self.rounds_done
        total = self.cfg.rounds if rounds is None else done + rounds
        if total <= done:
            return []
        before = len(self.history)
        folder = run_folder(self.cfg, self._folder())
        drive(self.cfg, folder, lambda: RoundsDriver(self, folder, rounds=total,
                                                     verbose=progress), resume=True)
        return self.history[before:]

    @property
    def history(self) -> list[dict]:
        """Every record the run logged: one per round, the test metrics on evaluated rounds
        only (:func:`fedforge.experiment.metrics.evaluated` keeps those). A multi-task run
        logs one record per task evaluation instead."""
        path = self._folder() / "metrics.jsonl"
        return read_metrics(self._folder()) if path.is_file() else []

    def params(self) -> Params:
        """The current global parameters: the last checkpoint's, or the initial ones."""
        if self.out_dir is None or self.rounds_done == 0:
            return self.initial_params()
        tensors, _ = load_checkpoint(self.out_dir / "checkpoints", self.device)
        return restore_like(self.initial_params(), tensors["params"], "params")

    def model(self) -> torch.nn.Module:
        """A copy of the network holding the current global parameters."""
        net = copy.deepcopy(self.network)
        net.load_state_dict(self.params())
        return net

    def personal_model(self, client_id: int) -> torch.nn.Module:
        """A copy of the network holding client ``client_id``'s personalised model at the
        last checkpoint, as that round's personalised evaluation measured it: its stored
        personal part, then the method's own fine-tuning steps (a held-out client: the
        global model after ``eval.finetune_steps`` steps). For a method without a personal
        model it is the global model."""
        if self.client_tests is None:
            raise ValueError("personal_model: needs the personalised evaluation "
                             "(eval.personal = true, or a personalised algorithm)")
        from dataclasses import replace  # noqa: PLC0415

        from fedforge.experiment.personal_eval import client_personal_params  # noqa: PLC0415

        driver = RoundsDriver(self, replace(run_folder(self.cfg, self._folder()), writes=False),
                              verbose=False)
        if self.rounds_done:
            driver.load_state_dict(*read_checkpoint(driver))
        driver.start()
        cfg = self.cfg
        try:
            params = client_personal_params(
                self.algorithm.evaluated_at(driver.server_state), driver.loss_fn,
                self.algorithm.eval_params(driver.params, driver.server_state), int(client_id),
                driver.store.gather, self.client_tests, self.data.train_x, self.data.train_y,
                held_out_steps=cfg.eval.finetune_steps, train_batch_size=cfg.client.batch_size,
                seed=cfg.seed, round_=driver.state.round)
        finally:
            driver.store.close()
        net = copy.deepcopy(self.network)
        net.load_state_dict(params)
        return net

    def save(self, path: str | Path | None = None) -> Path:
        """Write the current global model's weights (safetensors; default
        ``out_dir/model.safetensors``) and, in a fresh folder, the resolved config -> the
        weights' path. Training state is checkpointed by :meth:`run` at its last round."""
        from safetensors.torch import save_file

        out = self._folder()
        target = out / "model.safetensors" if path is None else Path(path)
        with claim_run_dir(out, lambda p: dump_config(self.cfg, p), resume=True,
                           may_change=RUN_MAY_CHANGE):
            tensors = {k: v.detach().cpu().contiguous() for k, v in self.params().items()}
            save_file(tensors, str(target))
        return target


def run_experiment(
    cfg: RunConfig, out_dir: str | Path, *, resume: bool = False, progress: bool = True,
    overwrite: bool = False, stop_at: float | None = None, allow_processes: bool = False,
) -> list[dict]:
    """Run ``cfg``, writing ``out_dir/{config.resolved.toml, metrics.jsonl, checkpoints/}``
    (multi-task runs also ``events.jsonl`` and ``summary.json``).

    ``stop_at``: end a single-task run after its first evaluation with ``test_accuracy`` at
    or above this value (``fedforge bench w3``); that round is checkpointed as the last one.

    ``allow_processes``: whether ``engine.name = "auto"`` may train in worker processes.
    A spawned worker re-imports the main module, so a script must guard its top level
    (``if __name__ == "__main__":``) to allow them; the ``fedforge`` command allows them.
    With the same flag, a config picks the same engine here and from the command.

    The one entry for every kind of run: without ``tasks``, synchronous rounds of one task;
    with a ``[[tasks]]`` list, ``cfg.method``'s multi-task scheduler
    (:mod:`fedforge.experiment.drivers`). The folder is locked while the run writes it;
    one that holds an earlier run needs ``resume`` or ``overwrite``
    (fedforge.experiment.rundir); RunDirError otherwise."""
    cfg, algorithm = resolve_run(cfg)  # config.resolved.toml records every default used
    if stop_at is not None and (cfg.multitask or world_size() > 1):
        raise ValueError("stop_at: only single-task runs in one process stop at an accuracy")
    folder = run_folder(cfg, out_dir)
    if scatters(cfg) and not is_main_rank():  # serves rank 0's jobs, writes nothing
        return serve(cfg)

    def build() -> Driver:
        if cfg.multitask:
            return TasksDriver(cfg, folder, verbose=progress, allow_processes=allow_processes)
        with setup_step(f"{cfg.data.dataset}: loading and partitioning the data, building the "
                        f"model and algorithm", enabled=progress):
            exp = Experiment.from_config(cfg, algorithm=algorithm,
                                         allow_processes=allow_processes)
        return RoundsDriver(exp, folder, stop_at=stop_at, verbose=progress)

    return drive(cfg, folder, build, resume=resume, overwrite=overwrite)


def read_metrics(run_dir: str | Path) -> list[dict]:
    path = Path(run_dir) / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
