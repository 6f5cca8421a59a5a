"""The one place an engine is built: from the run's ``[engine]`` section and explicit flags.

Every run builds its engines here (single-task rounds, multi-task rounds, multi-task jobs),
from the Python API and the ``fedforge`` command alike, so the same section and the same
flags give the same engine. Building one sets the process's intra-op threads
(``engine.threads``, :mod:`fedforge.engine.threads`, which reads ``OMP_NUM_THREADS``);
nothing else is read from the environment of the process:

* ``allow_processes``: whether ``engine.name = "auto"`` may start worker processes. A spawned
  worker re-imports the main module, which only fedforge's own entry points are known to
  guard, so the ``fedforge`` command passes ``True`` and the Python API defaults to ``False``
  (``run_experiment(..., allow_processes=True)`` from a guarded script). An explicit
  ``engine.name = "procs"`` is a request for worker processes and always starts them.
* ``keep_deltas``: whether the cohort's per-client deltas are returned besides their mean
  (robust aggregators and attacks need them).
"""

from __future__ import annotations

from typing import Protocol

from fedforge.engine.auto import AutoEngine
from fedforge.engine.base import ChunkedEngine
from fedforge.engine.distributed import DistributedEngine
from fedforge.engine.loop import LoopEngine
from fedforge.engine.procs import ProcessEngine
from fedforge.engine.threads import apply_threads
from fedforge.engine.vmap import VmapEngine

ENGINE_NAMES = ("auto", "vmap", "loop", "distributed", "procs")


class EngineSection(Protocol):
    """What the builder reads of a run's ``[engine]`` section (``RunConfig.engine``)."""

    name: str
    chunk_size: int | str
    compile: bool | str


def _check_name(name: str) -> None:
    if name not in ENGINE_NAMES:
        raise ValueError(f"engine.name: unknown engine {name!r}; expected one of "
                         f"{sorted(ENGINE_NAMES)}")


def build_engine(section: EngineSection, *, allow_processes: bool, keep_deltas: bool = False,
                 budget_updates: int | None = None) -> ChunkedEngine:
    """The engine that runs a cohort's local rounds, after setting this process's intra-op
    threads from ``section.threads`` (:mod:`fedforge.engine.threads`).

    ``budget_updates``: the run's client updates (rounds x clients per round), which bounds
    what ``auto`` may spend timing candidates; ``None`` runs its measured default."""
    name = section.name
    _check_name(name)
    apply_threads(getattr(section, "threads", "auto"))
    if name == "loop":
        return LoopEngine(keep_deltas=keep_deltas)
    if name == "procs":  # its workers run the loop: no compiled chunks
        return ProcessEngine(keep_deltas=keep_deltas, chunk_size=section.chunk_size)
    if name == "auto":
        return AutoEngine(section.chunk_size, compile=section.compile, keep_deltas=keep_deltas,
                          budget_updates=budget_updates, allow_processes=allow_processes)
    cls = DistributedEngine if name == "distributed" else VmapEngine
    return cls(section.chunk_size, compile=section.compile, keep_deltas=keep_deltas)


def build_job_engine(section: EngineSection) -> ChunkedEngine:
    """The engine whose jobs mode trains a multi-task run's dispatched jobs, in this
    process: the loop; ``procs`` hands its jobs to the loop its workers would run (jobs mode
    starts no process); otherwise the vmapped engine (under torchrun each rank trains its
    shard of jobs with its own)."""
    _check_name(section.name)
    apply_threads(getattr(section, "threads", "auto"))
    if section.name == "loop":
        return LoopEngine()
    if section.name == "procs":
        return ProcessEngine()
    return VmapEngine(section.chunk_size)
