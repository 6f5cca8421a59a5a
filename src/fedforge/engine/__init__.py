"""Engines run a cohort's local rounds; they never name an algorithm."""

from fedforge.engine.auto import AutoEngine
from fedforge.engine.base import ChunkedEngine, CohortInputs, CohortOutput
from fedforge.engine.build import ENGINE_NAMES, build_engine, build_job_engine
from fedforge.engine.distributed import DistributedEngine
from fedforge.engine.local import (
    LocalResult,
    classification_loss,
    local_update_of,
    make_local_update,
)
from fedforge.engine.loop import LoopEngine
from fedforge.engine.procs import ProcessEngine
from fedforge.engine.vmap import VmapEngine

__all__ = [
    "ENGINE_NAMES", "AutoEngine", "ChunkedEngine", "CohortInputs", "CohortOutput",
    "DistributedEngine", "LocalResult", "LoopEngine", "ProcessEngine", "VmapEngine",
    "build_engine", "build_job_engine", "classification_loss", "local_update_of",
    "make_local_update",
]
