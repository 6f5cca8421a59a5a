"""``:procs2`` rows: two single-threaded workers compute the same round as one process."""

import copy

import pytest
import torch
from torch.testing import assert_close

from fedforge.bench.procs import WorkerPair
from fedforge.bench.workload import Workload, fedforge_round, make_data, plain_loop
from fedforge.engine import LoopEngine
from fedforge.models import build_model

TINY = Workload("T", "logreg", (1, 28, 28), steps=2, batch=4)


@pytest.mark.slow  # spawns two interpreters that import torch (several seconds under load)
def test_worker_pair_round_equals_the_in_process_round():
    torch.manual_seed(0)
    model = build_model(TINY.model, TINY.input_shape, TINY.num_classes)
    x, y, idx = make_data(4, torch.device("cpu"), TINY)
    want = fedforge_round(LoopEngine(), model, x, y, idx)
    assert all(d.abs().sum() > 0 for d in want.cohort.mean_delta.values())
    plain_want = copy.deepcopy(model)
    plain_loop(plain_want, x, y, idx)
    with pytest.raises(KeyboardInterrupt):  # a Ctrl-C in the block still ends the workers
        with WorkerPair("loop", model, x, y, cohort=4) as pair:
            assert [(d["threads"], d["interop"]) for d in pair.describe()] == [(1, 1)] * 2
            got = fedforge_round(pair, model, x, y, idx)
            assert_close(got.cohort.mean_delta, want.cohort.mean_delta)
            assert_close(got.params, want.params)
            assert_close(got.cohort.metrics.as_dict(), want.cohort.metrics.as_dict())
            plain_got = copy.deepcopy(model)
            pair.plain_round(plain_got, idx)
            assert_close(plain_got.state_dict(), plain_want.state_dict())
            assert not torch.equal(plain_got.state_dict()["linear.weight"],
                                   model.state_dict()["linear.weight"])  # it did train
            raise KeyboardInterrupt
    assert not any(p.is_alive() for p in pair.processes)
