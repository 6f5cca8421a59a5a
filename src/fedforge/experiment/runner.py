"""The synchronous experiment loop: sampling, rounds, evaluation, metrics, checkpoints.

Randomness is derived per round from ``(seed, round)``: client sampling, mini-batch order
and per-client round inputs use a fresh ``torch.Generator`` seeded by both, so a run resumed
from round k draws exactly what an uninterrupted run draws, with no RNG state to restore.
"""

from __future__ import annotations

import copy
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from fedforge.algorithms import Algorithm, build_algorithm, canonical_name
from fedforge.algorithms.base import (
    PREP_SAMPLES,
    PREP_SECONDS,
    SERVER_PREP_SAMPLES,
    SERVER_PREP_SECONDS,
)
from fedforge.algorithms.defaults import resolved_hparams
from fedforge.core.store import ClientStore
from fedforge.core.tree import Params, restore_like, tree_nbytes
from fedforge.data import FederatedDataset, build_federated_dataset, load_dataset
from fedforge.data.batching import client_batches
from fedforge.data.federated import gather_round_indices
from fedforge.engine import ChunkedEngine, build_engine, classification_loss
from fedforge.engine.distributed import (
    barrier,
    init_distributed,
    is_main_rank,
    make_client_store,
    world_size,
)
from fedforge.engine.local import set_matmul_precision
from fedforge.engine.round import federated_round
from fedforge.experiment.checkpoint import (
    last_checkpoint_note,
    latest_checkpoint_meta,
    load_checkpoint,
    resumable,
    save_checkpoint,
)
from fedforge.experiment.config import (
    AlgorithmConfig,
    ConfigError,
    RunConfig,
    algorithm_kwargs,
    check_participation,
    dump_config,
)
from fedforge.experiment.evaluate import evaluate
from fedforge.experiment.metrics import MetricsWriter
from fedforge.experiment.partition_stats import save_partition_stats
from fedforge.experiment.rundir import MULTITASK_MAY_CHANGE, RUN_MAY_CHANGE, claim_run_dir
from fedforge.models import build_model
from fedforge.models.init_from import init_network
from fedforge.robust.divergence import DivergenceError, log_event, scale_lr
from fedforge.robust.hook import RobustRound
from fedforge.robust.setup import build_robust
from fedforge.server.chain import ServerState
from fedforge.sim.cost import build_cost_model
from fedforge.sim.rounds import keep_clients, straggler_clock, straggler_round


def resolve_device(name: str) -> torch.device:
    """``auto`` -> CUDA if present; under torchrun, ``auto``/``cuda`` -> ``cuda:$LOCAL_RANK``
    so each rank of a multi-GPU node gets its own GPU."""
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"engine.device: {name!r} requested but CUDA is not available")
    if name in ("auto", "cuda") and torch.cuda.is_available():
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        return torch.device(f"cuda:{local_rank % torch.cuda.device_count()}")
    if name == "auto":
        return torch.device("cpu")
    return torch.device(name)


def round_generator(seed: int, round_: int) -> torch.Generator:
    """The round's RNG: independent of everything that happened in earlier rounds."""
    state = np.random.SeedSequence([seed, round_]).generate_state(1)[0]
    return torch.Generator().manual_seed(int(state))


@dataclass
class Experiment:
    """Everything a run needs, built once from a config; with a run folder, the object API.

    ``exp = Experiment.from_config(cfg, "runs/a")``, ``exp.run(20)`` (20 more rounds, resumable),
    ``exp.history`` (one record per round), ``exp.model()`` (the current global model as an
    ``nn.Module``), ``exp.save()``, ``Experiment.load("runs/a")`` (continue a run folder).
    The state between calls lives in the folder's checkpoints, as for ``fedforge run``."""

    cfg: RunConfig
    data: FederatedDataset
    network: torch.nn.Module  # the architecture; the run's weights are held separately
    algorithm: Algorithm
    engine: ChunkedEngine
    device: torch.device
    robust: RobustRound | None = None  # attackers + robust aggregator (fedforge.robust)
    out_dir: Path | None = None  # the run folder of the object API

    @classmethod
    def from_config(cls, cfg: RunConfig, out_dir: str | Path | None = None, *,
                    algorithm: Algorithm | None = None) -> Experiment:
        """Build everything ``cfg`` names; ``out_dir``: the folder :meth:`run` writes (the
        config is then resolved as ``fedforge run`` records it); ``algorithm``: ``cfg``'s,
        when the caller has built it already."""
        if out_dir is not None:
            cfg = resolve_config(cfg)
        device = resolve_device(cfg.engine.device)
        splits = load_dataset(cfg.data.dataset, cfg.data.root, **cfg.data.options)
        data = build_federated_dataset(
            splits, cfg.data.partition, cfg.data.num_clients, cfg.seed, **cfg.data.partition_options
        ).to(device).with_float_dtype(torch.get_default_dtype())  # float64 runs: float64 data
        if cfg.server.clients_per_round > data.num_clients:
            raise ValueError(f"server.clients_per_round: {cfg.server.clients_per_round} is more "
                             f"than the {data.num_clients} clients of this dataset")
        torch.manual_seed(cfg.seed)
        network = build_model(cfg.model.name, data.input_shape, data.num_classes,
                              **cfg.model.options).to(device)
        if cfg.model.init_from is not None:  # fine-tuning from saved weights
            init_network(network, cfg.model.init_from)
        if algorithm is None:
            algorithm = build_algorithm(cfg.algorithm.name, **algorithm_kwargs(cfg))
        try:
            check_participation(cfg, algorithm, data.num_clients)
        except ConfigError as exc:
            raise ValueError(str(exc)) from None
        algorithm.bind_data(data.input_shape, data.num_classes)  # e.g. FedPTR's synthetic set
        algorithm.bind_eval(test_scorer(network, data, cfg))  # e.g. FedPTR's projected model
        if cfg.privacy.on:  # clipping, noise, Poisson cohorts, accountant (docs/privacy.md)
            from fedforge.privacy.algorithm import for_run  # noqa: PLC0415 (optional extra)

            algorithm = for_run(cfg, algorithm, data.num_clients, dict(network.named_parameters()))
        engine_kw = {} if cfg.engine.name == "loop" else {
            "chunk_size": cfg.engine.chunk_size, "compile": cfg.engine.compile}
        if cfg.engine.name == "procs":  # its workers run the loop: no compiled chunks
            engine_kw = {"chunk_size": cfg.engine.chunk_size}
        if cfg.engine.name == "auto":  # calibrates only where it costs <= 2 % of the run
            engine_kw["budget_updates"] = cfg.rounds * cfg.server.clients_per_round
        engine = build_engine(cfg.engine.name, **engine_kw)
        robust = build_robust(cfg, data)  # may flip attackers' labels in data.train_y
        if robust is not None:
            engine.keep_deltas = True  # robust aggregators need every client's delta
        return cls(cfg, data, network, algorithm, engine, device, robust,
                   None if out_dir is None else Path(out_dir))

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
        run_experiment(self.cfg.model_copy(update={"rounds": total}), self._folder(),
                       resume=True, progress=progress)
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
    def scale_local_lr(self, scale: float) -> None:
        """Rebuild the algorithm with ``local_lr`` times ``scale`` (divergence rollback)."""
        if scale != 1.0:
            hp = scale_lr(self.cfg.algorithm.name, algorithm_kwargs(self.cfg), scale)
            self.algorithm = build_algorithm(self.cfg.algorithm.name, **hp)
            self.algorithm.bind_data(self.data.input_shape, self.data.num_classes)
            self.algorithm.bind_eval(test_scorer(self.network, self.data, self.cfg))

    @property
    def client_sizes(self) -> torch.Tensor:
        if not hasattr(self, "_sizes"):
            self._sizes = self.data.client_sizes().cpu()
        return self._sizes

    def initial_params(self) -> Params:
        return {k: v.detach().clone() for k, v in self.network.named_parameters()}


def test_scorer(network: torch.nn.Module, data: FederatedDataset, cfg: RunConfig):
    """``params -> evaluate(...)`` on the test set, for parts' diagnostics (bind_eval)."""
    return lambda p: evaluate(network, p, data.test_x, data.test_y, cfg.eval.batch_size)


def sample_round(exp: Experiment, round_: int):
    """Draw the round's cohort and its mini-batch schedule (deterministic in seed, round)."""
    cfg, data = exp.cfg, exp.data
    gen = round_generator(cfg.seed, round_)
    num = min(cfg.server.clients_per_round, data.num_clients)
    client_ids = torch.randperm(data.num_clients, generator=gen)[:num].sort().values
    if (privacy := getattr(exp.algorithm, "privacy", None)) is not None:  # Poisson, rate q
        client_ids = privacy.sample_cohort(gen)
        num = len(client_ids)
    sizes = exp.client_sizes[client_ids]  # on the CPU, like the generator
    pos, weights = client_batches(
        sizes, cfg.client.local_steps, cfg.client.local_epochs, cfg.client.batch_size, gen
    )
    sample_idx = gather_round_indices(data.index_table, client_ids, pos)  # [C, steps, batch]
    info = exp.algorithm.round_info(num, gen)
    if (cfg.server.aggregation or exp.algorithm.aggregation) == "num_samples":
        agg = sizes.double() / sizes.sum().clamp_min(1)
    else:
        agg = torch.full((num,), 1.0 / max(num, 1), dtype=torch.float64)
        if bool((sizes == 0).any()):  # empty clients (warned at partition time): weight 0
            nonempty = (sizes > 0).double()
            agg = nonempty / nonempty.sum().clamp_min(1)
    dev = exp.device
    info = {k: v.to(dev) for k, v in info.items()}
    dtype = torch.get_default_dtype()  # the model's dtype: float64 runs stay float64
    return (client_ids, sample_idx.to(dev), weights.to(dev), agg.to(dev, dtype), info)


def resolve_algorithm(config: AlgorithmConfig, kwargs: dict | None = None
                      ) -> tuple[AlgorithmConfig, Algorithm]:
    """An ``[algorithm]`` table with its canonical name and every hyper-parameter written
    out (``kwargs``: what the factory is called with, default the table's own; keys not in
    the table came from ``client.*`` and stay there), and the algorithm, built once."""
    kwargs = dict(config.hparams) if kwargs is None else kwargs
    from_client = set(kwargs) - set(config.hparams)
    full = resolved_hparams(config.name, kwargs)
    hparams = {k: v for k, v in full.items() if k not in from_client and v is not None}
    return (AlgorithmConfig(name=canonical_name(config.name), **hparams),
            build_algorithm(config.name, **kwargs))


def resolve_config(cfg: RunConfig) -> RunConfig:
    """``cfg`` with every default it relies on written out: the algorithm's (each task's)
    canonical name and hyper-parameters, the aggregation weighting, the checkpoint period
    and the multi-task method."""
    return resolve_run(cfg)[0]


def resolve_run(cfg: RunConfig) -> tuple[RunConfig, Algorithm | None]:
    """:func:`resolve_config` plus the single-task run's algorithm, built once for both."""
    if cfg.multitask:
        tasks = [t.model_copy(update={"algorithm": resolve_algorithm(t.algorithm)[0]})
                 for t in cfg.tasks]
        every = cfg.checkpoint.every or 2000  # total client updates
        return cfg.model_copy(update={
            "tasks": tasks, "method": cfg.method or "fedast",
            "checkpoint": cfg.checkpoint.model_copy(update={"every": every})}), None
    table, algorithm = resolve_algorithm(cfg.algorithm, algorithm_kwargs(cfg))
    server = cfg.server.model_copy(
        update={"aggregation": cfg.server.aggregation or algorithm.aggregation})
    checkpoint = cfg.checkpoint.model_copy(update={"every": cfg.checkpoint.every or 10})
    return cfg.model_copy(update={"algorithm": table, "server": server,
                                  "checkpoint": checkpoint}), algorithm


def run_experiment(
    cfg: RunConfig, out_dir: str | Path, *, resume: bool = False, progress: bool = True,
    overwrite: bool = False, stop_at: float | None = None,
) -> list[dict]:
    """Run ``cfg``, writing ``out_dir/{config.resolved.toml, metrics.jsonl, checkpoints/}``
    (multi-task runs also ``events.jsonl`` and ``summary.json``).

    ``stop_at``: end a single-task run after its first evaluation with ``test_accuracy`` at
    or above this value (``fedforge bench w3``); that round is checkpointed as the last one.

    The one entry for every kind of run: without ``tasks``, synchronous rounds of one task
    (this module); with a ``[[tasks]]`` list, ``cfg.method``'s multi-task driver
    (:mod:`fedforge.experiment.async_runner`). The folder is locked while the run writes it;
    one that holds an earlier run needs ``resume`` or ``overwrite``
    (fedforge.experiment.rundir); RunDirError otherwise."""
    cfg, algorithm = resolve_run(cfg)  # config.resolved.toml records every default used
    if stop_at is not None and (cfg.multitask or world_size() > 1):
        raise ValueError("stop_at: only single-task runs in one process stop at an accuracy")
    out = Path(out_dir)
    may_change = MULTITASK_MAY_CHANGE if cfg.multitask else RUN_MAY_CHANGE
    if cfg.engine.name == "distributed" and init_distributed() and not is_main_rank():
        if cfg.multitask and _scatters(cfg):  # serves rank 0's jobs, writes nothing
            return _run_tasks(cfg, out_dir, resume=resume, progress=progress)
        out = out / f"rank{torch.distributed.get_rank()}"  # each rank claims what it writes
    with claim_run_dir(out, lambda path: dump_config(cfg, path), resume=resume,
                       overwrite=overwrite, may_change=may_change):
        if cfg.multitask:
            return _run_tasks(cfg, out_dir, resume=resume, progress=progress)
        return _run_experiment(cfg, out_dir, resume=resume, progress=progress,
                               algorithm=algorithm, stop_at=stop_at)


def _scatters(cfg: RunConfig) -> bool:
    """Asynchronous methods under torchrun: rank 0 simulates, every rank trains jobs."""
    from fedforge.sim.fedast import ASYNC_METHODS  # noqa: PLC0415

    return cfg.method in ASYNC_METHODS and world_size() > 1


def _run_tasks(cfg: RunConfig, out_dir: str | Path, *, resume: bool, progress: bool
               ) -> list[dict]:
    from fedforge.experiment.async_runner import run_tasks  # noqa: PLC0415 (imports us)

    return run_tasks(cfg, out_dir, resolve_device(cfg.engine.device), resume=resume,
                     progress=progress)


def _run_experiment(
    cfg: RunConfig, out_dir: str | Path, *, resume: bool = False, progress: bool = True,
    algorithm: Algorithm | None = None, stop_at: float | None = None,
) -> list[dict]:
    from fedforge.experiment.progress import RoundProgress, setup_step

    out = run_dir = Path(out_dir)
    if cfg.engine.name == "distributed" and init_distributed() and not is_main_rank():
        out = out / f"rank{torch.distributed.get_rank()}"  # rank 0 owns the run directory
    out.mkdir(parents=True, exist_ok=True)
    with setup_step(f"{cfg.data.dataset}: loading and partitioning the data, building the "
                    f"model and algorithm", enabled=progress):
        exp = Experiment.from_config(cfg, algorithm=algorithm)
    if (privacy := getattr(exp.algorithm, "privacy", None)) is not None:  # stop at target ε
        if resume and (run_dir / "checkpoints" / "latest.json").is_file():  # privacy ledger
            from fedforge.privacy.algorithm import resume as resume_privacy  # noqa: PLC0415

            exp.algorithm = resume_privacy(
                exp.algorithm, *latest_checkpoint_meta(run_dir / "checkpoints"), cfg.rounds)
            privacy = exp.algorithm.privacy
        cfg = cfg.model_copy(update={"rounds": privacy.last_round(cfg.rounds)})
    if is_main_rank():
        with setup_step(f"writing {out / 'partition.json'}", enabled=progress):
            save_partition_stats(exp.data, out)  # client sizes, label counts: partition.json
    set_matmul_precision(cfg.engine.precision)
    loss_fn = classification_loss(exp.network, cfg.engine.precision)
    params = exp.initial_params()
    server_state = exp.algorithm.server_init(params)
    # under torchrun each rank keeps its share of the clients' state (sharded by client id)
    store = make_client_store(exp.data.num_clients, exp.algorithm.client_init(params),
                              exp.device, storage="cpu" if cfg.engine.client_state == "host"
                              else None)
    start, wall_offset, bytes_up, bytes_down = 1, 0.0, 0, 0
    sim_time_s = 0.0  # simulated seconds (fedforge.sim.cost), cumulative
    lr_scale, rollbacks = 1.0, 0  # divergence rollbacks so far and the local-lr factor
    prep_s = 0.0  # wall seconds of work around local rounds (FedPTR: trajectory matching)
    ckpt_dir = run_dir / "checkpoints"  # written by rank 0, read by every rank on resume
    meta: dict = {}
    if resume and resumable(ckpt_dir):
        params, server_state, store, meta = restore_or_init(exp, ckpt_dir, store)
        start, wall_offset = meta["round"] + 1, meta["wall_s"]
        bytes_up, bytes_down = meta["bytes_up"], meta["bytes_down"]
        sim_time_s, prep_s = meta["sim_time_s"], meta["prep_s"]
        lr_scale, rollbacks = meta["lr_scale"], meta["rollbacks"]
        exp.engine.load_state_dict(meta.get("engine", {}))  # auto: the recorded choice
        exp.scale_local_lr(lr_scale)
    metrics = MetricsWriter(out / "metrics.jsonl", truncate_after=start - 1)
    t0 = time.perf_counter() - wall_offset
    down_per_client, up_per_client = exp.algorithm.message_nbytes(params, server_state)
    cost = build_cost_model(cfg.sim, exp.network, exp.data.input_shape, cfg.client.batch_size)
    stragglers = straggler_clock(cfg.sim, exp.data.num_clients, cfg.seed, meta.get("sim_clock"))
    history = metrics.records
    # closing the engine ends its worker processes (procs), also after an error or Ctrl-C
    with RoundProgress.for_run(cfg, out, start, enabled=progress) as bar, exp.engine:
        t = start - 1
        while t < cfg.rounds:  # a while loop: a divergence rollback moves t back
            t += 1
            client_ids, sample_idx, weights, agg, info = sample_round(exp, t)
            if stragglers is not None:  # sim.stragglers: only the first k arrivals train
                keep, round_s = straggler_round(stragglers, t, client_ids, weights, cost,
                                                down_per_client, up_per_client)
                client_ids, sample_idx, weights, agg, info = keep_clients(
                    keep, client_ids, sample_idx, weights, agg, info)
            try:
                params, server_state, cohort = federated_round(
                    exp.algorithm, exp.engine, loss_fn, params, server_state, store, client_ids,
                    exp.data.train_x, exp.data.train_y, sample_idx, weights, agg_weights=agg,
                    info=info, round_=t, divergence=cfg.divergence, robust=exp.robust,
                    sample_counts=exp.client_sizes[client_ids.cpu()], seed=cfg.seed,
                )
            except DivergenceError as exc:
                event = {"round": t, "policy": cfg.divergence, "faults": exc.faults}
                if cfg.divergence != "rollback" or rollbacks >= cfg.max_rollbacks:
                    log_event(out, {**event, "action": "stop"})
                    exc.args = (f"{exc}; stopped (policy {cfg.divergence}, {rollbacks} "
                                f"rollbacks); {last_checkpoint_note(ckpt_dir)}",)
                    raise
                rollbacks, lr_scale = rollbacks + 1, lr_scale * cfg.rollback_lr_factor
                exp.scale_local_lr(lr_scale)
                params, server_state, store, meta = restore_or_init(exp, ckpt_dir, store)
                t = meta.get("round", 0)
                bytes_up, bytes_down = meta.get("bytes_up", 0), meta.get("bytes_down", 0)
                sim_time_s = meta.get("sim_time_s", 0.0)
                prep_s = meta.get("prep_s", 0.0)
                stragglers = straggler_clock(cfg.sim, exp.data.num_clients, cfg.seed,
                                             meta.get("sim_clock"))
                metrics = MetricsWriter(out / "metrics.jsonl", truncate_after=t)
                history = metrics.records
                log_event(out, {**event, "action": f"rollback to round {t}",
                                "lr_scale": lr_scale})
                continue
            if "skipped_clients" in cohort.metrics:
                log_event(out, {"round": t, "policy": "skip_client",
                                "skipped": cohort.metrics["skipped_clients"].tolist()})
            if exp.algorithm.codec is not None:  # encoded size may vary by round (MARINA)
                down_per_client, up_per_client = exp.algorithm.message_nbytes(
                    params, server_state, round_=t)
            bytes_down += down_per_client * len(client_ids)
            bytes_up += up_per_client * len(client_ids)
            client_steps, server_steps = prep_steps(cohort.metrics, cfg.client.batch_size)
            sim_time_s += round_s if stragglers is not None else cost.round_seconds(
                cohort.metrics["steps"].cpu().numpy() + client_steps, down_per_client,
                up_per_client)
            sim_time_s += server_steps * cost.step_time_s  # server work before the broadcast
            trained = cohort.metrics["steps"] > 0  # empty clients report no loss
            train_loss = (cohort.metrics["loss"][trained].mean().item() if bool(trained.any())
                          else 0.0)
            prep_s += prep_seconds(cohort.metrics)
            if not np.isfinite(train_loss):
                raise FloatingPointError(f"round {t}: training loss is {train_loss} (diverged); "
                                         f"{last_checkpoint_note(ckpt_dir)}")
            record = None
            if is_main_rank():  # every round is recorded; evaluated ones carry test metrics
                evaluating = t % cfg.eval.every == 0 or t == cfg.rounds
                record = {"round": t, "train_loss": train_loss}
                if evaluating:
                    record.update(evaluate(
                        exp.network, exp.algorithm.eval_params(params, server_state),
                        exp.data.test_x, exp.data.test_y, cfg.eval.batch_size,
                        exp.data.client_test_indices if cfg.eval.per_client else None,
                    ))
                record.update({"bytes_up": bytes_up, "bytes_down": bytes_down,
                               # persistent per-client state (SCAFFOLD c_i, FAdamGC y_i/v_i..)
                               "client_state_bytes_per_client": store.nbytes_per_client(),
                               "bytes_up_round": up_per_client * len(client_ids),
                               "bytes_down_round": down_per_client * len(client_ids),
                               "sim_time_s": round(sim_time_s, 3),
                               "wall_s": round(time.perf_counter() - t0, 3)})
                if exp.algorithm.prepares:  # work around the local rounds, wall seconds
                    record["prep_s"] = round(prep_s, 3)
                if evaluating:
                    record.update(cohort_means(cohort.metrics.get("parts", {}), trained))
                    record.update(exp.algorithm.server_metrics(server_state, store.state))
                    record.update(exp.engine.report())  # auto: its choice and timings, once
                metrics.write(record)
            stop = (stop_at is not None and record is not None
                    and record.get("test_accuracy", -1.0) >= stop_at)
            if t % cfg.checkpoint.every == 0 or t == cfg.rounds or stop:
                clients = store.state_dict()  # a collective when sharded: every rank
                if is_main_rank():
                    save_checkpoint(
                        ckpt_dir, t,
                        {"params": params, "server": server_state.tree(), "clients": clients},
                        {"wall_s": time.perf_counter() - t0, "bytes_up": bytes_up,
                         "bytes_down": bytes_down, "seed": cfg.seed, "prep_s": prep_s,
                         "sim_time_s": sim_time_s,
                         "sim_clock": stragglers.state_dict() if stragglers is not None else None,
                         "lr_scale": lr_scale, "rollbacks": rollbacks,
                         "engine": exp.engine.state_dict(),  # auto: choice, conv plans
                         # σ, q and steps of every round so far (fedforge.privacy.ledger)
                         **({} if privacy is None else {"privacy": privacy.ledger_meta(t)}),
                         "rng": "derived per round from (seed, round)"},
                        keep=cfg.checkpoint.keep,
                    )
                barrier()  # the other ranks may read it (resume, rollback)
            bar.advance(t, record)
            if stop:
                break
    return history


def restore_or_init(
    exp: Experiment, ckpt_dir: Path, store: ClientStore
) -> tuple[Params, ServerState, ClientStore, dict]:
    """Load the last complete checkpoint into ``store``, or reset everything to the initial
    state when there is none yet -> (params, server state, store, checkpoint meta or {}).

    Resume and rollback both come here. Every tensor is rebuilt from a fresh state of this
    run's algorithm, in the model's parameter order, so codec and part states are never
    dropped and nothing depends on the file's key order."""
    template = exp.initial_params()
    if not (ckpt_dir / "latest.json").is_file():
        fresh = ClientStore(exp.data.num_clients, exp.algorithm.client_init(template), "cpu")
        if not fresh.empty:
            store.load_state_dict(fresh.state_dict())
        return template, exp.algorithm.server_init(template), store, {}
    tensors, meta = load_checkpoint(ckpt_dir, exp.device)
    check_meta(meta, ckpt_dir)
    params = restore_like(template, tensors["params"], "params")
    server_state = exp.algorithm.server.restore(template, tensors.get("server", {}))
    store.load_state_dict(tensors.get("clients", {}))
    return params, server_state, store, meta


RUN_META = {"round": int, "wall_s": (int, float), "bytes_up": int, "bytes_down": int,
            "sim_time_s": (int, float), "prep_s": (int, float), "lr_scale": (int, float),
            "rollbacks": int}
"""What a sync checkpoint's JSON must hold for a resume to continue the run's counters."""


def check_meta(meta: dict, ckpt_dir: Path) -> None:
    """One-line error naming the checkpoint field that is missing or of the wrong type."""
    for key, kind in RUN_META.items():
        value = meta.get(key)
        if isinstance(value, bool) or not isinstance(value, kind):
            raise ValueError(f"{ckpt_dir}: checkpoint field {key!r} is missing or not a "
                             f"number ({value!r})")
    if not 0 < meta["lr_scale"] < float("inf"):  # a factor of the local lr, never <= 0
        raise ValueError(f"{ckpt_dir}: checkpoint field 'lr_scale' must be a positive, finite "
                         f"number, got {meta['lr_scale']!r}")
    if meta.get("sim_clock") is not None and not isinstance(meta["sim_clock"], dict):
        raise ValueError(f"{ckpt_dir}: checkpoint field 'sim_clock' is not a table")


def prep_seconds(metrics: dict) -> float:
    """Wall seconds a round spent on work around the local rounds (clients and server)."""
    keys = (PREP_SECONDS, SERVER_PREP_SECONDS)
    return sum(float(metrics[k].sum()) for k in keys if k in metrics)


def prep_steps(metrics: dict, batch_size: int) -> tuple[np.ndarray | float, float]:
    """That work in local-step equivalents (per-sample gradients / batch size) for the
    simulated clock: ``([C] per client, or 0.0; server)``."""
    client = metrics.get(PREP_SAMPLES)
    server = metrics.get(SERVER_PREP_SAMPLES)
    return (0.0 if client is None else client.cpu().numpy() / batch_size,
            0.0 if server is None else float(server) / batch_size)


def cohort_means(per_client: dict, trained: torch.Tensor) -> dict[str, float]:
    """Parts' per-client diagnostics -> their mean over the clients that trained."""
    if not bool(trained.any()):
        return {}
    return {k: float(v[trained].double().mean()) for k, v in per_client.items()}


def model_nbytes(params: Params) -> int:
    return tree_nbytes(params)


def read_metrics(run_dir: str | Path) -> list[dict]:
    path = Path(run_dir) / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
