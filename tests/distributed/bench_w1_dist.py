"""W1 (FedAvg, 2-conv CNN, 320 samples/client) with DistributedEngine; run under torchrun.

    OMP_NUM_THREADS=1 torchrun --nproc_per_node=2 tests/distributed/bench_w1_dist.py 20
"""

import sys

import torch

from fedforge.bench.throughput import W1, fedforge_round, make_data, timed
from fedforge.engine.distributed import DistributedEngine, init_distributed, is_main_rank
from fedforge.models import build_model

if __name__ == "__main__":
    init_distributed()
    cohort = int(sys.argv[1]) if len(sys.argv) > 1 else 20
    torch.manual_seed(0)
    model = build_model(W1.model, W1.input_shape, W1.num_classes)
    data = (model, *make_data(cohort, torch.device("cpu"), W1))
    seconds = timed(lambda: fedforge_round(DistributedEngine(chunk_size="auto"), *data),
                    torch.device("cpu"), repeats=2)
    if is_main_rank():
        world = torch.distributed.get_world_size() if torch.distributed.is_initialized() else 1
        print(f"W1 distributed world {world} cohort {cohort}: {cohort / seconds:.1f} "
              "client updates/s", flush=True)
