"""Event queue on a simulated clock, with one first-come-first-served queue per client.

A job (one local-training request) sent at ``now`` to client i starts at
``max(now, busy_until[i])`` and finishes ``duration`` later; the client's queue tail moves to
that finish time. So a client works through its requests one after another, across tasks
(FedAST footnote 2: one model in memory at a time). Events pop in order of
``(finish, job_id)``: equal finish times resolve by dispatch order, so a run is a pure function
of its seed. The clock never touches weights; it only says *when* results arrive.
"""

from __future__ import annotations

import heapq
from dataclasses import asdict, dataclass

import numpy as np


@dataclass
class Job:
    job_id: int
    task: int
    client: int
    version: int  # the task's server round whose model was sent
    send: float
    start: float
    finish: float

    def key(self) -> tuple[float, int]:
        return (self.finish, self.job_id)


class EventClock:
    """Simulated time, per-client FCFS queues, and the log of every applied event.

    ``busy_until[i]`` is the finish time of the last job queued at client i; ``outstanding[i]``
    counts its jobs not yet popped or cancelled (``num_busy`` = clients with any).
    """

    def __init__(self, num_clients: int) -> None:
        self.now = 0.0
        self.next_id = 0
        self.busy_until = np.zeros(num_clients, dtype=np.float64)
        self.outstanding = np.zeros(num_clients, dtype=np.int64)
        self._heap: list[tuple[float, int, Job]] = []
        self._cancelled: set[int] = set()  # job ids dropped while queued
        self.log: list[tuple] = []  # (job_id, task, client, version, send, start, finish)

    # --- dispatch and arrival ---------------------------------------------------------
    def dispatch(self, task: int, client: int, duration: float, version: int = 0) -> Job:
        """Queue a job at ``client`` now; it starts when the client's earlier jobs are done."""
        if duration < 0:
            raise ValueError(f"job duration must be >= 0, got {duration}")
        start = max(self.now, float(self.busy_until[client]))
        job = Job(self.next_id, task, int(client), version, self.now, start, start + duration)
        self.next_id += 1
        self.busy_until[client] = job.finish
        self.outstanding[client] += 1
        heapq.heappush(self._heap, (job.finish, job.job_id, job))
        return job

    def peek(self) -> Job | None:
        self._drop_cancelled()
        return self._heap[0][2] if self._heap else None

    def pop(self) -> Job:
        """Advance the clock to the next arrival and return its job (logged)."""
        self._drop_cancelled()
        if not self._heap:
            raise IndexError("no pending jobs")
        _, _, job = heapq.heappop(self._heap)
        self.now = job.finish
        self.outstanding[job.client] -= 1
        self.log.append((job.job_id, job.task, job.client, job.version, job.send, job.start,
                         job.finish))
        return job

    def cancel(self, job: Job) -> None:
        """Drop a queued job (its result never arrives); the client's queue is not rewound."""
        if job.job_id not in self._cancelled:
            self._cancelled.add(job.job_id)
            self.outstanding[job.client] -= 1

    def pending(self, task: int | None = None) -> list[Job]:
        """Queued jobs (of ``task``) in arrival order."""
        jobs = [j for _, _, j in self._heap if j.job_id not in self._cancelled]
        return sorted((j for j in jobs if task is None or j.task == task), key=Job.key)

    def advance_to(self, t: float) -> None:
        """Move the clock forward (synchronous rounds end at their last kept arrival)."""
        self.now = max(self.now, t)

    @property
    def num_busy(self) -> int:
        return int((self.outstanding > 0).sum())

    def is_busy(self, client: int) -> bool:
        return bool(self.outstanding[client] > 0)

    def _drop_cancelled(self) -> None:
        while self._heap and self._heap[0][1] in self._cancelled:
            _, jid, _ = heapq.heappop(self._heap)
            self._cancelled.discard(jid)

    # --- checkpoint ---------------------------------------------------------------------
    def state_dict(self) -> dict:
        """JSON-able state (the log is kept by the caller's events file)."""
        return {
            "now": self.now, "next_id": self.next_id,
            "busy_until": self.busy_until.tolist(), "outstanding": self.outstanding.tolist(),
            "jobs": [asdict(j) for j in self.pending()], "num_logged": len(self.log),
        }

    def load_state_dict(self, state: dict) -> None:
        self.now, self.next_id = float(state["now"]), int(state["next_id"])
        self.busy_until = np.asarray(state["busy_until"], dtype=np.float64)
        self.outstanding = np.asarray(state["outstanding"], dtype=np.int64)
        self._cancelled = set()
        self._heap = [(j["finish"], j["job_id"], Job(**j)) for j in state["jobs"]]
        heapq.heapify(self._heap)


def kth_arrival_round(
    clock: EventClock, clients: np.ndarray, durations: np.ndarray, k: int | None,
    task: int = 0, version: int = 0,
) -> tuple[np.ndarray, float]:
    """One synchronous cohort on the clock: dispatch all, keep the first ``k`` arrivals.

    Returns ``(kept positions into clients, time the k-th kept update arrives)``. Discarded
    stragglers are *not* cancelled: they stay busy until they finish (note A12), so they
    delay their next request. ``k=None`` keeps everyone (no straggler mitigation). The clock
    is not advanced; the caller ends the round at the max over tasks.
    """
    jobs = [clock.dispatch(task, int(c), float(d), version) for c, d in zip(clients, durations)]
    order = sorted(range(len(jobs)), key=lambda i: jobs[i].key())
    keep = order if k is None else order[: min(k, len(order))]
    for i in range(len(jobs)):  # a sync round consumes its own arrivals
        clock.cancel(jobs[i])
    for i in keep:
        j = jobs[i]
        clock.log.append((j.job_id, j.task, j.client, j.version, j.send, j.start, j.finish))
    end = max((jobs[i].finish for i in keep), default=clock.now)
    return np.sort(np.asarray(keep, dtype=np.int64)), end
