"""Compile-cache reuse across processes: how much of ``engine.compile``'s start-up a second
process saves through torch's on-disk caches (:mod:`fedforge.engine.compile_cache`).

Two fresh interpreters run the same compiled VmapEngine W1 round (``vmap:compile`` of
``fedforge bench``, default LeNet-5, 10 clients) one after the other, sharing a new, empty
``TORCHINDUCTOR_CACHE_DIR``. Each reports its compile time: the first call (compiling, or
loading the cached graphs, and one round) minus the second call (one round). The first
process fills the cache; the second should only trace with dynamo and load. The row
"first-process compile s | second-process compile s | ratio" is recorded in
``benchmarks/results/`` (``benchmarks/RESULTS.md``); the target is a ratio of at most 0.10.

    python -m fedforge.bench.compile_cache [--model lenet5] [--cohort 10]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch

from fedforge.engine.compile_cache import CACHE_ENV

HEADER = ["first-process compile s", "second-process compile s", "ratio"]


def one_process(model: str, cohort: int) -> dict[str, float]:
    """In this process: seconds to compile the W1 round of ``cohort`` clients, and the
    cache hits torch counted (zero in a process that found the cache empty)."""
    from torch._dynamo.utils import counters

    from fedforge.bench.throughput import check_engine_name, runner
    from fedforge.bench.workload import W1, make_data
    from fedforge.models import build_model

    work = replace(W1, model=model)
    cpu = torch.device("cpu")
    torch.manual_seed(0)
    data = (build_model(work.model, work.input_shape, work.num_classes),
            *make_data(cohort, cpu, work))
    round_ = runner(check_engine_name("vmap:compile", cpu), "auto", data, work)
    t0 = time.perf_counter()
    round_()  # compiles, or loads the compiled graphs from the cache
    first = time.perf_counter() - t0
    t0 = time.perf_counter()
    round_()
    steady = time.perf_counter() - t0
    return {"compile_s": max(first - steady, 0.0), "round_s": steady,
            "fx_graph_hits": counters["inductor"]["fxgraph_cache_hit"],
            "autograd_hits": counters["aot_autograd"]["autograd_cache_hit"],
            "autograd_bypasses": counters["aot_autograd"]["autograd_cache_bypass"]}


def measure(model: str = "lenet5", cohort: int = 10) -> list[dict[str, float]]:
    """:func:`one_process` in two fresh interpreters sharing a new cache directory."""
    runs = []
    with tempfile.TemporaryDirectory(prefix="fedforge-compile-cache-") as cache:
        env = {**os.environ, CACHE_ENV: cache}
        for _ in range(2):
            out = subprocess.run(
                [sys.executable, "-m", "fedforge.bench.compile_cache", "--child",
                 "--model", model, "--cohort", str(cohort)],
                env=env, stdout=subprocess.PIPE, text=True, check=True).stdout
            runs.append(json.loads(out.strip().splitlines()[-1]))
            print(f"process {len(runs)}: compile {runs[-1]['compile_s']:.1f} s, "
                  f"{runs[-1]['fx_graph_hits']} FX-graph / {runs[-1]['autograd_hits']} "
                  f"AOTAutograd cache hits", flush=True)
    return runs


def main(argv: list[str] | None = None) -> None:
    """Measure the row and append it to ``--results``."""
    ap = argparse.ArgumentParser(
        prog="python -m fedforge.bench.compile_cache",
        description="Compile the same W1 round in two fresh processes sharing a new torch "
                    "compile cache; append first/second compile seconds to the results file.")
    ap.add_argument("--model", default="lenet5", help="registered model on W1's inputs")
    ap.add_argument("--cohort", type=int, default=10, help="clients in the round")
    ap.add_argument("--results", type=Path, default=None,
                    help="folder of result records (default: benchmarks/results from the "
                         "fedforge checkout, else runs/bench_compile_cache/results)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(one_process(args.model, args.cohort)))
        return
    from fedforge.bench.report import default_results
    from fedforge.bench.results import record_results, run_info

    load_before = os.getloadavg()
    first, second = measure(args.model, args.cohort)
    ratio = second["compile_s"] / first["compile_s"] if first["compile_s"] > 0 else None
    note = (f"Second process: {second['fx_graph_hits']} FX-graph and "
            f"{second['autograd_hits']} AOTAutograd cache hits "
            f"({second['autograd_bypasses']} AOTAutograd bypasses); one round takes "
            f"{second['round_s']:.2f} s after compiling. Target: ratio <= 0.10.")
    command = ("python -m fedforge.bench.compile_cache "
               f"--model {args.model} --cohort {args.cohort}")
    results = args.results or default_results(Path("runs/bench_compile_cache"))
    text = record_results(results, "compile-cache", f"{args.model}-{args.cohort}",
                          f"Compile cache across processes (W1, {args.model}, vmap:compile, "
                          f"cohort {args.cohort})", HEADER,
                          [[first["compile_s"], second["compile_s"], ratio]],
                          run_info("cpu", load_before, command), [note])
    print(text)


if __name__ == "__main__":
    main()
