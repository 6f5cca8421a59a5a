"""One framework's run of ``fedforge bench pfl-ditto``, in its own fresh process.

``python -m fedforge.bench.pfl_speed_run SPEC OUT`` reads the spec the parent wrote
(:mod:`fedforge.bench.pfl_speed`), builds the cohort's random data and the initial model, runs
the warm-up and timed Ditto rounds with the named framework and writes ``OUT`` (JSON: seconds
of each round, what ran, the accuracies) and ``OUT.safetensors`` (the global model and the sampled
clients' personal models after the last round, which the parent compares across frameworks).
Evaluation happens after the timed rounds and is never timed.

The plain loop is Ditto as PFLlib and FL-bench write it: each client's personal model is its
own ``nn.Module`` in a dict, trained first with a prox-SGD optimizer pulled toward the model
the client received, then the received model is trained with ``torch.optim.SGD`` on the same
batches; clients run one after another, split over single-threaded worker processes (one
per core, :class:`fedforge.engine.procs.WorkerPool`, as the other plain rows), and the
server averages the clients' global copies.
"""

from __future__ import annotations

import copy
import json
import sys
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from torch import nn

from fedforge.bench.pfl_cifar10_run import Clock
from fedforge.bench.workload import Workload, make_data
from fedforge.models import build_model

RUN_ROUNDS = 1000  # the run auto's calibration is sized for, as W1's rows (workload.py)


def workload(spec: dict) -> Workload:
    """The spec's workload (JSON turned its shape into a list)."""
    work = Workload(**spec["work"])
    return replace(work, input_shape=tuple(work.input_shape))


def initial_model(work: Workload, seed: int = 0) -> nn.Module:
    """The zoo's model with the seed's initial weights: the same in both frameworks."""
    torch.manual_seed(seed)
    return build_model(work.model, work.input_shape, work.num_classes)


# --- the plain loop -------------------------------------------------------------------------


class ProxSGD(torch.optim.Optimizer):
    """SGD on ``f(v) + lam/2 ||v - anchor||²``: ``v <- v - lr (grad + lam (v - anchor))``
    (PFLlib's ``PerturbedGradientDescent``, FL-bench's Ditto personal step)."""

    def __init__(self, params: Iterable[torch.Tensor], anchor: Iterable[torch.Tensor],
                 lr: float, lam: float) -> None:
        super().__init__(params, {"lr": lr, "lam": lam})
        self.anchor = [a.detach() for a in anchor]

    @torch.no_grad()
    def step(self, closure: Any = None) -> None:  # closure: torch's signature
        anchors = iter(self.anchor)
        for group in self.param_groups:
            for p in group["params"]:
                a = next(anchors)
                if p.grad is not None:
                    p.add_(p.grad + group["lam"] * (p - a), alpha=-group["lr"])


def _epoch(model: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor,
           batches: torch.Tensor) -> None:
    for b in batches:
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(x[b]), y[b]).backward()
        opt.step()


def plain_ditto_client(work_model: nn.Module, personal: nn.Module,
                       global_state: dict[str, torch.Tensor], x: torch.Tensor,
                       y: torch.Tensor, batches: torch.Tensor, lr: float, lam: float) -> None:
    """One client's Ditto round in place: ``personal`` takes prox-SGD steps toward the
    received model, then ``work_model`` (loaded with it) takes SGD steps, on ``batches``."""
    anchor = [global_state[name] for name, _ in personal.named_parameters()]
    _epoch(personal, ProxSGD(personal.parameters(), anchor, lr, lam), x, y, batches)
    work_model.load_state_dict(global_state)
    _epoch(work_model, torch.optim.SGD(work_model.parameters(), lr=lr), x, y, batches)


def plain_ditto_sum(work_model: nn.Module, personal: dict[int, nn.Module],
                    global_state: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor,
                    idx: torch.Tensor, lr: float, lam: float) -> dict[str, torch.Tensor]:
    """The clients of ``personal`` one after another (client ``c`` trains on ``idx[c]``):
    the sum of their trained global copies (the server divides by the cohort)."""
    acc = {k: torch.zeros_like(v) for k, v in global_state.items()}
    for c, model in personal.items():
        plain_ditto_client(work_model, model, global_state, x, y, idx[c], lr, lam)
        for k, v in work_model.state_dict().items():
            acc[k] += v.detach()
    return acc


class _DittoWorker:
    """A plain-loop worker: the data, a working model and its clients' personal models."""

    def __init__(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor, idx: torch.Tensor,
                 lr: float, lam: float) -> None:
        self.model = copy.deepcopy(model)
        self.x, self.y, self.idx, self.lr, self.lam = x, y, idx, lr, lam
        self.personal: dict[int, nn.Module] = {}

    def __call__(self, task: str, payload: Any) -> Any:
        if task == "clients":  # every client starts from the initial model (PFLlib)
            self.personal = {c: copy.deepcopy(self.model) for c in payload}
            return None
        if task == "round":
            return plain_ditto_sum(self.model, self.personal, payload, self.x, self.y,
                                   self.idx, self.lr, self.lam)
        sample = payload  # "eval": correct predictions of the personal models, sampled states
        right = sum(correct(m, None, self.x, self.y, self.idx[c])
                    for c, m in self.personal.items())
        return right, {c: _state(m) for c, m in self.personal.items() if c in sample}


def run_plain(spec: dict, work: Workload, data: tuple, clock: Clock) -> dict:
    from fedforge.engine.distributed import shard_bounds
    from fedforge.engine.procs import WorkerPool, default_workers

    x, y, idx = data
    cohort, n = spec["cohort"], min(default_workers(), spec["cohort"])
    model = initial_model(work)
    shards = [range(*shard_bounds(cohort, r, n)) for r in range(n)]
    with WorkerPool(n, _DittoWorker, model, x, y, idx, spec["lr"], spec["lam"],
                    name="plain Ditto worker") as pool:
        pool.call("clients", [list(s) for s in shards])
        clock.stamp()
        for _ in range(spec["warmup"] + spec["iterations"]):
            state = _state(model)
            sums = pool.call("round", [state] * n)
            model.load_state_dict({k: sum(s[k] for s in sums) / cohort for k in state})
            clock.stamp()
        evals = pool.call("eval", [set(spec["sample"])] * n)
    personal = {c: s for _, part in evals for c, s in part.items()}
    return {"label": f"{n} processes x 1 thread", "global": _state(model),
            "personal_correct": sum(r for r, _ in evals), "personal": personal}


# --- fedforge -------------------------------------------------------------------------------


def run_fedforge(spec: dict, work: Workload, data: tuple, clock: Clock) -> dict:
    """fedforge's Ditto through ``federated_round`` with the engine ``fedforge run`` builds
    from a config without an ``[engine]`` section (``auto``, worker processes allowed)."""
    from fedforge.algorithms import build_algorithm
    from fedforge.core.store import ClientStore
    from fedforge.engine import classification_loss
    from fedforge.engine.build import build_engine
    from fedforge.engine.draw import RoundDraw
    from fedforge.engine.round import RoundSetup, federated_round
    from fedforge.experiment.config import EngineConfig

    x, y, idx = data
    cohort = spec["cohort"]
    model = initial_model(work)
    algo = build_algorithm("ditto", local_lr=spec["lr"], lam=spec["lam"])
    engine = build_engine(EngineConfig(), allow_processes=True,
                          budget_updates=RUN_ROUNDS * cohort)
    loss_fn = classification_loss(model, "fp32")
    params = _state(model)
    server = algo.server_init(params)
    store = ClientStore(cohort, algo.client_init(params))
    ids, weights = torch.arange(cohort), torch.ones(idx.shape)
    setup = RoundSetup(algo, engine, loss_fn, store, x, y)
    try:
        clock.stamp()
        for t in range(1, spec["warmup"] + spec["iterations"] + 1):
            res = federated_round(setup, params, server, RoundDraw(ids, idx, weights, round=t))
            params, server = res.params, res.server_state
            clock.stamp()
        label = engine.report().get("engine_auto", "auto")
    finally:
        engine.close()
    model.load_state_dict(params)
    work_model, right, personal = initial_model(work), 0, {}
    for c in range(cohort):
        mine = {k: v[0] for k, v in store.gather(torch.tensor([c]))["personal"].items()}
        right += correct(work_model, mine, x, y, idx[c])
        if c in spec["sample"]:
            personal[c] = mine
    return {"label": f"{label}, {torch.get_num_threads()} threads", "global": _state(model),
            "personal_correct": right, "personal": personal}


# --- shared ---------------------------------------------------------------------------------


def _state(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


@torch.no_grad()
def correct(model: nn.Module, state: dict | None, x: torch.Tensor, y: torch.Tensor,
            batches: torch.Tensor) -> int:
    """How many of a client's samples (``batches``' rows) ``model`` (loaded with ``state``
    unless None) classifies correctly."""
    if state is not None:
        model.load_state_dict(state)
    rows = batches.reshape(-1)
    return int((model(x[rows]).argmax(-1) == y[rows]).sum())


RUNNERS = {"fedforge": run_fedforge, "plain": run_plain}


def save_params(global_params: dict, personal: dict, path: str) -> None:
    """The global and sampled personal models as one safetensors file (no pickle)."""
    flat = {f"global/{k}": v for k, v in global_params.items()}
    flat.update({f"personal/{c}/{k}": v for c, tree in personal.items() for k, v in tree.items()})
    save_file({k: v.detach().cpu().contiguous() for k, v in flat.items()}, path)


def main(spec_path: str, out_path: str) -> None:
    """Run the spec's framework and write its result (see the module docstring)."""
    spec = json.loads(Path(spec_path).read_text())
    work = workload(spec)
    data = make_data(spec["cohort"], torch.device("cpu"), work)
    clock = Clock(spec["launched"])
    res = RUNNERS[spec["framework"]](spec, work, data, clock)
    x, y, idx = data
    total = idx.numel()
    net = initial_model(work)
    net.load_state_dict(res["global"])
    glob = sum(correct(net, None, x, y, idx[c]) for c in range(spec["cohort"]))
    save_params(res["global"], res["personal"], f"{out_path}.safetensors")
    Path(out_path).write_text(json.dumps({
        **clock.result(spec["warmup"]), "label": res["label"], "global_accuracy": glob / total,
        "personal_accuracy": res["personal_correct"] / total, "torch": torch.__version__}))


if __name__ == "__main__":
    main(*sys.argv[1:3])
