"""Engines run a cohort's local rounds; they never name an algorithm."""

from fedforge.engine.auto import AutoEngine
from fedforge.engine.base import ChunkedEngine, CohortInputs, CohortOutput
from fedforge.engine.distributed import DistributedEngine
from fedforge.engine.local import LocalResult, classification_loss, make_local_update
from fedforge.engine.loop import LoopEngine
from fedforge.engine.procs import ProcessEngine
from fedforge.engine.vmap import VmapEngine

ENGINES = {"auto": AutoEngine, "vmap": VmapEngine, "loop": LoopEngine,
           "distributed": DistributedEngine, "procs": ProcessEngine}


def build_engine(name: str = "vmap", **kwargs) -> ChunkedEngine:
    """Engine by name (``auto`` times loop and vmap variants, ``loop`` is the reference,
    ``procs`` splits the cohort over worker processes)."""
    if name not in ENGINES:
        raise ValueError(f"engine.name: unknown engine {name!r}; expected one of {sorted(ENGINES)}")
    return ENGINES[name](**kwargs)


__all__ = [
    "ENGINES", "AutoEngine", "ChunkedEngine", "CohortInputs", "CohortOutput", "DistributedEngine",
    "LocalResult", "LoopEngine", "ProcessEngine", "VmapEngine", "build_engine",
    "classification_loss", "make_local_update",
]
