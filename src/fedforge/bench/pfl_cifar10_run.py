"""One framework's run of ``fedforge bench pfl-cifar10``, in its own fresh process.

``python -m fedforge.bench.pfl_cifar10_run SPEC OUT`` reads the spec the parent wrote
(:mod:`fedforge.bench.pfl_cifar10`), runs the warm-up and timed iterations with the named
framework and writes ``OUT``: seconds of each timed iteration, of the warm-up (first)
iteration, start-up seconds (the parent's launch to the first iteration's start), test
accuracy after the last iteration, what ran and the versions. Central evaluation is never
timed: it happens after the timed iterations, and with a target (``--target``) also every
``--eval-every`` iterations, warm-up included, until the target is reached, with its time
left out of the clock (:class:`TargetClock`); ``OUT`` then also has the curve evaluated
(``[iteration, accuracy]`` pairs), ``iterations_to_target`` and ``s_to_target``.
"""

from __future__ import annotations

import copy
import importlib.metadata as md
import json
import logging
import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from fedforge.bench.pfl_cifar10 import Workload, cohort_ids, user_rows
from fedforge.bench.plain_fl import test_accuracy
from fedforge.models import build_model

RUN_ITERATIONS = 1500  # central_num_iterations of pfl-research's CIFAR-10 baseline


def _array(path: Path, mmap: bool = False) -> np.ndarray:
    """A cached array of this benchmark's run folder (never a pickle)."""
    return np.load(path, mmap_mode="r" if mmap else None, allow_pickle=False)


class Data:
    """The prepared arrays, normalised with the training set's channel statistics.

    ``lazy``: the training images stay the memory-mapped uint8 file and a batch is normalised
    when it is read (:class:`LazyImages`, to the same values), so a process that trains a few
    users at a time does not hold the whole set in float32 (0.6 GB each, more while it is
    made). Flower's actors load it so: at 9 GB each they had passed Ray's memory threshold,
    and Flower averaged only the updates of the actors Ray did not kill."""

    def __init__(self, spec: dict, train: bool = True, lazy: bool = False) -> None:
        folder = Path(spec["data"])
        mean = np.asarray(spec["mean"], np.float32).reshape(1, 3, 1, 1)
        std = np.asarray(spec["std"], np.float32).reshape(1, 3, 1, 1)
        self.norm = (mean, std)
        if train:  # Flower's driver process only evaluates
            raw = _array(folder / "train_x.npy", mmap=True)
            self.x = LazyImages(raw, self.norm) if lazy else self.images(raw)
            self.y = torch.from_numpy(_array(folder / "train_y.npy"))
        self.test_x = self.images(_array(folder / "test_x.npy", mmap=True))
        self.test_y = torch.from_numpy(_array(folder / "test_y.npy"))

    def images(self, raw: np.ndarray) -> torch.Tensor:
        return normalised(raw, self.norm)


def normalised(raw: np.ndarray, norm: tuple[np.ndarray, np.ndarray]) -> torch.Tensor:
    """uint8 images -> float32, scaled to [0, 1] and standardised per channel."""
    mean, std = norm
    return torch.from_numpy(((raw.astype(np.float32) / 255.0 - mean) / std).astype(np.float32))


class LazyImages:
    """uint8 images normalised when rows are read: ``images[rows]`` equals the same rows of
    the normalised array, element for element."""

    def __init__(self, raw: np.ndarray, norm: tuple[np.ndarray, np.ndarray]) -> None:
        self.raw, self.norm = raw, norm

    def __getitem__(self, rows: torch.Tensor) -> torch.Tensor:
        return normalised(self.raw[np.asarray(rows)], self.norm)


def initial_model(work: Workload) -> nn.Module:
    """The zoo's model with the seed's initial weights: the same in every framework."""
    torch.manual_seed(work.seed)
    return build_model(work.model, (3, 32, 32), 10)


def batches(work: Workload, user: int) -> list[torch.Tensor]:
    """The user's local epochs as rows of the training arrays, batch after batch."""
    rows = torch.arange(user_rows(work, user).start, user_rows(work, user).stop)
    usable = (work.per_user // work.batch) * work.batch
    return [b for _ in range(work.epochs) for b in rows[:usable].split(work.batch)]


def autocast(precision: str):
    return torch.autocast("cpu", torch.bfloat16, enabled=precision == "bf16")


def train_user(model: nn.Module, data: Data, work: Workload, user: int, precision: str) -> None:
    """Local SGD over the user's batches, ``torch.optim.SGD`` as most FL code writes it."""
    opt = torch.optim.SGD(model.parameters(), lr=work.local_lr)
    model.train()
    for b in batches(work, user):
        opt.zero_grad(set_to_none=True)
        with autocast(precision):
            logits = model(data.x[b])
        F.cross_entropy(logits.float(), data.y[b]).backward()
        opt.step()


def accuracy_of(net: nn.Module, data: Data, work: Workload) -> float:
    """``net``'s accuracy on the central test set, in fp32, its train/eval mode restored."""
    training = net.training
    net.eval()
    with torch.no_grad():
        acc = test_accuracy(net, data.test_x, data.test_y, work.eval_batch)
    net.train(training)
    return acc


class Clock:
    """Stamps at iteration boundaries -> start-up, first and timed iteration seconds."""

    def __init__(self, launched: float) -> None:
        self.launched = launched
        self.stamps: list[float] = []  # perf_counter at the start, then after each iteration,
        self.excluded = 0.0  # less the seconds spent in ``excluding`` before the stamp
        self.wall0 = 0.0

    def stamp(self) -> None:
        if not self.stamps:
            self.wall0 = time.time()
        self.stamps.append(time.perf_counter() - self.excluded)

    @contextmanager
    def excluding(self) -> Iterator[None]:
        """Leave the time spent inside out of every later stamp: evaluating is not training,
        and the iteration it falls in keeps the seconds it would have without it."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self.excluded += time.perf_counter() - start

    def result(self, warmup: int) -> dict:
        its = np.diff(self.stamps).tolist()
        return {"startup_s": self.wall0 - self.launched, "first_s": its[0],
                "iteration_s": its[warmup:] if len(its) > warmup else its[-1:]}


class TargetClock(Clock):
    """The clock of a row with a target: after every ``every``-th iteration (counted from the
    first, warm-up included) and until one reaches the target, the global model's test
    accuracy, its time excluded from the clock. Without a target it is a plain
    :class:`Clock`. Under torchrun only rank 0 evaluates (it alone reports)."""

    def __init__(self, launched: float, target: float | None = None, every: int = 1) -> None:
        super().__init__(launched)
        self.target, self.every = target, every
        self.curve: list[list[float]] = []  # [iteration, accuracy] of each evaluation
        self.reached: int | None = None
        self.rank0 = int(os.environ.get("RANK", 0)) == 0

    def due(self) -> bool:
        """Whether the iteration just stamped is evaluated."""
        it = len(self.stamps) - 1
        return (self.target is not None and self.reached is None and self.rank0 and it >= 1
                and it % self.every == 0)

    def evaluate(self, accuracy: Callable[[], float]) -> None:
        """Call right after an iteration's stamp: ``accuracy()`` when due, off the clock."""
        if not self.due():
            return
        with self.excluding():
            acc = float(accuracy())
        it = len(self.stamps) - 1
        self.curve.append([it, acc])
        if acc >= self.target:
            self.reached = it

    def target_result(self) -> dict:
        """The curve, the first iteration at or above the target and the training seconds
        from the first iteration's start through it (None: not reached), the iterations and
        training seconds run; empty without a target."""
        if self.target is None:
            return {}
        hit = self.reached
        return {"target": self.target, "eval_every": self.every, "curve": self.curve,
                "iterations_to_target": hit,
                "s_to_target": None if hit is None else self.stamps[hit] - self.stamps[0],
                "iterations_run": len(self.stamps) - 1,
                "trained_s": self.stamps[-1] - self.stamps[0]}


# --- the frameworks -------------------------------------------------------------------------


def run_fedforge(spec: dict, work: Workload, data: Data, clock: TargetClock
                 ) -> tuple[nn.Module, str, dict]:
    """fedforge's FedAvg (server lr = central lr) and engine through ``federated_round``."""
    from fedforge.algorithms import build_algorithm
    from fedforge.core.store import ClientStore
    from fedforge.engine import (
        AutoEngine,
        LoopEngine,
        ProcessEngine,
        VmapEngine,
        classification_loss,
    )
    from fedforge.engine.draw import RoundDraw
    from fedforge.engine.round import RoundSetup, federated_round

    model = initial_model(work)
    engine_name = spec["framework"].partition(":")[2] or "auto"
    rounds = spec["warmup"] + spec["iterations"]
    # auto sizes its calibration by the run it serves: pfl-research's 1500 iterations
    engine = {"auto": lambda: AutoEngine(budget_updates=RUN_ITERATIONS * work.cohort,
                                         allow_processes=True),
              "loop": LoopEngine, "vmap": VmapEngine, "procs": ProcessEngine}[engine_name]()
    algo = build_algorithm("fedavg", local_lr=work.local_lr, server_lr=work.central_lr)
    loss_fn = classification_loss(model, spec["precision"])
    params = {k: v.detach().clone() for k, v in model.named_parameters()}
    state = algo.server_init(params)
    store = ClientStore(work.users, {})
    weights = torch.ones(work.cohort, work.steps, work.batch)
    setup = RoundSetup(algo, engine, loss_fn, store, data.x, data.y)
    # the engine's model is left alone: the global parameters are evaluated in a copy
    evaluated = copy.deepcopy(model) if clock.target is not None else None
    try:
        clock.stamp()
        for t in range(1, rounds + 1):
            ids = cohort_ids(work, t)
            idx = torch.stack([torch.stack(batches(work, u)) for u in ids])
            draw = RoundDraw(torch.tensor(ids), idx, weights, round=t).with_keys(work.seed)
            res = federated_round(setup, params, state, draw)
            params, state = res.params, res.server_state
            clock.stamp()
            clock.evaluate(partial(_params_accuracy, evaluated, params, data, work))
        label = (engine.report().get("engine_auto", "auto") if engine_name == "auto"
                 else engine_name)
    finally:
        engine.close()
    model.load_state_dict(params, strict=False)
    return model, f"{label}, {torch.get_num_threads()} threads", {}


def _params_accuracy(net: nn.Module, params: dict, data: Data, work: Workload) -> float:
    """fedforge's global model is a dict of tensors: its accuracy, loaded into ``net``."""
    net.load_state_dict(params, strict=False)
    return accuracy_of(net, data, work)


def run_plain(spec: dict, work: Workload, data: Data, clock: TargetClock
              ) -> tuple[nn.Module, str, dict]:
    """The hand-written loop over single-threaded worker processes, one per core; the
    training images reach them once, through shared memory."""
    from fedforge.engine.distributed import shard_bounds
    from fedforge.engine.procs import WorkerPool, default_workers

    model = initial_model(work)
    n = default_workers()
    with WorkerPool(n, _PlainWorker, spec, data.x, data.y, name="plain worker") as pool:
        clock.stamp()
        for t in range(1, spec["warmup"] + spec["iterations"] + 1):
            ids = cohort_ids(work, t)
            state = {k: v.detach().clone() for k, v in model.state_dict().items()}
            shards = [ids[lo:hi] for lo, hi in (shard_bounds(len(ids), r, n) for r in range(n))]
            parts = pool.call("train", [(state, s) for s in shards if s])
            mean = {k: sum(p[k] for p in parts) / len(ids) for k in state}
            model.load_state_dict({k: state[k] + work.central_lr * (mean[k] - state[k])
                                   for k in state})
            clock.stamp()
            clock.evaluate(partial(accuracy_of, model, data, work))
    return model, f"{n} processes x 1 thread", {}


class _PlainWorker:
    """A plain-loop worker: the data and a model; trains the users it is sent."""

    def __init__(self, spec: dict, x: torch.Tensor, y: torch.Tensor) -> None:
        torch.set_num_threads(1)
        self.spec, self.work = spec, Workload(**spec["work"])
        self.data = Data(spec, train=False)
        self.data.x, self.data.y = x, y
        self.model = initial_model(self.work)

    def __call__(self, task: str, payload) -> dict:
        state, users = payload
        acc = {k: torch.zeros_like(v) for k, v in state.items()}
        for u in users:
            self.model.load_state_dict(state)
            train_user(self.model, self.data, self.work, u, self.spec["precision"])
            for k, v in self.model.state_dict().items():
                acc[k] += v.detach()
        return acc


class _NHWC(nn.Module):
    """pfl-research's benchmark feeds NHWC images and transposes them in the model."""

    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x.permute(0, 3, 1, 2))

    def loss(self, inputs, targets, eval: bool = False):  # noqa: A002 - pfl's signature
        self.eval() if eval else self.train()
        return F.cross_entropy(self(inputs), targets.long())

    @torch.no_grad()
    def metrics(self, inputs, targets, eval: bool = True):  # noqa: A002
        try:
            from pfl.metrics import Weighted
        except ImportError as e:  # only pfl-research calls this
            raise RuntimeError('the pfl row needs pip install "fedforge[bench]"') from e

        self.eval() if eval else self.train()
        logits = self(inputs)
        correct = float((logits.argmax(-1) == targets.long()).sum())
        loss = float(F.cross_entropy(logits, targets.long(), reduction="sum"))
        return {"loss": Weighted(loss, len(inputs)), "accuracy": Weighted(correct, len(inputs))}


def run_pfl(spec: dict, work: Workload, data: Data, clock: TargetClock
            ) -> tuple[nn.Module, str, dict]:
    """pfl-research's FedAvg, set up as its image-classification benchmark does."""
    try:
        from pfl.aggregate.simulate import SimulatedBackend
        from pfl.aggregate.weighting import WeightByUser
        from pfl.algorithm import FederatedAveraging, NNAlgorithmParams
        from pfl.callback.base import TrainingProcessCallback
        from pfl.data.federated_dataset import FederatedDataset
        from pfl.data.sampling import get_user_sampler
        from pfl.hyperparam import NNEvalHyperParams, NNTrainHyperParams
        from pfl.metrics import Metrics
        from pfl.model.pytorch import PyTorchModel
        from pfl.privacy import CentrallyAppliedPrivacyMechanism, NoPrivacy
    except ImportError as e:  # the parent checks first; this is for a direct call
        raise RuntimeError('the pfl row needs pip install "fedforge[bench]"') from e

    net = _NHWC(initial_model(work))
    rounds = spec["warmup"] + spec["iterations"]
    x_nhwc = data.x.permute(0, 2, 3, 1).contiguous()
    rows = [slice(user_rows(work, u).start, user_rows(work, u).stop) for u in range(work.users)]
    users = {u: [x_nhwc[r], data.y[r]] for u, r in enumerate(rows)}
    order = iter([u for t in range(1, rounds + 1) for u in cohort_ids(work, t)])
    train = FederatedDataset.from_slices(users, lambda: next(order))
    test_nhwc = data.test_x.permute(0, 2, 3, 1).contiguous()
    val_users = {0: [test_nhwc, data.test_y]}
    val = FederatedDataset.from_slices(val_users, get_user_sampler("random", [0]))
    params = [p for p in net.parameters() if p.requires_grad]
    amp = torch.bfloat16 if spec["precision"] == "bf16" else None
    model = PyTorchModel(model=net, local_optimizer_create=torch.optim.SGD,
                         central_optimizer=torch.optim.SGD(params, work.central_lr),
                         amp_dtype=amp)
    backend = SimulatedBackend(training_data=train, val_data=val, postprocessors=[
        WeightByUser(), NoPrivacy(), CentrallyAppliedPrivacyMechanism(NoPrivacy())])

    class Stamps(TrainingProcessCallback):
        def on_train_begin(self, *, model):
            clock.stamp()
            return Metrics()

        def after_central_iteration(self, aggregate_metrics, model, *, central_iteration):
            clock.stamp()  # the central update is applied: ``net`` is the global model
            clock.evaluate(partial(accuracy_of, net.net, data, work))
            return False, Metrics()

    FederatedAveraging().run(
        algorithm_params=NNAlgorithmParams(central_num_iterations=rounds,
                                           evaluation_frequency=10,
                                           train_cohort_size=work.cohort, val_cohort_size=0),
        backend=backend, model=model,
        model_train_params=NNTrainHyperParams(local_learning_rate=work.local_lr,
                                              local_num_epochs=work.epochs,
                                              local_batch_size=work.batch),
        model_eval_params=NNEvalHyperParams(local_batch_size=work.eval_batch),
        callbacks=[Stamps()])
    world = int(os.environ.get("WORLD_SIZE", 1))  # > 1 under torchrun (``pfl:procs``)
    label = (f"{world} processes x {torch.get_num_threads()} thread" if world > 1
             else f"1 process, {torch.get_num_threads()} threads")
    return net.net, label, {"pfl": md.version("pfl")}


_ACTOR: dict = {}  # per Flower actor process: the data and a model, loaded once


def flower_actor(spec: dict, work: Workload) -> tuple[Data, nn.Module]:
    """This Flower actor process's data and model, loaded on its first client.

    Module level, and called by its module's name: Flower's Ray backend sends the ClientApp
    with every message, and a function nested in :func:`run_flower` (or one of ``__main__``,
    which this module is in its subprocess) arrives with its own copy of ``_ACTOR``
    (cloudpickle copies such a function's globals), so every client would load the data
    again; this one is imported in the actor and its cache is the process's."""
    if not _ACTOR:
        print(f"flower actor {os.getpid()}: loading the training set", file=sys.stderr,
              flush=True)  # once per actor process: the log shows it
        torch.set_num_threads(1)
        _ACTOR.update(data=Data(spec, lazy=True), net=initial_model(work))
    return _ACTOR["data"], _ACTOR["net"]


def run_flower(spec: dict, work: Workload, data: Data, clock: TargetClock
               ) -> tuple[nn.Module, str, dict]:
    """Flower's FedAvg on its simulation engine: one supernode per user, the cohort's
    nodes trained each round, one CPU and one thread per client actor."""
    try:
        from fedforge.bench.flower_sim import simulate
    except ImportError as e:  # the parent checks first; this is for a direct call
        raise RuntimeError('the flower row needs pip install "fedforge[bench]"') from e
    from fedforge.engine.procs import default_workers

    net = initial_model(work)
    state: dict = {"failed": 0}
    simulate(_flower_server(spec, work, net, data, clock, state),
             _flower_clients(spec, work), work.users)
    if state["failed"]:  # its model would not be FedAvg's over the whole cohort
        rounds = spec["warmup"] + spec["iterations"]
        raise RuntimeError(f"flower: {state['failed']} of {rounds * work.cohort} client updates "
                           "failed (Ray's log above says why); the row is not reported")
    return net, f"{default_workers()} actors x 1 thread", {"flwr": md.version("flwr")}


def _flower_clients(spec: dict, work: Workload):
    """The nodes: each trains its user with the plain loop on its actor's data."""
    from fedforge.bench.flower_sim import (
        ArrayRecord,
        ClientApp,
        Context,
        Message,
        MetricRecord,
        RecordDict,
        partition_reply,
    )

    # by its module's name, not this process's __main__: pickled by reference (see the function)
    from fedforge.bench.pfl_cifar10_run import flower_actor

    client_app = ClientApp()

    @client_app.query()
    def query(msg: Message, context: Context) -> Message:
        return partition_reply(msg, context)

    @client_app.train()
    def train(msg: Message, context: Context) -> Message:
        data, cnet = flower_actor(spec, work)
        user = int(context.node_config["partition-id"])
        cnet.load_state_dict(msg.content["arrays"].to_torch_state_dict())
        train_user(cnet, data, work, user, spec["precision"])
        return Message(RecordDict({"arrays": ArrayRecord(cnet.state_dict()),
                                   "metrics": MetricRecord({"num-examples": work.per_user})}),
                       reply_to=msg)

    return client_app


def _cohort_fedavg(work: Workload, state: dict):
    """Flower's FedAvg on the nodes of the benchmark's cohort; counts failed replies, which
    Flower's FedAvg leaves out of the average."""
    from fedforge.bench.flower_sim import ConfigRecord, FedAvg, Message, MessageType, RecordDict

    class CohortFedAvg(FedAvg):
        def aggregate_train(self, server_round, replies):
            replies = list(replies)
            state["failed"] += sum(m.has_error() for m in replies)
            return super().aggregate_train(server_round, replies)

        def configure_train(self, server_round, arrays, config, grid):
            return [Message(RecordDict({"arrays": arrays, "config": ConfigRecord(
                        {"server-round": server_round})}), dst_node_id=state["node_of"][u],
                            message_type=MessageType.TRAIN)
                    for u in cohort_ids(work, server_round)]

    return CohortFedAvg(fraction_evaluate=0.0)


def _flower_server(spec: dict, work: Workload, net: nn.Module, data: Data,
                   clock: TargetClock, state: dict):
    """The server: finds every user's node, runs the strategy, stamps the clock after each
    round (Flower calls ``evaluate_fn`` before the first round too), evaluates the rounds
    the clock asks for and keeps the last round's model in ``net``."""
    from fedforge.bench.flower_sim import ArrayRecord, Context, Grid, ServerApp, node_of_partition

    rounds = spec["warmup"] + spec["iterations"]

    def evaluate_fn(server_round: int, arrays):
        clock.stamp()

        def accuracy() -> float:
            net.load_state_dict(arrays.to_torch_state_dict())
            return accuracy_of(net, data, work)

        clock.evaluate(accuracy)
        if server_round == rounds:
            net.load_state_dict(arrays.to_torch_state_dict())
        return None

    server_app = ServerApp()

    @server_app.main()
    def main(grid: Grid, context: Context) -> None:
        state["node_of"] = node_of_partition(grid, work.users)
        strategy = _cohort_fedavg(work, state)
        strategy.start(grid=grid, initial_arrays=ArrayRecord(net.state_dict()),
                       num_rounds=rounds, evaluate_fn=evaluate_fn)

    return server_app


RUNNERS = {"fedforge": run_fedforge, "plain": run_plain, "pfl": run_pfl, "flower": run_flower}


def main(spec_path: str, out_path: str) -> None:
    """Run the spec's framework and write its result (see the module docstring)."""
    # auto's choice and its calibration timings go to the row's log (its stderr)
    logging.getLogger("fedforge.engine.auto").setLevel(logging.INFO)
    logging.getLogger("fedforge.engine.auto").addHandler(logging.StreamHandler())
    spec = json.loads(Path(spec_path).read_text())
    work = Workload(**spec["work"])
    clock = TargetClock(spec["launched"], spec.get("target"), spec.get("eval_every", 1))
    framework = spec["framework"].partition(":")[0]
    data = Data(spec, train=framework != "flower")
    model, label, versions = RUNNERS[framework](spec, work, data, clock)
    if not clock.rank0:  # torchrun's other ranks: rank 0 reports
        return
    acc = accuracy_of(model, data, work)
    Path(out_path).write_text(json.dumps({
        **clock.result(spec["warmup"]), **clock.target_result(), "label": label, "accuracy": acc,
        "versions": {"torch": torch.__version__, **versions}}))


if __name__ == "__main__":
    main(*sys.argv[1:3])
