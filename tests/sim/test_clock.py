import numpy as np
import pytest

from fedforge.sim.clock import EventClock, kth_arrival_round


def test_fcfs_three_clients_hand_scenario():
    """c0 gets two jobs (FCFS: the second starts when the first ends), c1 one, c2 one then
    another sent at t=1; B and C finish together at 3 -> dispatch order breaks the tie."""
    clk = EventClock(3)
    a = clk.dispatch(0, 0, 2.0)  # 0 -> 2
    b = clk.dispatch(1, 0, 1.0)  # queued behind a: 2 -> 3
    c = clk.dispatch(0, 1, 3.0)  # 0 -> 3
    d = clk.dispatch(1, 2, 1.0)  # 0 -> 1
    assert (b.start, b.finish) == (2.0, 3.0)
    assert clk.pop() is d and clk.now == 1.0
    e = clk.dispatch(0, 2, 0.5)  # sent at 1, c2 idle since 1: 1 -> 1.5
    assert (e.send, e.start, e.finish) == (1.0, 1.0, 1.5)
    order = [clk.pop() for _ in range(4)]
    assert order == [e, a, b, c]
    assert [row[0] for row in clk.log] == [3, 4, 0, 1, 2]
    assert clk.log[3] == (1, 1, 0, 0, 0.0, 2.0, 3.0)
    assert clk.num_busy == 0 and clk.peek() is None


def test_cancel_and_state_roundtrip():
    clk = EventClock(2)
    j0, j1 = clk.dispatch(0, 0, 1.0), clk.dispatch(1, 1, 2.0)
    clk.cancel(j0)
    assert clk.pending() == [j1] and clk.num_busy == 1
    clk2 = EventClock(2)
    clk2.load_state_dict(clk.state_dict())
    assert clk2.pop() == j1 and clk2.now == 2.0
    with pytest.raises(ValueError):
        clk.dispatch(0, 0, -1.0)


def test_kth_arrival_round_keeps_first_k_and_stragglers_stay_busy():
    clk = EventClock(4)
    keep, end = kth_arrival_round(clk, np.array([0, 1, 2, 3]), np.array([4.0, 1.0, 3.0, 2.0]), 2)
    assert keep.tolist() == [1, 3] and end == 2.0
    clk.advance_to(end)
    nxt = clk.dispatch(0, 0, 1.0)  # client 0 (a discarded straggler) is busy until 4
    assert nxt.start == 4.0
    keep_all, end_all = kth_arrival_round(clk, np.array([1]), np.array([1.0]), None)
    assert keep_all.tolist() == [0] and end_all == 3.0
