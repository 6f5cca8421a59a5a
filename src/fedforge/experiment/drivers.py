"""Drivers: what one step of a run does and what its checkpoint holds, behind one protocol.

The run loop (:func:`fedforge.experiment.runner.drive`) knows nothing about rounds, tasks or
clocks: it loads a checkpoint into a :class:`Driver`, steps it until it is finished, logs the
records each step returns, checkpoints when the driver says so and shows progress. A new
kind of run is a new driver. Two are built in:

* :class:`RoundsDriver`: synchronous rounds of one task (stragglers included: with
  ``sim.stragglers`` only the first k arrivals of a round train);
* :class:`TasksDriver`: several tasks on one client pool and one simulated clock, stepped
  by a method's scheduler from :mod:`fedforge.sim` (FedAST and its ablations, FedBuff,
  FedAsync event by event; the synchronous multi-task baselines round by round).

The drivers live here, not in ``sim/``, because they evaluate, log and checkpoint, which
are the runner's pieces; the schedulers they step stay in ``sim/`` and import none of it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Protocol

import numpy as np
import torch

from fedforge.core.checkpoint import checkpoint_jsons, load_checkpoint
from fedforge.core.disk_store import check_record_world
from fedforge.core.store import StateStore, choose_store, record_kind, template_nbytes
from fedforge.core.tree import restore_like
from fedforge.engine import classification_loss
from fedforge.engine.distributed import (
    init_distributed,
    is_main_rank,
    make_client_store,
    world_size,
)
from fedforge.engine.draw import CohortMetrics
from fedforge.engine.evaluate import evaluate, population_metrics
from fedforge.engine.local import set_matmul_precision
from fedforge.engine.round import RoundSetup, federated_round
from fedforge.experiment.adapters import export_adapters, exports_adapters
from fedforge.experiment.build import (
    Setup,
    build_scheduler,
    build_tasks,
    resolve_device,
    sample_round,
)
from fedforge.experiment.checkpoint import last_checkpoint_note
from fedforge.experiment.config import RunConfig
from fedforge.experiment.metrics import MetricsWriter
from fedforge.experiment.partition_stats import save_partition_stats
from fedforge.experiment.personal_eval import evaluate_personal
from fedforge.experiment.progress import RoundProgress, setup_step
from fedforge.experiment.state import UPDATES, RunState
from fedforge.robust.divergence import DivergenceError, log_event
from fedforge.schedulers.client_selection import Selection
from fedforge.schedulers.fedast import ASYNC_METHODS
from fedforge.schedulers.jobs import TaskExecutor
from fedforge.schedulers.multitask_sync import StoreFactory
from fedforge.schedulers.scatter import ScatteredExecutor, link_executors, serve_jobs, stop_workers
from fedforge.schedulers.scheduler import Scheduler
from fedforge.sim.cost import build_cost_model
from fedforge.sim.rounds import straggler_clock, straggler_round

Show = Callable[[list[dict]], None]
"""Shows a step's records (a progress bar, a printed line)."""


@dataclass(frozen=True)
class RunFolder:
    """Where this process writes. ``out``: its logs; ``checkpoints``: the checkpoints it
    resumes from and, when ``writes``, writes (``keep`` of them); ``shared``: every rank
    reads them, so each checkpoint ends when every rank has reached it."""

    out: Path
    checkpoints: Path
    writes: bool = True
    shared: bool = False
    keep: int = 2


class Driver(Protocol):
    """One kind of run, as the run loop drives it.

    ``load_state_dict`` (on resume) comes before ``start``; then ``step`` until
    ``finished``, with ``state_dict`` whenever ``checkpoint_due``; ``summarise`` at the end.
    The driver is a context manager that releases what it holds (worker processes)."""

    folder: RunFolder
    device: torch.device
    state: RunState  # the counters after the last step

    def start(self) -> None:
        """Begin the run at ``state`` (a fresh one, or the one just loaded)."""

    def step(self) -> list[dict]:
        """Run one round (or event) -> the records to log (none on ranks that log none)."""

    def finished(self) -> bool:
        """Whether the run is over (its rounds done, its tasks at target, a limit hit)."""

    def checkpoint_due(self) -> bool:
        """Whether the step just run is checkpointed."""

    def state_dict(self) -> tuple[dict, RunState]:
        """The checkpoint of the step just run: its tensors and its state (every rank)."""

    def checkpointed(self) -> None:
        """After the checkpoint is written (every rank): tidy what it made redundant."""

    def load_state_dict(self, tensors: dict, state: RunState) -> None:
        """Continue from a checkpoint's tensors and state."""

    def rollback(self, error: DivergenceError) -> bool:
        """After a diverged step: restore the last checkpoint and return True, or False to
        stop the run with ``error``."""

    def progress(self) -> AbstractContextManager[Show]:
        """Shows the records of each step while the run lasts."""

    def summarise(self) -> None:
        """Write what the run writes once it ends."""

    def __enter__(self) -> Driver: ...

    def __exit__(self, *exc: object) -> None: ...


def read_checkpoint(driver: Driver) -> tuple[dict, RunState]:
    """The last checkpoint of ``driver``'s folder: its tensors and its state."""
    where = driver.folder.checkpoints
    tensors, meta = load_checkpoint(where, driver.device)
    return tensors, RunState.from_meta(meta, where, driver.state.unit)


def run_folder(cfg: RunConfig, out_dir: str | Path) -> RunFolder:
    """This process's folder. Under torchrun rank 0 owns ``out_dir`` and every other rank
    logs into ``out_dir/rank<r>``; one task's ranks all read rank 0's checkpoints, the ranks
    of a multi-task run (each running the same deterministic scheduler) keep their own."""
    root = Path(out_dir)
    ranked = cfg.engine.name == "distributed" and init_distributed() and not is_main_rank()
    out = root / f"rank{torch.distributed.get_rank()}" if ranked else root
    shared = not cfg.multitask
    return RunFolder(out, (root if shared else out) / "checkpoints", not (ranked and shared),
                     shared, cfg.checkpoint.keep)


# --- synchronous rounds of one task ------------------------------------------------------
class RoundsDriver:
    """Synchronous rounds of one task: sample, train, aggregate, evaluate every
    ``eval.every`` rounds; with ``sim.stragglers`` only a round's first k arrivals train.

    ``rounds``: where the run ends (default ``cfg.rounds``; a private run may end earlier,
    at its privacy target); ``stop_at``: end after the first evaluation at or above this
    test accuracy."""

    def __init__(self, setup: Setup, folder: RunFolder, *, rounds: int | None = None,
                 stop_at: float | None = None, verbose: bool = True) -> None:
        self.exp, self.folder, self.stop_at, self.verbose = setup, folder, stop_at, verbose
        self.cfg = setup.cfg if rounds is None else setup.cfg.model_copy(
            update={"rounds": rounds})
        self.device = setup.device
        self.state = RunState(seed=self.cfg.seed)
        self.privacy = None
        self.selection: Selection | None = None  # server.sampler; None: uniform draws
        self._sampler_state: dict | None = None  # a checkpoint's, until start builds it
        self._loaded: dict | None = None
        self._stop = False

    def load_state_dict(self, tensors: dict, state: RunState) -> None:
        state.check_algorithm(self.cfg.algorithm.name,
                              self.folder.checkpoints / f"round_{state.round:05d}.json")
        if self.exp.algorithm.privacy is not None:  # continue its ledger
            from fedforge.privacy.algorithm import resume  # noqa: PLC0415 (optional extra)

            self.exp.algorithm = resume(
                self.exp.algorithm, self.folder.checkpoints / f"round_{state.round:05d}.json",
                {"round": state.round, **state.to_meta()}, self.cfg.rounds)
        self._loaded, self.state = tensors, state

    def start(self) -> None:
        exp, cfg = self.exp, self.cfg
        self.privacy = exp.algorithm.privacy
        if self.privacy is not None:  # stop at the target ε
            self.cfg = cfg = cfg.model_copy(update={"rounds": self.privacy.last_round(cfg.rounds)})
        if self.folder.writes:
            with setup_step(f"writing {self.folder.out / 'partition.json'}",
                            enabled=self.verbose):
                save_partition_stats(exp.data, self.folder.out)  # client sizes, label counts
        set_matmul_precision(cfg.engine.precision)
        self.loss_fn = classification_loss(exp.network, cfg.engine.precision)
        self.params = exp.initial_params()
        self.server_state = exp.algorithm.server_init(self.params)
        self.store = self._make_store(exp.algorithm.client_init(self.params))
        if self._loaded is None:
            self.store.restore_checkpoint(None)  # a fresh run: no rows of an earlier one
        else:
            self._restore(self._loaded, self.state.store)
            exp.engine.load_state_dict(self.state.engine)  # auto: the recorded choice
            exp.scale_local_lr(self.state.lr_scale)
            self._loaded = None
        self.t0 = time.perf_counter() - self.state.wall_s
        self.down, self.up = exp.algorithm.message_nbytes(self.params, self.server_state)
        self.cost = build_cost_model(cfg.sim, exp.network, exp.data.input_shape,
                                     cfg.client.batch_size)
        self.stragglers = straggler_clock(cfg.sim, exp.data.num_clients, cfg.seed,
                                          self.state.sim_clock)
        self._build_selection()

    def _build_selection(self) -> None:
        """The run's sampler, fresh or with the state of the checkpoint just restored."""
        self.selection = Selection.build(self.exp, self.cost, self.stragglers)
        if self.selection is not None and self._sampler_state is not None:
            self.selection.sampler.load_state_dict(self._sampler_state)
        self._sampler_state = None

    def _make_store(self, template: dict) -> StateStore:
        """The clients' store (under torchrun each rank keeps its share, by client id): the
        kind a resumed checkpoint holds, else ``engine.client_store``'s (auto: from the
        population's size against the free memory, reported once in the metrics)."""
        exp, cfg = self.exp, self.cfg
        n = exp.data.num_clients
        if self._loaded is not None:
            kind = record_kind(self.state.store)
            if kind == "disk":
                check_record_world(self.state.store, world_size(), self.folder.checkpoints /
                                   f"round_{self.state.round:05d}.json")
        else:
            kind, _ = choose_store(cfg.engine.client_store, -(-n // world_size()),
                                   template_nbytes(template))
        self._store_report = ({"client_store_auto": kind}
                              if cfg.engine.client_store == "auto" else {})
        root = self.folder.checkpoints.parent  # the run folder (rank 0's under torchrun)
        return make_client_store(
            n, template, exp.device, storage="cpu" if cfg.engine.client_state == "host"
            else None, kind=kind, directory=root / "clients",
            cache_mb=cfg.engine.store_cache_mb, root=root)

    def _restore(self, tensors: dict | None, store: dict | None = None) -> None:
        """Resume and rollback: the checkpoint's tensors, rebuilt from a fresh state of this
        run's algorithm in the model's parameter order (so codec and part states are never
        dropped and nothing depends on the file's key order); None: the initial state.
        ``store``: the checkpoint's client-store record."""
        exp, template = self.exp, self.exp.initial_params()
        where = self.folder.checkpoints / f"round_{self.state.round:05d}.json"
        self._sampler_state = None if tensors is None else tensors.get("sampler", {})
        if tensors is None:
            self.store.restore_checkpoint(None)
            self.params, self.server_state = template, exp.algorithm.server_init(template)
            return
        self.params = restore_like(template, tensors["params"], "params")
        self.server_state = exp.algorithm.server.restore(template, tensors.get("server", {}))
        self.store.restore_checkpoint(tensors.get("clients", {}), store, where,
                                      version=self.state.round)

    def step(self) -> list[dict]:
        exp, cfg, s = self.exp, self.cfg, self.state
        t = s.round + 1
        start, down, up = self.params, self.down, self.up
        chosen = None if self.selection is None else self.selection.choose(t, start, down, up)
        draw = sample_round(exp, t, chosen)
        if self.stragglers is not None:  # sim.stragglers: only the first k arrivals train
            keep, round_s = straggler_round(self.stragglers, draw, self.cost, down, up)
            seconds = self.stragglers.last_durations[keep]
            draw = draw.keep(keep)
        elif self.selection is not None:
            seconds = self.selection.client_seconds(draw.client_ids, draw.weights, down, up)
        setup = RoundSetup(exp.algorithm, exp.engine, self.loss_fn, self.store,
                           exp.data.train_x, exp.data.train_y, cfg.divergence, exp.robust)
        self.params, self.server_state, cohort = federated_round(
            setup, self.params, self.server_state, draw)
        metrics, client_ids = cohort.metrics, draw.client_ids
        if self.selection is not None and len(metrics.loss) == len(client_ids):
            self.selection.observe(t, start, client_ids, draw.sample_idx, draw.weights,
                                   metrics.loss, seconds)
        if metrics.skipped_clients is not None:
            log_event(self.folder.out, {"round": t, "policy": "skip_client",
                                        "skipped": metrics.skipped_clients.tolist()})
        if exp.algorithm.nbytes_by_round:  # MARINA's encoded size, FLoRA's stack
            self.down, self.up = exp.algorithm.message_nbytes(self.params, self.server_state,
                                                              round_=t)
        client_steps, server_steps = prep_steps(metrics, cfg.client.batch_size)
        sim_time_s = s.sim_time_s + (round_s if self.stragglers is not None else
                                     self.cost.round_seconds(metrics.steps.cpu().numpy()
                                                             + client_steps, self.down, self.up))
        sim_time_s += server_steps * self.cost.step_time_s  # server work before the broadcast
        self.state = replace(s, round=t, bytes_down=s.bytes_down + self.down * len(client_ids),
                             bytes_up=s.bytes_up + self.up * len(client_ids),
                             sim_time_s=sim_time_s,
                             prep_s=s.prep_s + prep_seconds(metrics))
        trained = metrics.steps > 0  # empty clients report no loss
        train_loss = (metrics.loss[trained].mean().item() if bool(trained.any())
                      else 0.0)
        if not np.isfinite(train_loss):
            raise FloatingPointError(f"round {t}: training loss is {train_loss} (diverged); "
                                     f"{last_checkpoint_note(self.folder.checkpoints)}")
        if not is_main_rank():
            return []
        record = self._record(t, train_loss, cohort, trained, len(client_ids))
        self._stop = self.stop_at is not None and record.get("test_accuracy", -1.0) >= self.stop_at
        return [record]

    def _record(self, t: int, train_loss: float, cohort, trained: torch.Tensor, n: int) -> dict:
        """Every round is recorded; evaluated ones carry the test metrics and diagnostics."""
        exp, cfg, s = self.exp, self.cfg, self.state
        evaluating = t % cfg.eval.every == 0 or t == cfg.rounds
        record = {"round": t, "train_loss": train_loss}
        if evaluating:
            eval_params = exp.algorithm.eval_params(self.params, self.server_state)
            record.update(evaluate(
                exp.network, eval_params, exp.data.test_x, exp.data.test_y,
                cfg.eval.batch_size, exp.data.client_test_indices if cfg.eval.per_client else None,
            ))  # a population: on its evaluation sample, with held-out clients beside
            record.update(population_metrics(exp.network, eval_params, exp.data,
                                             cfg.eval.batch_size))
            if exp.client_tests is not None:  # personalised: each client on its own data
                record.update(evaluate_personal(
                    exp.network, exp.algorithm.evaluated_at(self.server_state), self.loss_fn,
                    eval_params, self.store.gather,
                    exp.client_tests, exp.data.train_x, exp.data.train_y,
                    held_out_steps=cfg.eval.finetune_steps, batch_size=cfg.eval.batch_size,
                    train_batch_size=cfg.client.batch_size, seed=cfg.seed, round_=t))
        record.update({"bytes_up": s.bytes_up, "bytes_down": s.bytes_down,
                       # persistent per-client state (SCAFFOLD c_i, FAdamGC y_i/v_i, ...)
                       "client_state_bytes_per_client": self.store.nbytes_per_client(),
                       "bytes_up_round": self.up * n, "bytes_down_round": self.down * n,
                       "sim_time_s": round(s.sim_time_s, 3),
                       "wall_s": round(time.perf_counter() - self.t0, 3)})
        if exp.algorithm.prepares:  # work around the local rounds, wall seconds
            record["prep_s"] = round(s.prep_s, 3)
        if evaluating:
            record.update(cohort_means(cohort.metrics.parts, trained))
            record.update(exp.algorithm.server_metrics(self.server_state, self.store.state))
            record.update(exp.engine.report())  # auto: its choice and timings, once
            record.update(self._store_report)  # client_store = auto: its choice, once
            if self.selection is not None:  # e.g. Oort's exploration and preferred duration
                record.update(self.selection.sampler.metrics())
            self._store_report = {}
        return record

    def finished(self) -> bool:
        return self._stop or self.state.round >= self.cfg.rounds

    def checkpoint_due(self) -> bool:
        t = self.state.round
        return t % self.cfg.checkpoint.every == 0 or t == self.cfg.rounds or self._stop

    def state_dict(self) -> tuple[dict, RunState]:
        # collectives when sharded: every rank. The disk store writes the rows changed since
        # the last checkpoint and the JSON records its segments; the memory store's rows are
        # tensors of the checkpoint.
        clients, record = self.store.checkpoint(self.state.round)
        state = replace(
            self.state, wall_s=time.perf_counter() - self.t0, seed=self.cfg.seed,
            sim_clock=None if self.stragglers is None else self.stragglers.state_dict(),
            engine=self.exp.engine.state_dict(),  # auto: choice, conv plans
            # σ, q and steps of every round so far (fedforge.privacy.ledger)
            privacy=None if self.privacy is None else self.privacy.ledger_meta(self.state.round),
            store=record, algorithm=self.cfg.algorithm.name)  # check_algorithm on resume
        tensors = {"params": self.params, "server": self.server_state.tree(), "clients": clients}
        if self.selection is not None:  # what the sampler learnt: losses, Oort's arms, pacer
            tensors["sampler"] = self.selection.sampler.state_dict()
        return tensors, state

    def checkpointed(self) -> None:
        """The store deletes what no checkpoint left in the folder names (a disk store's
        segments; an unreadable or linked checkpoint JSON: nothing is deleted)."""
        records = kept_checkpoints(self.folder.checkpoints)
        if records is not None:
            self.store.collect([r.get("store") for r in records])

    def rollback(self, error: DivergenceError) -> bool:
        cfg, s = self.cfg, self.state
        event = {"round": s.round + 1, "policy": cfg.divergence, "faults": error.faults}
        if cfg.divergence != "rollback" or s.rollbacks >= cfg.max_rollbacks:
            log_event(self.folder.out, {**event, "action": "stop"})
            error.args = (f"{error}; stopped (policy {cfg.divergence}, {s.rollbacks} "
                          f"rollbacks); {last_checkpoint_note(self.folder.checkpoints)}",)
            return False
        lr_scale = s.lr_scale * cfg.rollback_lr_factor
        self.exp.scale_local_lr(lr_scale)
        saved = (read_checkpoint(self) if (self.folder.checkpoints / "latest.json").is_file()
                 else (None, RunState(seed=cfg.seed)))
        self.state = saved[1]
        self._restore(saved[0], saved[1].store)
        self.state = replace(saved[1], lr_scale=lr_scale, rollbacks=s.rollbacks + 1)
        self.stragglers = straggler_clock(cfg.sim, self.exp.data.num_clients, cfg.seed,
                                          self.state.sim_clock)
        self._build_selection()
        log_event(self.folder.out, {**event, "action": f"rollback to round {self.state.round}",
                                    "lr_scale": lr_scale})
        return True

    @contextmanager
    def progress(self) -> Iterator[Show]:
        with RoundProgress.for_run(self.cfg, self.folder.out, self.state.round + 1,
                                   enabled=self.verbose) as bar:
            yield lambda records: bar.advance(self.state.round, records[0] if records else None)

    def summarise(self) -> None:
        """Its last round is checkpointed; a LoRA run also exports its adapters in PEFT's
        format (fedforge.experiment.adapters)."""
        exp = self.exp
        if self.folder.writes and exports_adapters(exp.network):
            export_adapters(exp.network, exp.algorithm, self.params, self.store,
                            exp.data.num_clients, self.folder.out)

    def __enter__(self) -> RoundsDriver:
        self.exp.engine.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.exp.engine.__exit__(*exc)  # procs: its worker processes end with the run
        if hasattr(self, "store"):  # made by start
            self.store.close()  # its open files


def kept_checkpoints(where: Path) -> list[dict] | None:
    """The checkpoint JSONs left in ``where``, read; None when one is unreadable, linked or
    not a table (then a disk store deletes nothing)."""
    records = []
    for name in checkpoint_jsons(where):
        path = where / name
        try:
            record = None if path.is_symlink() else json.loads(path.read_text())
        except (OSError, ValueError):
            return None
        if not isinstance(record, dict):
            return None
        records.append(record)
    return records


def prep_seconds(metrics: CohortMetrics) -> float:
    """Wall seconds a round spent on work around the local rounds (clients and server)."""
    return sum(float(s.sum()) for s in (metrics.prep_s, metrics.server_prep_s) if s is not None)


def prep_steps(metrics: CohortMetrics, batch_size: int) -> tuple[np.ndarray | float, float]:
    """That work in local-step equivalents (per-sample gradients / batch size) for the
    simulated clock: ``([C] per client, or 0.0; server)``."""
    client, server = metrics.prep_samples, metrics.server_prep_samples
    return (0.0 if client is None else client.cpu().numpy() / batch_size,
            0.0 if server is None else float(server) / batch_size)


def cohort_means(per_client: dict, trained: torch.Tensor) -> dict[str, float]:
    """Parts' per-client diagnostics -> their mean over the clients that trained."""
    if not bool(trained.any()):
        return {}
    return {k: float(v[trained].double().mean()) for k, v in per_client.items()}


# --- several tasks on one clock ----------------------------------------------------------
EVENT_KEYS = ("job", "task", "client", "version", "send", "start", "finish")
"""The fields of one line of ``events.jsonl``: one applied update."""


def scatters(cfg: RunConfig) -> bool:
    """Asynchronous methods under torchrun: rank 0 simulates, every rank trains jobs."""
    return cfg.multitask and cfg.method in ASYNC_METHODS and world_size() > 1


def serve(cfg: RunConfig) -> list[dict]:
    """A rank other than 0 of a scattered run: train the jobs rank 0 sends; log nothing."""
    serve_jobs(build_tasks(cfg, resolve_device(cfg.engine.device)))
    return []


class TasksDriver:
    """Several tasks on one client pool and one simulated clock, stepped by ``cfg.method``'s
    scheduler: one step is one arriving update (asynchronous methods) or one round of every
    task (synchronous baselines). The run logs ``metrics.jsonl`` (one record per evaluation
    of a task), ``events.jsonl`` (every applied update) and ``summary.json`` (time to target
    per task); a checkpoint every ``checkpoint.every`` client updates keeps the results
    computed but not yet arrived, so a resumed run equals the uninterrupted one exactly."""

    def __init__(self, cfg: RunConfig, folder: RunFolder, *, verbose: bool = True,
                 allow_processes: bool = False) -> None:
        self.cfg, self.folder, self.verbose = cfg, folder, verbose
        self.device = resolve_device(cfg.engine.device)
        self.scattered = scatters(cfg)
        folder.out.mkdir(parents=True, exist_ok=True)
        self.tasks = build_tasks(cfg, self.device,
                                 ScatteredExecutor if self.scattered else TaskExecutor)
        if self.scattered:
            link_executors(self.tasks)
        self.scheduler = build_scheduler(cfg, self.tasks, allow_processes=allow_processes,
                                         make_store=self._store_factory())
        self.state = RunState(seed=cfg.seed, unit=UPDATES)
        self.events: MetricsWriter | None = None

    def _store_factory(self) -> StoreFactory:
        """Each task's client store, of ``engine.client_store``'s kind (auto: from the task's
        clients against the free memory); on disk in ``clients/task<m>`` of this process's
        folder. Every rank of a multi-task run keeps all clients (its own checkpoints)."""
        cfg, root = self.cfg, self.folder.out

        def make(m: int, n: int, template: dict, kind: str | None) -> StateStore:
            if kind is None:
                kind, _ = choose_store(cfg.engine.client_store, n, template_nbytes(template))
            return make_client_store(
                n, template, self.device, storage="cpu" if cfg.engine.client_state == "host"
                else None, kind=kind, directory=root / "clients" / f"task{m}",
                cache_mb=cfg.engine.store_cache_mb, root=root, sharded=False)

        return make

    def load_state_dict(self, tensors: dict, state: RunState) -> None:
        self.scheduler.load_state_dict(tensors, state.driver,
                                       self.folder.checkpoints / f"round_{state.round:05d}.json")
        logged = state.driver["clock"]["num_logged"]
        self.events = MetricsWriter(self.folder.out / "events.jsonl",
                                    keep=lambda r, i: i < logged, remember=False)
        self.scheduler.clock.log = [tuple(e[k] for k in EVENT_KEYS) for e in self.events.records]
        self.events.records = []
        self.state = state

    def start(self) -> None:
        if self.events is None:
            self.events = MetricsWriter(self.folder.out / "events.jsonl", remember=False)
            self.scheduler.start()
        self.t0 = time.perf_counter() - self.state.wall_s
        self.written = len(self.scheduler.clock.log)
        self._mark_saved()

    def _mark_saved(self) -> None:
        every = self.cfg.checkpoint.every
        self.next_checkpoint = (self.scheduler.c // every + 1) * every

    def step(self) -> list[dict]:
        records: list[dict] = []
        self.scheduler.step(lambda m, rec: records.append(self._record(m, rec)))
        self.state = replace(self.state, round=self.scheduler.c)
        return records

    def _record(self, m: int, rec: dict) -> dict:
        s = self.scheduler
        return {"task": self.tasks[m].name, "task_index": m, "method": self.cfg.method,
                "round": self.tasks[m].server.round, "updates": s.c,
                "sim_time_s": round(s.clock.now, 6), **rec,
                "wall_s": round(time.perf_counter() - self.t0, 3)}

    def finished(self) -> bool:
        return self.scheduler.done(self.cfg.max_updates, self.cfg.max_time)

    def checkpoint_due(self) -> bool:
        return self.scheduler.c >= self.next_checkpoint

    def _flush_events(self) -> None:
        log = self.scheduler.clock.log
        self.events.write_many(dict(zip(EVENT_KEYS, e)) for e in log[self.written:])
        self.written = len(log)

    def state_dict(self) -> tuple[dict, RunState]:
        """The checkpoint; the event log is written up to it first (its length is saved)."""
        self._flush_events()
        tensors, meta = self.scheduler.state_dict()
        self._mark_saved()
        return tensors, replace(self.state, round=self.scheduler.c, driver=meta,
                                wall_s=time.perf_counter() - self.t0)

    def checkpointed(self) -> None:
        """The scheduler deletes what no checkpoint left in the folder names (disk stores'
        segments; an unreadable or linked checkpoint JSON: nothing is deleted)."""
        records = kept_checkpoints(self.folder.checkpoints)
        if records is not None and all(isinstance(r.get("driver"), dict) for r in records):
            self.scheduler.collect([r["driver"] for r in records])

    def rollback(self, error: DivergenceError) -> bool:
        return False  # a multi-task run stops at a diverged update

    @contextmanager
    def progress(self) -> Iterator[Show]:
        def show(records: list[dict]) -> None:
            for r in records if self.verbose else ():
                print(f"[{self.cfg.method}] {r['task']} round {r['round']} "
                      f"t={r['sim_time_s']:.1f} acc={r['test_accuracy']:.4f} "
                      f"updates={r['updates']}", flush=True)

        yield show

    def summarise(self) -> None:
        self._flush_events()
        write_summary(self.folder.out, self.cfg, self.scheduler, time.perf_counter() - self.t0)

    def __enter__(self) -> TasksDriver:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.scattered:
            stop_workers()
        self.scheduler.close()  # its stores' open files


def write_summary(out: Path, cfg: RunConfig, scheduler: Scheduler, wall_s: float) -> dict:
    """``summary.json``: per-task time to target, time to finish all tasks, final rounds."""
    done = [t.done_time for t in scheduler.tasks]
    summary = {
        "method": cfg.method, "seed": cfg.seed, "updates": scheduler.c,
        "sim_time_s": scheduler.clock.now, "wall_s": round(wall_s, 3),
        "time_to_target": {t.name: t.done_time for t in scheduler.tasks},
        "time_all_tasks": max(done) if all(d is not None for d in done) else None,
        "final_round": {t.name: t.server.round for t in scheduler.tasks},
        **scheduler.summary(),  # the method's own fields (FedAST: its allocation log)
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    return summary
