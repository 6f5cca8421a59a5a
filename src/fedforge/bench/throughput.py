"""Throughput workloads W1 (FedAvg, 2-conv CNN on 28x28, 320 samples/client, batch 32, 1 local
epoch) and W2 (ResNet-18-GN on 32x32, 20 steps of batch 50).

Measures client updates per second for a plain sequential PyTorch loop (``nn.Module`` +
``torch.optim.SGD`` per client, the way most FL code is written), fedforge's LoopEngine and
VmapEngine — and Flower's simulation engine when ``flwr[simulation]`` is installed — in one
process on the same data. An engine name may carry a precision: ``vmap:bf16``, ``plain:bf16``,
and the vmap engine ``:compile`` (``torch.compile`` of the chunk function, ``vmap:compile``,
``vmap:bf16:compile``; ``:cudagraphs`` for its ``reduce-overhead`` mode on a GPU): its one
engine/algorithm/loss are reused across calls, so the warm-up
call compiles and the timed calls run the compiled graph; the warm-up time is printed.

    fedforge bench w1 --cohorts 10,100 --engines plain,loop,vmap,vmap:bf16,vmap:compile
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from fedforge.algorithms import build_algorithm
from fedforge.core.store import ClientStore
from fedforge.engine import LoopEngine, VmapEngine, classification_loss
from fedforge.engine.round import federated_round
from fedforge.models import build_model

LR = 0.01
ENGINES = ("plain", "loop", "vmap", "flower")


@dataclass(frozen=True)
class Workload:
    """A throughput workload: every client runs ``steps`` SGD steps of ``batch`` samples."""

    name: str
    model: str
    input_shape: tuple[int, ...]
    steps: int
    batch: int
    num_classes: int = 10


W1 = Workload("W1", "cnn", (1, 28, 28), steps=10, batch=32)  # 320 samples, 1 epoch
W2 = Workload("W2", "resnet18_gn", (3, 32, 32), steps=20, batch=50)


def make_data(num_clients: int, device: torch.device, work: Workload = W1):
    """Random images; each client's epoch = its ``steps * batch`` samples in a random order."""
    g = torch.Generator().manual_seed(0)
    per_client = work.steps * work.batch
    x = torch.randn(num_clients * per_client, *work.input_shape, generator=g).to(device)
    y = torch.randint(0, work.num_classes, (num_clients * per_client,), generator=g).to(device)
    perm = torch.argsort(torch.rand(num_clients, per_client, generator=g), dim=1)
    idx = (torch.arange(num_clients).view(-1, 1) * per_client + perm)
    return x, y, idx.view(num_clients, work.steps, work.batch).to(device)


def train_client(model, x, y, client_idx, precision: str = "fp32") -> None:
    """One client's local epoch the way most FL code writes it: ``torch.optim.SGD`` over its
    batches ``client_idx [steps, batch]``. Shared by the plain-loop and Flower baselines."""
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    for b in client_idx:
        opt.zero_grad(set_to_none=True)
        with torch.autocast(x.device.type, torch.bfloat16, enabled=precision == "bf16"):
            logits = model(x[b])
        F.cross_entropy(logits.float(), y[b]).backward()
        opt.step()


def plain_loop(model, x, y, idx, precision: str = "fp32") -> None:
    """The baseline: reload the global model per client, train, average."""
    global_state = {k: v.clone() for k, v in model.state_dict().items()}
    acc = {k: torch.zeros_like(v) for k, v in global_state.items()}
    for c in range(idx.shape[0]):
        model.load_state_dict(global_state)
        train_client(model, x, y, idx[c], precision)
        for k, v in model.state_dict().items():
            acc[k] += v / idx.shape[0]
    model.load_state_dict(acc)


def fedforge_round(engine, model, x, y, idx, precision: str = "fp32", algo=None,
                   loss_fn=None) -> None:
    algo = algo or build_algorithm("fedavg", local_lr=LR)
    loss_fn = loss_fn or classification_loss(model, precision)
    params = {k: v.detach().clone() for k, v in model.named_parameters()}
    store = ClientStore(idx.shape[0], {})
    weights = torch.ones(idx.shape, device=x.device)
    federated_round(algo, engine, loss_fn, params,
                    algo.server_init(params), store, torch.arange(idx.shape[0]), x, y, idx,
                    weights)


LAST_WARMUP_S: list[float] = [0.0]  # seconds of the latest ``timed`` warm-up call


def timed(fn: Callable[[], None], device: torch.device, repeats: int) -> float:
    t0 = time.perf_counter()
    fn()  # warm-up (allocations, lazy init, vmap tracing, torch.compile)
    if device.type == "cuda":
        torch.cuda.synchronize()
    LAST_WARMUP_S[0] = time.perf_counter() - t0
    t0 = time.perf_counter()
    for _ in range(repeats):
        fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - t0) / repeats


def runner(name: str, chunk, data, device: torch.device) -> Callable[[], None]:
    engine, *flags = name.split(":")
    # ":compile" = torch.compile, ":cudagraphs" = its "reduce-overhead" mode (CUDA graphs)
    compile_ = "reduce-overhead" if "cudagraphs" in flags else "compile" in flags
    precision = next((f for f in flags if f not in ("compile", "cudagraphs")), "fp32")
    if engine not in ENGINES:
        raise ValueError(f"--engines: unknown engine {engine!r}; expected one of {ENGINES}")
    if compile_ and engine != "vmap":
        raise ValueError(f"--engines: ':compile' and ':cudagraphs' are vmap options, got {name!r}")
    if compile_:  # one engine/algorithm/loss, so the compiled graph is reused, not recompiled
        eng = VmapEngine(chunk_size=chunk, compile=compile_)
        algo = build_algorithm("fedavg", local_lr=LR)
        loss_fn = classification_loss(data[0], precision)
        return lambda: fedforge_round(eng, *data, precision, algo=algo, loss_fn=loss_fn)
    if engine == "plain":
        return lambda: plain_loop(*data, precision)
    if engine == "loop":
        return lambda: fedforge_round(LoopEngine(), *data, precision)
    if engine == "vmap":
        return lambda: fedforge_round(VmapEngine(chunk_size=chunk), *data, precision)
    raise ValueError("flower is timed by run_w1 itself")


def run_w1(cohorts: list[int], engines: list[str], device: torch.device, chunk="auto",
           repeats: int = 1, work: Workload = W1) -> list[list[object]]:
    """Rows ``[engine, cohort, client updates/s, peak GPU GiB, x vs plain]``, printed as they go."""
    torch.manual_seed(0)
    model = build_model(work.model, work.input_shape, work.num_classes).to(device)
    rows: list[list[object]] = []
    for cohort in cohorts:
        data = (model, *make_data(cohort, device, work))
        plain_rate = None
        for name in engines:
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats()
            if name == "flower":
                from fedforge.bench.flower_w1 import flower_round  # optional dependency

                seconds = flower_round(*data, device=device, rounds=2 + repeats)
            else:
                seconds = timed(runner(name, chunk, data, device), device, repeats)
            peak = torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda" else None
            rate = cohort / seconds
            if name == "plain":
                plain_rate = rate
            ratio = None if plain_rate is None else f"{rate / plain_rate:.2f}x"
            rows.append([name, cohort, rate, peak, ratio])
            mem = f", peak {peak:.2f} GiB" if peak is not None else ""
            warm = "" if name == "flower" else f", warm-up call {LAST_WARMUP_S[0]:.1f} s"
            print(f"{work.name} {name:11s} cohort {cohort:5d}: {rate:8.1f} client updates/s{mem}"
                  f"{warm}", flush=True)
    return rows
