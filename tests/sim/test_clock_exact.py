"""Exact checks of the event clock (src/fedforge/sim/clock.py) beyond the hand scenario of
test_clock.py: ties, cancellation bookkeeping, task filters, the checkpoint contents and the
edges of a k-th-arrival round (docs/testing.md).
"""

import numpy as np
import pytest

from fedforge.sim.clock import EventClock, Job, kth_arrival_round


def test_dispatch_defaults_and_zero_duration():
    clk = EventClock(2)
    assert clk.now == 0.0 and clk.next_id == 0 and clk.log == []
    assert clk.busy_until.tolist() == [0.0, 0.0] and clk.outstanding.tolist() == [0, 0]
    job = clk.dispatch(3, 1, 0.0)
    assert job == Job(0, 3, 1, 0, 0.0, 0.0, 0.0) and job.key() == (0.0, 0)
    assert clk.next_id == 1 and clk.outstanding.tolist() == [0, 1]
    assert clk.is_busy(1) and not clk.is_busy(0) and clk.num_busy == 1
    assert clk.dispatch(0, 1, 2.0, version=4).version == 4
    with pytest.raises(ValueError, match=r"^job duration must be >= 0, got -0\.5$"):
        clk.dispatch(0, 0, -0.5)


def test_ties_pop_in_dispatch_order_and_empty_pop():
    clk = EventClock(3)
    jobs = [clk.dispatch(0, c, 1.0) for c in (2, 0, 1)]
    assert [clk.pop() for _ in range(3)] == jobs
    assert clk.outstanding.tolist() == [0, 0, 0] and clk.now == 1.0
    with pytest.raises(IndexError, match=r"^no pending jobs$"):
        clk.pop()


def test_cancel_counts_once_and_peek_pop_skip_cancelled():
    clk = EventClock(2)
    a, b, c = clk.dispatch(0, 0, 1.0), clk.dispatch(1, 1, 2.0), clk.dispatch(1, 0, 0.5)
    assert c.start == 1.0 and c.finish == 1.5  # queued behind a
    clk.cancel(a)
    clk.cancel(a)
    assert clk.outstanding.tolist() == [1, 1]
    assert clk.peek() is c and a.job_id not in clk._cancelled  # dropped from the heap
    assert clk.pending() == [c, b] and clk.pending(task=1) == [c, b]
    assert clk.pending(task=0) == [] and clk.pending(0) == []
    clk.cancel(b)
    assert clk.pending(1) == [c]
    assert clk.pop() is c and clk.now == 1.5
    assert clk.log == [(2, 1, 0, 0, 0.0, 1.0, 1.5)]
    with pytest.raises(IndexError):
        clk.pop()  # b was cancelled


def test_advance_to_never_goes_back():
    clk = EventClock(1)
    clk.advance_to(3.0)
    clk.advance_to(2.0)
    assert clk.now == 3.0
    assert clk.dispatch(0, 0, 1.0).send == 3.0


def test_state_dict_contents_and_load():
    clk = EventClock(2)
    a, b = clk.dispatch(0, 0, 2.0), clk.dispatch(1, 1, 1.0, version=3)
    clk.pop()
    d = clk.dispatch(1, 1, 1.0)
    clk.cancel(d)
    state = clk.state_dict()
    assert state == {"now": 1.0, "next_id": 3, "busy_until": [2.0, 2.0], "outstanding": [1, 0],
                     "jobs": [{"job_id": 0, "task": 0, "client": 0, "version": 0, "send": 0.0,
                               "start": 0.0, "finish": 2.0}], "num_logged": 1}
    assert b.version == 3
    other = EventClock(5)
    other._cancelled = {0}
    other.load_state_dict(state)
    assert other.now == 1.0 and other.next_id == 3 and other._cancelled == set()
    assert other.busy_until.dtype == np.float64 and other.outstanding.dtype == np.int64
    assert other.busy_until.tolist() == [2.0, 2.0] and other.outstanding.tolist() == [1, 0]
    assert other.peek() == a and other.pop() == a
    nxt = other.dispatch(0, 1, 1.0)
    assert nxt.job_id == 3 and nxt.start == 2.0


def test_kth_arrival_round_edges():
    clk = EventClock(3)
    clk.advance_to(1.0)
    keep, end = kth_arrival_round(clk, np.array([0, 1, 2]), np.array([3.0, 1.0, 1.0]), 5,
                                  task=2, version=7)
    assert keep.dtype == np.int64 and keep.tolist() == [0, 1, 2] and end == 4.0
    assert [row[0] for row in clk.log] == [1, 2, 0]  # arrival order, ties by dispatch
    assert all(row[1] == 2 and row[3] == 7 for row in clk.log)
    assert clk.pending() == [] and clk.num_busy == 0 and clk.now == 1.0
    assert clk.busy_until.tolist() == [4.0, 2.0, 2.0]
    keep, end = kth_arrival_round(clk, np.array([1]), np.array([1.0]), 0)
    assert keep.tolist() == [] and end == 1.0  # nobody kept: the round ends now
    keep, end = kth_arrival_round(clk, np.array([2, 0]), np.array([5.0, 0.5]), 1)
    # client 2 is free at 2 (2 -> 7), client 0 at 4 (4 -> 4.5): position 1 arrives first
    assert keep.tolist() == [1] and end == 4.5
