"""Out of memory in the vectorised engine: halve the chunk, retry the cohort, remember it.

OOM is simulated by wrapping the vmapped chunk function so that it raises
``torch.OutOfMemoryError`` for chunks wider than a cap (what a CUDA allocator does when a
chunk's working set exceeds free memory).
"""

import pytest
import torch

from fedforge.algorithms import build_algorithm
from fedforge.engine import VmapEngine
from fedforge.engine.base import OOM_ERRORS
from tests.quadratic import run_rounds

ROWS = [[1.0 + 0.1 * i, float(i), -float(i)] for i in range(7)]


def _capped(cap: int, attempts: list[int]):
    class CappedVmap(VmapEngine):
        def wrap(self, fn):
            inner = super().wrap(fn)

            def chunk_fn(*args):
                width = args[4].shape[0]  # xs: [c, steps, batch, ...]
                attempts.append(width)
                if width > cap:
                    raise OOM_ERRORS[0]("CUDA out of memory (simulated)")
                return inner(*args)

            return chunk_fn

    return CappedVmap


@pytest.mark.parametrize("algorithm", ["fedavg", "scaffold"])
def test_oom_halves_chunk_and_matches_small_chunks(algorithm):
    attempts: list[int] = []
    engine = _capped(2, attempts)(chunk_size=7)
    algo = build_algorithm(algorithm, local_lr=0.1)
    got, _, store, _ = run_rounds(algo, ROWS, [0.5, -0.5], rounds=2, steps=2, engine=engine)
    # round 1: 7 fails, 4 fails, 2 works (chunks 2,2,2,1); round 2 starts at the cap
    assert attempts[:3] == [7, 4, 2] and engine.max_chunk == 2
    assert max(attempts[3:]) == 2 and 7 not in attempts[3:] and 4 not in attempts[3:]
    ref, _, ref_store, _ = run_rounds(algo, ROWS, [0.5, -0.5], rounds=2, steps=2,
                                      engine=VmapEngine(chunk_size=2))
    assert torch.equal(got["w"], ref["w"])
    for k, v in store.state_dict().items():
        assert torch.equal(v, ref_store.state_dict()[k])


def test_oom_at_chunk_one_is_raised():
    engine = _capped(0, [])(chunk_size=4)
    with pytest.raises(OOM_ERRORS[0]):
        run_rounds(build_algorithm("fedavg"), ROWS, [0.0, 0.0], engine=engine)
