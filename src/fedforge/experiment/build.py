"""Building a run from its config: the data, model, algorithm and engine of one task
(:class:`Setup`), the tasks of a multi-task run, the round's draws, the resolved config.

Randomness is derived per round from ``(seed, round)``: client sampling, mini-batch order
and per-client round inputs use a fresh ``torch.Generator`` seeded by both, so a run resumed
from round k draws exactly what an uninterrupted run draws, with no RNG state to restore.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import torch

from fedforge.algorithms import Algorithm, build_algorithm, canonical_name, resolved_hparams
from fedforge.core.schedules import first_value
from fedforge.core.tree import Params
from fedforge.data import FederatedDataset, build_federated_dataset, load_dataset
from fedforge.data.batching import client_batches
from fedforge.data.client_split import ClientTests
from fedforge.data.loaders import is_population, load_population
from fedforge.data.partition import dirichlet_fixed_size
from fedforge.data.population import PopulationDataset, check_held_out, sample_clients
from fedforge.engine import (
    ChunkedEngine,
    build_engine,
    build_job_engine,
    classification_loss,
)
from fedforge.engine.draw import RoundDraw
from fedforge.engine.evaluate import evaluate
from fedforge.engine.targets import check_model_scores_positions
from fedforge.experiment.config import (
    AlgorithmConfig,
    ConfigError,
    RunConfig,
    TaskConfig,
    algorithm_kwargs,
    check_participation,
)
from fedforge.experiment.personal_eval import personal_data
from fedforge.models import build_model
from fedforge.models.init_from import init_network
from fedforge.robust.divergence import scale_lr
from fedforge.robust.hook import RobustRound
from fedforge.robust.setup import build_robust
from fedforge.schedulers.allocation_code import code_speed_factors
from fedforge.schedulers.buffered import BufferedServer
from fedforge.schedulers.fedast import ASYNC_METHODS, AsyncOptions, AsyncScheduler
from fedforge.schedulers.jobs import TaskExecutor
from fedforge.schedulers.multitask_sync import (
    StoreFactory,
    SyncOptions,
    SyncScheduler,
    memory_stores,
)
from fedforge.schedulers.scheduler import Scheduler
from fedforge.schedulers.task import Task
from fedforge.sim.delays import delay_from
from fedforge.sim.population import Population


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
class Setup:
    """Everything a single-task run needs, built once from a config; the round driver
    trains it and :class:`fedforge.experiment.runner.Experiment` adds the object API."""

    cfg: RunConfig
    data: FederatedDataset
    network: torch.nn.Module  # the architecture; the run's weights are held separately
    algorithm: Algorithm
    engine: ChunkedEngine
    device: torch.device
    robust: RobustRound | None = None  # attackers + robust aggregator (fedforge.robust)
    client_tests: ClientTests | None = None  # personalised evaluation (docs/personalised.md)

    @classmethod
    def from_config(cls, cfg: RunConfig, *, algorithm: Algorithm | None = None,
                    allow_processes: bool = False, **extra) -> Setup:
        """Build everything ``cfg`` names; ``algorithm``: ``cfg``'s, when the caller has built
        it already; ``allow_processes``: whether ``engine.name = "auto"`` may start worker
        processes (:func:`fedforge.engine.build_engine`); ``extra``: a subclass's own
        fields."""
        device = resolve_device(cfg.engine.device)
        data = build_data(cfg, device)
        torch.manual_seed(cfg.seed)
        network = build_model(cfg.model.name, data.input_shape, data.num_classes,
                              **cfg.model.options).to(device)
        if cfg.model.init_from is not None:  # fine-tuning from saved weights
            init_network(network, cfg.model.init_from)
        check_model_scores_positions(network, getattr(data, "train_y", None), data.name,
                                     cfg.model.name)  # next-token data: a causal LM
        if algorithm is None:
            algorithm = build_algorithm(cfg.algorithm.name, **algorithm_kwargs(cfg))
        try:
            check_participation(cfg, algorithm, trainable_clients(cfg, data))
        except ConfigError as exc:
            raise ValueError(str(exc)) from None
        data, client_tests = personal_data(  # each client's own test data, held-out clients
            data, algorithm, on=cfg.eval.personal, fraction=cfg.data.client_test_fraction,
            held_out=cfg.eval.held_out, finetune_steps=cfg.eval.finetune_steps,
            seed=cfg.seed, natural=cfg.data.partition == "natural",
            validation=cfg.eval.client_validation)
        algorithm.bind_data(data.input_shape, data.num_classes)  # e.g. FedPTR's synthetic set
        algorithm.bind_eval(test_scorer(network, data, cfg))  # e.g. FedPTR's projected model
        algorithm.bind_model(network)  # e.g. FedProto's features
        algorithm.bind_population(data.num_clients)  # e.g. AFL's weight per client
        if cfg.privacy.on:  # clipping, noise, Poisson cohorts, accountant (docs/privacy.md)
            from fedforge.privacy.algorithm import for_run  # noqa: PLC0415 (optional extra)

            algorithm = for_run(cfg, algorithm, trainable_clients(cfg, data),  # held out: never
                                dict(network.named_parameters()))  # in a Poisson cohort
        robust = build_robust(cfg, data)  # may flip attackers' labels in data.train_y
        engine = build_engine(  # robust aggregators need every client's delta
            cfg.engine, allow_processes=allow_processes, keep_deltas=robust is not None,
            budget_updates=cfg.rounds * cfg.server.clients_per_round)
        return cls(cfg, data, network, algorithm, engine, device, robust,
                   client_tests=client_tests, **extra)

    def scale_local_lr(self, scale: float) -> None:
        """Rebuild the algorithm with ``local_lr`` times ``scale`` (divergence rollback)."""
        if scale != 1.0:
            hp = scale_lr(self.cfg.algorithm.name, algorithm_kwargs(self.cfg), scale)
            self.algorithm = build_algorithm(self.cfg.algorithm.name, **hp)
            self.algorithm.bind_data(self.data.input_shape, self.data.num_classes)
            self.algorithm.bind_eval(test_scorer(self.network, self.data, self.cfg))
            self.algorithm.bind_model(self.network)
            self.algorithm.bind_population(self.data.num_clients)

    @property
    def client_sizes(self) -> torch.Tensor:
        if not hasattr(self, "_sizes"):
            self._sizes = self.data.client_sizes().cpu()
        return self._sizes

    def initial_params(self) -> Params:
        return {k: v.detach().clone() for k, v in self.network.named_parameters()}


def build_data(cfg: RunConfig, device: torch.device) -> FederatedDataset | PopulationDataset:
    """The run's clients on ``device`` in the run's float dtype: a population generated when
    drawn (``synthetic_population``, evaluated on ``eval.clients``), or a dataset split once."""
    if is_population(cfg.data.dataset):
        if cfg.data.partition != "natural":
            raise ValueError(f"data.partition: {cfg.data.dataset!r} clients are its own; use "
                             "natural")
        data = load_population(cfg.data.dataset, cfg.data.options, cfg.data.num_clients
                               ).for_eval(cfg.eval.clients, cfg.eval.held_out, cfg.seed)
    elif cfg.eval.clients is not None:
        raise ValueError("eval.clients: only a population dataset (synthetic_population) "
                         "samples clients to evaluate")
    else:
        splits = load_dataset(cfg.data.dataset, cfg.data.root, **cfg.data.options)
        data = build_federated_dataset(splits, cfg.data.partition, cfg.data.num_clients,
                                       cfg.seed, **cfg.data.partition_options)
        check_held_out(cfg.eval.held_out, data.num_clients)
    data = data.to(device).with_float_dtype(torch.get_default_dtype())  # float64: float64 data
    trainable = trainable_clients(cfg, data)
    if cfg.server.clients_per_round > trainable:
        raise ValueError(f"server.clients_per_round: {cfg.server.clients_per_round} is more "
                         f"than the {trainable} clients of this dataset that train")
    return data


def trainable_clients(cfg: RunConfig, data: FederatedDataset | PopulationDataset) -> int:
    """Clients ``0 .. n - 1`` are drawn to train: all but the ``eval.held_out`` highest ids,
    whatever the dataset (and whatever their training data)."""
    return data.num_clients - cfg.eval.held_out


def test_scorer(network: torch.nn.Module, data: FederatedDataset, cfg: RunConfig):
    """``params -> evaluate(...)`` on the test set, for parts' diagnostics (bind_eval)."""
    return lambda p: evaluate(network, p, data.test_x, data.test_y, cfg.eval.batch_size)


def sample_round(exp: Setup, round_: int, chosen: torch.Tensor | None = None) -> RoundDraw:
    """Draw the round's cohort and its mini-batch schedule (deterministic in seed, round);
    ``chosen``: the cohort a sampler picked (``server.sampler``), drawn uniformly if none."""
    cfg, data = exp.cfg, exp.data
    gen = round_generator(cfg.seed, round_)
    trainable = trainable_clients(cfg, data)  # the held-out highest ids are never drawn
    num = min(cfg.server.clients_per_round, trainable)
    if chosen is not None:
        client_ids, num = chosen, len(chosen)
    elif data.population:  # O(cohort): Floyd's draw over the clients that train
        client_ids = sample_clients(trainable, num, gen)
    else:
        client_ids = torch.randperm(trainable, generator=gen)[:num].sort().values
    if (privacy := exp.algorithm.privacy) is not None:  # Poisson over the trainable, rate q
        client_ids = privacy.sample_cohort(gen)
        num = len(client_ids)
    sizes = exp.client_sizes[client_ids]  # on the CPU, like the generator
    pos, weights = client_batches(
        sizes, cfg.client.local_steps, cfg.client.local_epochs, cfg.client.batch_size, gen
    )
    sample_idx = data.round_indices(client_ids, pos)  # [C, steps, batch] into data.train_x
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
    return RoundDraw(client_ids, sample_idx.to(dev), weights.to(dev), agg.to(dev, dtype), info,
                     counts=sizes, round=round_).with_keys(cfg.seed)


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
        every = cfg.checkpoint.period(multitask=True)  # total client updates
        return cfg.model_copy(update={
            "tasks": tasks, "method": cfg.method_name,
            "checkpoint": cfg.checkpoint.model_copy(update={"every": every})}), None
    table, algorithm = resolve_algorithm(cfg.algorithm, algorithm_kwargs(cfg))
    server = cfg.server.model_copy(
        update={"aggregation": cfg.server.aggregation or algorithm.aggregation})
    checkpoint = cfg.checkpoint.model_copy(
        update={"every": cfg.checkpoint.period(multitask=False)})
    return cfg.model_copy(update={"algorithm": table, "server": server,
                                  "checkpoint": checkpoint}), algorithm


def build_task_data(t: TaskConfig, num_clients: int, seed: int) -> FederatedDataset:
    splits = load_dataset(t.data.dataset, t.data.root, **t.data.options)
    n = t.data.num_clients or num_clients
    if t.data.partition == "dirichlet_fixed":
        opts = {"alpha": 0.1, "samples_per_client": 300, **t.data.partition_options}
        parts = dirichlet_fixed_size(splits.train_y.numpy(), n, float(opts["alpha"]),
                                     int(opts["samples_per_client"]), np.random.default_rng(seed))
        return FederatedDataset(splits.train_x, splits.train_y, splits.test_x, splits.test_y,
                                [torch.from_numpy(p) for p in parts], None, splits.num_classes,
                                tuple(splits.input_shape), splits.name, splits.vocab_size)
    nc = None if t.data.partition == "natural" and t.data.num_clients is None else n
    return build_federated_dataset(splits, t.data.partition, nc, seed,
                                   **t.data.partition_options)


def _scalar(hp: dict, key: str, default: float) -> float:
    v = hp.get(key, default)
    return float(first_value(v)) if not isinstance(v, (int, float)) else float(v)


def build_tasks(cfg: RunConfig, device: torch.device,
                executor_cls: type[TaskExecutor] = TaskExecutor) -> list[Task]:
    """Each task's data, model, algorithm, executor and server (the config was validated, so
    the method's driver serves every task's algorithm)."""
    tasks = []
    for m, tc in enumerate(cfg.tasks):
        data = build_task_data(tc, cfg.system.num_clients, cfg.seed + 1000 * m).to(device)
        torch.manual_seed(cfg.seed + 1000 * m)
        model = build_model(tc.model.name, data.input_shape, data.num_classes,
                            **tc.model.options).to(device)
        alg = build_algorithm(tc.algorithm.name, **tc.algorithm.hparams)
        params = {k: v.detach().clone() for k, v in model.named_parameters()}
        loss_fn = classification_loss(model, cfg.engine.precision)
        ex = executor_cls(m, alg, loss_fn, data.train_x, data.train_y, data.index_table,
                          data.client_sizes().cpu(), tc.client.local_steps, tc.client.batch_size,
                          cfg.seed, params, max_batch=cfg.async_.max_batch,
                          engine=build_job_engine(cfg.engine), drop_last=tc.client.drop_last)
        server = BufferedServer(alg, params, 1, cfg.system.num_clients)
        n_test = cfg.eval.max_test_samples  # evenly spaced: some test files are class-sorted
        keep = slice(None) if n_test is None else slice(None, None, max(1, len(data.test_y)
                                                                         // n_test))
        tx, ty = data.test_x[keep][:n_test], data.test_y[keep][:n_test]

        def ev(p, model=model, tx=tx, ty=ty):
            return evaluate(model, p, tx, ty, cfg.eval.batch_size)

        hp = tc.algorithm.hparams
        tasks.append(Task(cfg.task_name(m), alg, ex, server, tc.client.local_steps,
                          tc.step_time, _scalar(hp, "local_lr", 0.01),
                          _scalar(hp, "server_lr", 1.0), ev, tc.target, tc.eval_every))
    return tasks


def build_scheduler(cfg: RunConfig, tasks: list[Task], *, allow_processes: bool = False,
                    make_store: StoreFactory = memory_stores) -> Scheduler:
    """The method's scheduler of a multi-task run over ``tasks`` on one client pool
    (``allow_processes``: as for :meth:`Setup.from_config`; ``make_store``: the tasks'
    client stores of a synchronous method, in memory unless the runner passes its own)."""
    s = cfg.system
    pop = Population.build(s.num_clients, [tuple(c) for c in s.speed_classes], s.speed_seed,
                           s.available_fraction)
    if cfg.method == "fedast" and cfg.async_.allocation == "code":  # the code's shuffle
        pop.speed = code_speed_factors(s.num_clients, [tuple(c) for c in s.speed_classes],
                                       s.speed_seed)
    delay = delay_from(s)
    if cfg.method in ASYNC_METHODS:
        a = cfg.async_
        req = [t.requests or a.requests for t in cfg.tasks]
        opts = AsyncOptions(cfg.method, tuple(req), a.rb_ratio, a.buffer_size, a.variance_window,
                            a.c_period_factor, a.min_requests, fedasync_alpha=a.fedasync_alpha,
                            fedasync_a=a.fedasync_a, allocation=a.allocation)
        return AsyncScheduler(tasks, pop, delay, opts, cfg.seed)
    alloc = [t.sync_clients for t in cfg.tasks]
    opts = SyncOptions(cfg.method, cfg.sync.clients_per_round, cfg.sync.k,
                       tuple(alloc) if alloc[0] is not None else None, cfg.sync.ucb_c)
    return SyncScheduler(tasks, pop, delay, opts, cfg.seed,
                         build_engine(cfg.engine, allow_processes=allow_processes), make_store)
