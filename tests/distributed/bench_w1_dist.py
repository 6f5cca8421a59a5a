"""W1 (FedAvg, 2-conv CNN, 320 samples/client) with DistributedEngine; run under torchrun.

    OMP_NUM_THREADS=1 torchrun --nproc_per_node=2 tests/distributed/bench_w1_dist.py 20
    torchrun --nproc_per_node=4 tests/distributed/bench_w1_dist.py 1000 cuda   # 4 ranks, GPUs

On a GPU machine each rank takes ``cuda:LOCAL_RANK % gpus``, so 4 ranks on one GPU share it
(gloo is then chosen, NCCL refuses two ranks on one device).
"""

import sys

import torch

from fedforge.bench.throughput import W1, fedforge_round, make_data, timed
from fedforge.engine.distributed import DistributedEngine, init_distributed, is_main_rank
from fedforge.experiment.build import resolve_device
from fedforge.models import build_model

if __name__ == "__main__":
    init_distributed()
    cohort = int(sys.argv[1]) if len(sys.argv) > 1 else 20
    device = resolve_device(sys.argv[2] if len(sys.argv) > 2 else "cpu")
    torch.manual_seed(0)
    model = build_model(W1.model, W1.input_shape, W1.num_classes).to(device)
    data = (model, *make_data(cohort, device, W1))
    seconds = timed(lambda: fedforge_round(DistributedEngine(chunk_size="auto"), *data),
                    device, repeats=2)
    if is_main_rank():
        world = torch.distributed.get_world_size() if torch.distributed.is_initialized() else 1
        peak = (f", peak {torch.cuda.max_memory_allocated(device) / 2**30:.2f} GiB on rank 0"
                if device.type == "cuda" else "")
        print(f"W1 distributed world {world} cohort {cohort} on {device}: "
              f"{cohort / seconds:.1f} client updates/s{peak}", flush=True)
