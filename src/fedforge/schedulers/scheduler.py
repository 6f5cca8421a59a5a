"""The scheduler protocol: one multi-task method on the simulated clock, with its checkpoint.

A scheduler (:class:`fedforge.schedulers.fedast.AsyncScheduler`,
:class:`fedforge.schedulers.multitask_sync.SyncScheduler`) decides which client trains which task's
model and when; the multi-task driver steps it, logs what it reports and checkpoints what
its :meth:`Scheduler.state_dict` returns, so no other module serialises a scheduler by its
type. This module also holds the part of that state every scheduler shares: the update
count, the generator, the clock, the delay law and each task's server.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Protocol

import numpy as np

from fedforge.schedulers.task import Task
from fedforge.sim.clock import EventClock
from fedforge.sim.delays import DelayLaw

OnEval = Callable[[int, dict], None]
"""Called with (task index, record) for each evaluation a step runs."""


class Scheduler(Protocol):
    """What the multi-task driver steps. ``c``: client updates applied so far.

    ``start`` (a fresh run) or ``load_state_dict`` (a resumed one) comes first; then
    ``step`` until ``done``, with ``state_dict`` at each checkpoint and ``collect`` after it
    is written; ``close`` at the end."""

    tasks: list[Task]
    clock: EventClock
    delay: DelayLaw
    rng: np.random.Generator
    c: int

    def start(self) -> None:
        """Begin a fresh run (first requests, empty client stores)."""

    def step(self, on_eval: OnEval) -> object:
        """One arriving update, or one round of every task."""

    def done(self, max_updates: int | None = None, max_time: float | None = None) -> bool:
        """Whether the run ends before the next step: every task at its target, nothing
        left to step, ``max_updates`` applied, or the next step past ``max_time``."""

    def state_dict(self) -> tuple[dict, dict]:
        """The checkpoint: (tensors, the JSON table ``RunState.driver`` keeps)."""

    def load_state_dict(self, tensors: dict, meta: dict, where: object = "checkpoint") -> None:
        """Continue from :meth:`state_dict`'s output, read from ``where``."""

    def collect(self, metas: Iterable[dict]) -> None:
        """After a checkpoint: delete what none of the kept checkpoints' ``metas`` names."""

    def close(self) -> None:
        """Release open files."""

    def summary(self) -> dict:
        """The method's own fields of ``summary.json``."""


def shared_state(s: Scheduler) -> tuple[dict, dict]:
    """The state every scheduler checkpoints -> (tensors per task, meta)."""
    meta = {"c": s.c, "rng": _rng_state(s.rng), "clock": s.clock.state_dict(),
            "delay": s.delay.state_dict(), "tasks": [_task_meta(t) for t in s.tasks]}
    return {f"task{m}": t.server.state_dict() for m, t in enumerate(s.tasks)}, meta


def load_shared_state(s: Scheduler, tensors: dict, meta: dict) -> None:
    """The inverse of :func:`shared_state`."""
    s.c = meta["c"]
    _set_rng(s.rng, meta["rng"])
    s.clock.load_state_dict(meta["clock"])
    s.delay.load_state_dict(meta["delay"])
    for m, t in enumerate(s.tasks):
        tt, tm = tensors[f"task{m}"], meta["tasks"][m]
        t.server.load({"params": tt["params"], "server": tt.get("server", {}),
                       "buf_sum": tt["buf_sum"]}, tm)
        t.done, t.done_time, t.losses = tm["done"], tm["done_time"], list(tm["losses"])


def _task_meta(t: Task) -> dict:
    return {**t.server.meta(), "done": t.done, "done_time": t.done_time, "losses": t.losses}


def _rng_state(rng: np.random.Generator) -> dict:
    st = rng.bit_generator.state
    return {"bit_generator": st["bit_generator"], "state": {k: str(v) for k, v in
                                                            st["state"].items()},
            "has_uint32": st["has_uint32"], "uinteger": st["uinteger"]}


def _set_rng(rng: np.random.Generator, saved: dict) -> None:
    rng.bit_generator.state = {
        "bit_generator": saved["bit_generator"],
        "state": {k: int(v) for k, v in saved["state"].items()},
        "has_uint32": saved["has_uint32"], "uinteger": saved["uinteger"],
    }
