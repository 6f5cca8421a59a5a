"""Asynchronous multi-task runs over ``torch.distributed`` ranks.

The simulator (clock, servers, allocation) lives on rank 0 alone. When it needs results, a
:class:`ScatteredExecutor` splits the batch of dispatched jobs into contiguous shards and
scatters each rank its jobs with the model versions they were sent; every rank (rank 0 too)
trains its shard with the task's vmapped local update and the deltas are gathered back to
rank 0. The other ranks run :func:`serve_jobs` until rank 0 sends the stop message. A job's
result depends only on (model version, client, job id), so the run equals the one-process
run to float tolerance, event for event.

Tensors cross as pickled CPU tensors (object collectives), which works on gloo and NCCL
alike; on GPUs this host round trip is the price of keeping the simulator on one rank.
"""

from __future__ import annotations

from typing import Protocol

import torch.distributed as dist

from fedforge.core.tree import tree_to
from fedforge.engine.distributed import shard_bounds
from fedforge.schedulers.jobs import Job, TaskExecutor


class Task(Protocol):
    """What the ranks need of a multi-task run's task: its executor."""

    executor: TaskExecutor


def _exchange(executors: list[TaskExecutor], messages: list[dict] | None) -> tuple[bool, list]:
    """One scatter -> train -> gather exchange. Rank 0 passes one message per rank (the
    others pass None) -> (stopped, rank 0: every rank's ``(deltas, losses)`` or None)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    box: list = [None]
    dist.scatter_object_list(box, messages if rank == 0 else None, src=0)
    mine = box[0]
    if mine.get("stop"):
        return True, []
    ex = executors[mine["task"]]
    result = None
    if mine["jobs"]:  # fewer jobs than ranks: some ranks idle this batch
        versions = {v: tree_to(pb, ex.x_all.device) for v, pb in mine["versions"].items()}
        deltas, losses = ex.train_jobs(mine["jobs"], versions)
        result = (tree_to(deltas, "cpu"), losses)
    gathered: list | None = [None] * world if rank == 0 else None
    dist.gather_object(result, gathered, dst=0)
    return False, gathered or []


class ScatteredExecutor(TaskExecutor):
    """Rank 0's executor: each batch of jobs is trained across all ranks.

    ``peers`` (every task's executor on rank 0, by task index) is set by
    :func:`link_executors`; the worker ranks look a message's task up the same way.
    """

    peers: list[TaskExecutor]

    def _compute(self, jobs: list[Job]) -> None:
        world = dist.get_world_size()
        shards = [jobs[slice(*shard_bounds(len(jobs), r, world))] for r in range(world)]
        messages = [{"task": self.task, "jobs": shard,
                     "versions": {j.version: tree_to(self.versions[j.version], "cpu")
                                  for j in shard}} for shard in shards]
        _, gathered = _exchange(self.peers, messages)
        for shard, part in zip(shards, gathered):
            if part is not None:
                deltas, losses = part
                self._store(shard, tree_to(deltas, self.x_all.device), losses)


def link_executors(tasks: list[Task]) -> None:
    """Rank 0: give each :class:`ScatteredExecutor` the list of all tasks' executors."""
    executors = [t.executor for t in tasks]
    for ex in executors:
        ex.peers = executors


def serve_jobs(tasks: list[Task]) -> int:
    """Ranks > 0: train the shards rank 0 scatters until it says stop -> batches trained."""
    executors = [t.executor for t in tasks]
    served = 0
    while not _exchange(executors, None)[0]:
        served += 1
    return served


def stop_workers() -> None:
    """Rank 0: release the ranks waiting in :func:`serve_jobs`."""
    _exchange([], [{"stop": True}] * dist.get_world_size())
