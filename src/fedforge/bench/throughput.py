"""W1 throughput: FedAvg, 2-conv CNN on 28x28, 320 samples/client, batch 32, 1 local epoch.

Measures client updates per second for a plain sequential PyTorch loop (nn.Module +
torch.optim.SGD per client, the way most FL code is written), fedforge's LoopEngine and
fedforge's VmapEngine, in one process on the same data. Appends a row per (engine, cohort)
to benchmarks/RESULTS.md with the machine, date, torch version and command.

    python benchmarks/w1_throughput.py --cohorts 10,100 --device cpu
"""

from __future__ import annotations

import argparse
import datetime as dt
import platform
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from fedforge.algorithms import build_algorithm
from fedforge.core.store import ClientStore
from fedforge.engine import LoopEngine, VmapEngine, classification_loss
from fedforge.experiment.round import federated_round
from fedforge.models import build_model

SAMPLES, BATCH, STEPS, LR = 320, 32, 10, 0.01


def make_data(num_clients: int, device: torch.device):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(num_clients * SAMPLES, 1, 28, 28, generator=g).to(device)
    y = torch.randint(0, 10, (num_clients * SAMPLES,), generator=g).to(device)
    # each client's epoch: its 320 samples in a random order, 10 batches of 32
    perm = torch.argsort(torch.rand(num_clients, SAMPLES, generator=g), dim=1)
    idx = (torch.arange(num_clients).view(-1, 1) * SAMPLES + perm).view(num_clients, STEPS, BATCH)
    return x, y, idx.to(device)


def plain_loop(model, x, y, idx) -> None:
    """The baseline: deep-copy the global model per client, torch.optim.SGD, average."""
    global_state = {k: v.clone() for k, v in model.state_dict().items()}
    acc = {k: torch.zeros_like(v) for k, v in global_state.items()}
    for c in range(idx.shape[0]):
        model.load_state_dict(global_state)
        opt = torch.optim.SGD(model.parameters(), lr=LR)
        for s in range(STEPS):
            b = idx[c, s]
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(model(x[b]), y[b]).backward()
            opt.step()
        for k, v in model.state_dict().items():
            acc[k] += v / idx.shape[0]
    model.load_state_dict(acc)


def fedforge_round(engine, model, x, y, idx) -> None:
    algo = build_algorithm("fedavg", local_lr=LR)
    params = {k: v.detach().clone() for k, v in model.named_parameters()}
    store = ClientStore(idx.shape[0], {})
    weights = torch.ones(idx.shape, device=x.device)
    federated_round(algo, engine, classification_loss(model), params, algo.server_init(params),
                    store, torch.arange(idx.shape[0]), x, y, idx, weights)


def timed(fn, device, repeats: int) -> float:
    fn()  # warm-up (allocations, lazy init)
    if device.type == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(repeats):
        fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - t0) / repeats


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cohorts", default="10,100")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--engines", default="plain,loop,vmap")
    ap.add_argument("--chunk", default="auto")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--results", default=str(Path(__file__).with_name("RESULTS.md")))
    args = ap.parse_args()
    device = torch.device(args.device)
    torch.manual_seed(0)
    model = build_model("cnn", (1, 28, 28), 10).to(device)
    chunk = args.chunk if args.chunk == "auto" else int(args.chunk)
    rows = []
    for cohort in [int(c) for c in args.cohorts.split(",")]:
        x, y, idx = make_data(cohort, device)
        data = (model, x, y, idx)
        runners = {
            "plain": lambda d=data: plain_loop(*d),
            "loop": lambda d=data: fedforge_round(LoopEngine(), *d),
            "vmap": lambda d=data: fedforge_round(VmapEngine(chunk_size=chunk), *d),
        }
        for name in args.engines.split(","):
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats()
            seconds = timed(runners[name], device, args.repeats)
            peak = torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda" else None
            rate = cohort / seconds
            rows.append((name, cohort, rate, peak))
            mem = f", peak {peak:.2f} GiB" if peak is not None else ""
            print(f"W1 {name:6s} cohort {cohort:5d}: {rate:8.1f} client updates/s{mem}", flush=True)
    machine = f"{platform.machine()} {torch.get_num_threads()} threads"
    if device.type == "cuda":
        machine = torch.cuda.get_device_name(device)
    header = (f"\n### W1 {dt.date.today().isoformat()} · {machine} · torch {torch.__version__} · "
              f"`python {' '.join(sys.argv)}`\n\n"
              "| engine | cohort | client updates/s | peak GPU GiB |\n|---|---|---|---|\n")
    body = "".join(f"| {n} | {c} | {r:.1f} | {'' if p is None else f'{p:.2f}'} |\n"
                   for n, c, r, p in rows)
    with open(args.results, "a", encoding="utf-8") as f:
        f.write(header + body)


if __name__ == "__main__":
    main()
