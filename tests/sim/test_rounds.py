import numpy as np
import pytest

from fedforge.sim.delays import ConstantDelay
from fedforge.sim.population import Population
from fedforge.sim.rounds import SyncRoundClock


def test_round_ends_at_kth_arrival_and_stragglers_delay_next_round():
    pop = Population(np.array([1.3, 1.0, 0.7, 1.0]))
    rc = SyncRoundClock(pop, ConstantDelay(), k=2, step_time=1.0)
    keep, dt = rc.round(1, [0, 1, 2], local_steps=10)  # finishes 13, 10, 7
    assert keep.tolist() == [1, 2] and dt == pytest.approx(10.0)
    keep, dt = rc.round(2, [0, 3], local_steps=10)  # client 0 busy until 13: 13 -> 26
    assert keep.tolist() == [0, 1] and rc.now == pytest.approx(26.0) and dt == pytest.approx(16)


def test_resume_state_and_no_mitigation():
    pop = Population.build(20)
    a = SyncRoundClock(pop, k=None, seed=3)
    for r in range(1, 4):
        a.round(r, np.arange(r, r + 5), 5)
    b = SyncRoundClock(pop, k=None, seed=3)
    b.load_state_dict(a.state_dict())
    ka, ta = a.round(4, np.arange(5), 5)
    kb, tb = b.round(4, np.arange(5), 5)
    assert ta == tb and ka.tolist() == kb.tolist() == list(range(5))
    with pytest.raises(ValueError, match="sim.straggler_k"):
        SyncRoundClock(pop, k=0)


def test_round_from_base_and_keep_clients():
    import torch

    from fedforge.engine.draw import RoundDraw

    pop = Population(np.array([1.0, 2.0, 0.5]))
    rc = SyncRoundClock(pop, ConstantDelay(), k=2)
    keep, dt = rc.round_from_base(1, [0, 1, 2], [4.0, 1.0, 2.0])  # finishes 4, 2, 1
    assert keep.tolist() == [1, 2] and dt == pytest.approx(2.0)
    draw = RoundDraw(torch.tensor([5, 6, 7]), torch.arange(6).view(3, 2), torch.ones(3, 2),
                     torch.tensor([0.5, 0.25, 0.25]), {"track": torch.tensor([True, False, True])},
                     counts=torch.tensor([10, 20, 30]), round=4).with_keys(3)
    kept = draw.keep(keep)
    assert kept.client_ids.tolist() == [6, 7] and kept.sample_idx.tolist() == [[2, 3], [4, 5]]
    assert kept.agg_weights.tolist() == [0.5, 0.5] and kept.info["track"].tolist() == [False, True]
    assert kept.counts.tolist() == [20, 30] and kept.round == 4
    # a kept client's dropout key is its own (seed, round, id) key, whoever else was drawn
    assert kept.keys.tolist() == kept.with_keys(3).keys.tolist() == draw.keys[1:].tolist()
    assert kept.keys.tolist() != kept.with_keys(4).keys.tolist()
