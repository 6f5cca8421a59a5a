"""Throughput workloads W1 (FedAvg, 2-conv CNN on 28x28, 320 samples/client, batch 32, 1 local
epoch) and W2 (ResNet-18-GN on 32x32, 20 steps of batch 50).

Measures client updates per second for a plain sequential PyTorch loop (``nn.Module`` +
``torch.optim.SGD`` per client, the way most FL code is written), fedforge's LoopEngine and
VmapEngine — and Flower's simulation engine when ``flwr[simulation]`` is installed (without
it a ``flower`` row is refused before anything is timed) — in one process on the same data.
An engine name may carry a precision: ``vmap:bf16``, ``plain:bf16``, and the vmap engine
``:compile`` (``torch.compile`` of the chunk function, ``vmap:compile``, ``vmap:bf16:compile``;
``:cudagraphs`` for its ``reduce-overhead`` mode on a GPU): its one engine/algorithm/loss are
reused across calls, so the warm-up call compiles and the timed calls run the compiled graph;
the warm-up time is printed. ``auto`` is the default engine of a run (``AutoEngine``: its
calibration happens in the warm-up call). A one-process ``plain`` row, with nothing to
compile or calibrate, warms up on its first 10 clients.

The suffix ``:procs2`` answers the threads question: on a 2-core CPU, are two single-threaded
processes, each running half the cohort's clients, faster than one process with two intra-op
threads? It runs the same round as the row without the suffix (equal to float tolerance),
split over two spawned workers (:mod:`fedforge.bench.procs`) that each hold the dataset and
model from their start, run with one intra-op and one inter-op thread, and receive per call
only the global parameters, broadcast and their half's client states, sample indices and
weights; the parent adds the halves and takes the server step. Starting the workers (and an
``auto`` worker's calibration on its half) falls in the untimed warm-up call, so the rate
compares steady-state rounds, including the per-round messages to and from the workers. The
workers are terminated after the row, also after an error or Ctrl-C.

Every row reports the achieved GFLOP/s (FLOPs of one update, counted by
``torch.utils.flop_counter`` on the workload's forward and backward, x updates/s) and its
share of the GEMM peak measured at the start (``torch.mm`` of 2048x2048 in fp32 or bf16).

    fedforge bench w1 --cohorts 10,100 --engines plain,loop,vmap,auto,vmap:bf16,vmap:compile
    fedforge bench w1 --model lenet5 --cohorts 10,100 --engines loop,loop:procs2,auto,auto:procs2
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, NamedTuple

import torch
import torch.nn.functional as F
import typer

from fedforge.algorithms import build_algorithm
from fedforge.bench.options import Device, Out, Profile, Results, folders
from fedforge.bench.report import plot_scaling
from fedforge.bench.results import record_results, run_info
from fedforge.bench.workload import (
    LR,
    W1,
    W2,
    Workload,
    fedforge_round,
    for_model,
    make_data,
    make_engine,
    plain_loop,
)
from fedforge.engine import AutoEngine, classification_loss
from fedforge.models import MODELS, build_model

ENGINES = ("plain", "loop", "vmap", "auto", "procs", "flower")
FLAGS = ("compile", "cudagraphs", "procs2", "fp32", "bf16", "nhwc")
W1_HEADER = ["engine", "cohort", "client updates/s", "GFLOP/s", "% of peak", "peak GPU GiB",
             "vs plain"]


def peak_gflops(device: torch.device, dtype: torch.dtype = torch.float32, n: int = 2048,
                repeats: int = 5, budget_s: float = 3.0) -> float:
    """Measured GEMM peak: the best of ``repeats`` ``torch.mm`` calls of two square matrices,
    n x n, or smaller where a call at twice the size would take more than ``budget_s``
    (CPUs without native bf16 run bf16 GEMMs a thousand times slower)."""
    size = min(256, n)
    while True:
        a = torch.randn(size, size, device=device).to(dtype)
        b = torch.randn(size, size, device=device).to(dtype)
        _time_mm(a, b, device)  # warm-up
        one = _time_mm(a, b, device)
        if size >= n or one * 8 > budget_s:  # the next size costs 8x
            break
        size *= 2
    best = one
    for _ in range(max(0, min(repeats, int(budget_s / max(one, 1e-9))) - 1)):
        best = min(best, _time_mm(a, b, device))
    return 2 * size**3 / best / 1e9


def _time_mm(a: torch.Tensor, b: torch.Tensor, device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    torch.mm(a, b)
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - t0


def flops_per_update(model, work: Workload) -> float:
    """FLOPs of one client update: forward + backward of ``steps`` batches (the SGD update
    itself, a few FLOPs per parameter, is left out)."""
    from torch.utils.flop_counter import FlopCounterMode

    device = next(model.parameters()).device
    x = work.inputs(work.batch).to(device)
    y = torch.zeros(work.batch, dtype=torch.long, device=device)
    with FlopCounterMode(display=False) as counter:
        F.cross_entropy(model(x), y).backward()
    model.zero_grad(set_to_none=True)
    return float(counter.get_total_flops()) * work.steps


LAST_WARMUP_S: list[float] = [0.0]  # seconds of the latest ``timed`` warm-up call


def timed(fn: Callable[[], None], device: torch.device, repeats: int,
          warmup: Callable[[], None] | None = None) -> float:
    """Seconds per call of ``fn`` after one untimed ``warmup`` call (default: ``fn``)."""
    t0 = time.perf_counter()
    (warmup or fn)()  # allocations, lazy init, vmap tracing, torch.compile, auto calibration
    if device.type == "cuda":
        torch.cuda.synchronize()
    LAST_WARMUP_S[0] = time.perf_counter() - t0
    t0 = time.perf_counter()
    for _ in range(repeats):
        fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - t0) / repeats


_PEAKS: dict[str, dict[str, float]] = {}


class RowSpec(NamedTuple):
    """What a row name ``engine[:flag...]`` asks for."""

    name: str  # as given, e.g. "vmap:bf16"
    engine: str
    compile: bool | str  # False, True (torch.compile) or "reduce-overhead" (CUDA graphs)
    precision: str  # "fp32" or "bf16"
    procs2: bool  # split over two worker processes
    channels_last: bool  # ":nhwc", the loop/procs channels-last layout


def check_engine_name(name: str, device: torch.device) -> RowSpec:
    """Parse a row name, or raise a ``ValueError`` naming ``--engines``."""
    engine, *flags = name.split(":")
    # ":compile" = torch.compile, ":cudagraphs" = its "reduce-overhead" mode (CUDA graphs)
    compile_ = "reduce-overhead" if "cudagraphs" in flags else "compile" in flags
    precision = "bf16" if "bf16" in flags else "fp32"
    if engine not in ENGINES:
        raise ValueError(f"--engines: unknown engine {engine!r}; expected one of {ENGINES}")
    unknown = [f for f in flags if f not in FLAGS]
    if unknown:
        raise ValueError(f"--engines: unknown suffix {unknown[0]!r} in {name!r}; expected "
                         f"one of {FLAGS}")
    if compile_ and engine != "vmap":
        raise ValueError(f"--engines: ':compile' and ':cudagraphs' are vmap options, got {name!r}")
    if "procs2" in flags and (engine not in ("plain", "loop", "vmap", "auto") or compile_
                              or device.type != "cpu"):
        raise ValueError(f"--engines: ':procs2' is for CPU plain/loop/vmap/auto, got {name!r}")
    if engine == "flower" and flags:
        raise ValueError(f"--engines: flower takes no suffix, got {name!r}")
    if "nhwc" in flags and (engine not in ("loop", "procs") or "procs2" in flags):
        raise ValueError(f"--engines: ':nhwc' (channels-last) is a loop/procs option, got {name!r}")
    return RowSpec(name, engine, compile_, precision, "procs2" in flags, "nhwc" in flags)


def runner(spec: RowSpec, chunk, data, work: Workload = W1,
           resources: contextlib.ExitStack | None = None) -> Callable[[], None]:
    """The call a row (parsed by :func:`check_engine_name`) times, on ``data = (model, x, y,
    idx)``. A ``:procs2`` row's workers start here and are closed by ``resources`` (required
    for it)."""
    name, engine, compile_, precision, procs2, channels_last = spec
    model, x, y, idx = data
    if engine == "flower":
        raise ValueError("flower is timed by run_w1 itself")
    if procs2:
        from fedforge.bench.procs import WorkerPair

        if resources is None:
            raise ValueError(f"{name}: pass resources= (an ExitStack) to close its workers")
        pair = resources.enter_context(WorkerPair(engine, model, x, y, precision, chunk,
                                                  idx.shape[0]))
        LAST_ENGINE[:] = [pair]  # run_w1 prints what its workers ran
        if engine == "plain":
            return lambda: pair.plain_round(model, idx)
        eng = pair
    elif engine == "plain":
        return lambda: plain_loop(*data, precision)
    else:  # one engine/algorithm/loss: a compiled graph or an auto calibration is made once
        eng = make_engine(engine, chunk, compile_, idx.shape[0], channels_last)
        if resources is not None:  # procs (or auto's choice of it): its workers end with the row
            resources.enter_context(eng)
        LAST_ENGINE[:] = [eng]
    algo = build_algorithm("fedavg", local_lr=LR)
    loss_fn = classification_loss(data[0], precision)
    return lambda: fedforge_round(eng, *data, precision, algo=algo, loss_fn=loss_fn)


PLAIN_WARMUP_CLIENTS = 10


def plain_warmup(spec: RowSpec, chunk, data, work: Workload):
    """A one-process plain row warms up on its first clients only: it has nothing to trace or
    calibrate, and a full warm-up call of a heavy model at cohort 1000 costs up to 40 min."""
    if spec.engine != "plain" or spec.procs2:
        return None
    model, x, y, idx = data
    return runner(spec, chunk, (model, x, y, idx[:PLAIN_WARMUP_CLIENTS]), work)


LAST_ENGINE: list = []  # the engine of the latest fedforge row (auto: its choice is printed)


def run_w1(cohorts: list[int], engines: list[str], device: torch.device, chunk="auto",
           repeats: int = 1, work: Workload = W1, profile_dir=None) -> list[list[object]]:
    """Rows of :data:`W1_HEADER`, printed as they go. ``profile_dir``: profile each row's
    timed calls there (``fedforge bench w1 --profile``)."""
    from fedforge.bench.profiling import profiled

    # bad names and a missing Flower fail before anything is measured
    specs = {name: check_engine_name(name, device) for name in engines}
    if "flower" in engines:
        from fedforge.bench.flower_w1 import check_flower  # optional dependency

        check_flower()
    torch.manual_seed(0)
    model = build_model(work.model, work.input_shape, work.num_classes).to(device)
    gflop = flops_per_update(model, work) / 1e9
    if device.type not in _PEAKS:  # measured once per process
        _PEAKS[device.type] = {p: peak_gflops(device, d) for p, d in (
            ("fp32", torch.float32), ("bf16", torch.bfloat16))}
    peaks = _PEAKS[device.type]
    print(f"{work.name} {work.model}: {gflop:.3f} GFLOP per update; GEMM peak fp32 "
          f"{peaks['fp32']:.0f} GFLOP/s, bf16 {peaks['bf16']:.0f} GFLOP/s", flush=True)
    rows: list[list[object]] = []
    for cohort in cohorts:
        data = (model, *make_data(cohort, device, work))
        plain_rate = None
        for name in engines:
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats()
            with contextlib.ExitStack() as resources:  # a :procs2 row's workers end here
                with profiled(profile_dir or ".", f"{work.name}_{name.replace(':', '-')}_"
                              f"{cohort}", enabled=profile_dir is not None and name != "flower"):
                    if name == "flower":
                        from fedforge.bench.flower_w1 import flower_round  # optional extra

                        seconds = flower_round(*data, device=device, rounds=2 + repeats)
                    else:
                        spec = specs[name]
                        seconds = timed(runner(spec, chunk, data, work, resources), device,
                                        repeats, plain_warmup(spec, chunk, data, work))
                last = LAST_ENGINE.pop() if LAST_ENGINE else None
                if isinstance(last, AutoEngine):
                    print(f"  auto chose {last.choice}; ms per update {last.timings}; conv "
                          f"plans {last.state_dict().get('conv_plans', {})}", flush=True)
                elif hasattr(last, "describe"):
                    print(f"  :procs2 workers: {last.describe()}", flush=True)
            peak = torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda" else None
            rate = cohort / seconds
            if specs[name].engine == "plain" and plain_rate is None:
                plain_rate = rate
            ratio = None if plain_rate is None else f"{rate / plain_rate:.2f}x"
            achieved = rate * gflop
            share = 100.0 * achieved / peaks[specs[name].precision]
            rows.append([name, cohort, rate, achieved, share, peak, ratio])
            mem = f", peak {peak:.2f} GiB" if peak is not None else ""
            warm = "" if name == "flower" else f", warm-up call {LAST_WARMUP_S[0]:.1f} s"
            print(f"{work.name} {name:11s} cohort {cohort:5d}: {rate:8.1f} client updates/s, "
                  f"{achieved:6.1f} GFLOP/s ({share:.0f} % of peak){mem}{warm}", flush=True)
    return rows


# ------------------------------------------------------------ fedforge bench w1 | w2

Cohorts = Annotated[str, typer.Option(help="comma-separated cohort sizes")]
Engines = Annotated[str, typer.Option(
    help="plain,loop,vmap,auto,procs (one single-threaded worker process per CPU),flower; "
         "suffixes :bf16 (bf16 autocast), :procs2 (the same round, half the cohort in each "
         "of two single-threaded worker processes that hold the data from their start: two "
         "processes vs one with two intra-op threads), for loop and procs :nhwc "
         "(channels-last images and convolution weights) and, for vmap, :compile "
         "(torch.compile), e.g. vmap:bf16:compile")]
Chunk = Annotated[str, typer.Option(help="vmap chunk size or auto")]
Repeats = Annotated[int, typer.Option(help="timed repetitions after a warm-up")]
Model = Annotated[str | None, typer.Option(
    help="another registered model on the workload's inputs (e.g. mlp, logreg); a sequence "
         "model (char_lstm, transformer_lm, ...) gets random sequences of 80 tokens with the "
         "same schedule")]
Plot = Annotated[Path | None, typer.Option(help="write a scaling PNG here")]
DEFAULT_ENGINES = "plain,loop,vmap,auto"


def w1(cohorts: Cohorts = "10,100", engines: Engines = DEFAULT_ENGINES, device: Device = "cpu",
       chunk: Chunk = "auto", repeats: Repeats = 1, model: Model = None, plot: Plot = None,
       profile: Profile = False, out: Out = "runs/bench_w1", results: Results = None) -> str:
    """W1 throughput: client updates/s of FedAvg with the 2-conv CNN, per engine."""
    return throughput(W1, cohorts, engines, device, chunk, repeats, model, plot, profile,
                      out, results)


def w2(cohorts: Cohorts = "10,100", engines: Engines = DEFAULT_ENGINES, device: Device = "cpu",
       chunk: Chunk = "auto", repeats: Repeats = 1, model: Model = None, plot: Plot = None,
       profile: Profile = False, out: Out = "runs/bench_w2", results: Results = None) -> str:
    """W2 throughput: client updates/s of FedAvg with ResNet-18-GN, per engine."""
    return throughput(W2, cohorts, engines, device, chunk, repeats, model, plot, profile,
                      out, results)


def throughput(work: Workload, cohorts: str, engines: str, device: str, chunk: str,
               repeats: int, model: str | None, plot: Path | None, profile: bool, out: str,
               results: Path | None) -> str:
    """Measure ``work`` (with ``model`` instead of its own), record the table in
    ``results`` and return it; ``plot``: also a scaling figure."""
    folder, results = folders(out, results)
    load_before = os.getloadavg()
    dev = torch.device(device)
    if model is not None:
        if model not in MODELS:
            raise ValueError(f"--model: unknown model {model!r}; expected one of "
                             f"{sorted(MODELS)}")
        work = for_model(work, model)
    rows = run_w1([int(c) for c in cohorts.split(",")], engines.split(","), dev,
                  chunk if chunk == "auto" else int(chunk), repeats, work,
                  profile_dir=folder / "profile" if profile else None)
    title = f"{work.name} ({work.model}, {work.steps} steps x batch {work.batch}, FedAvg)"
    if plot is not None:
        plot_scaling(rows, plot, f"{title}, {dev.type}")
    workload = work.name.lower().replace(" ", "-")
    return record_results(results, workload, work.model, title, W1_HEADER, rows,
                          run_info(device, load_before), key=(1, 0))
