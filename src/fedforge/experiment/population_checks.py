"""What a run over a population dataset (``synthetic_population``) cannot do, refused when
the config loads, in one line naming the field.

A population generates each client's data when the client is drawn and never holds the whole
training set, so whatever needs every client's samples at once is refused: label-flipping
attackers (they rewrite the training labels in place), the personalised evaluation (every
client's own test split, held in memory), multi-task runs (each task's dataset is split once,
whole) and the Flower bridge (its clients read the partition's index table). Everything else
(every engine, both client stores, robust aggregators and model attacks, stragglers,
differential privacy, ``eval.held_out``) runs as on a dataset held in memory.
"""

from __future__ import annotations

from typing import Any

from fedforge.data.loaders import is_population
from fedforge.errors import ConfigError

WHY = "generates each client's data when the client is drawn"


def check_population_run(cfg: Any, algorithm: Any) -> None:
    """A single-task run over a population: no data attack, no personalised evaluation."""
    name = cfg.data.dataset
    if not is_population(name):
        return
    if cfg.attack.kind == "label_flip":
        raise ConfigError(f"attack.kind: 'label_flip' rewrites the training labels held in "
                          f"memory, and {name!r} {WHY}; use 'sign_flip', 'scale' or 'random'")
    personal = cfg.eval.personal
    if personal or (personal is None and algorithm.personal is not None):
        default = "" if personal else f" (on by default for {algorithm.name!r})"
        raise ConfigError(f"eval.personal: the personalised evaluation{default} holds every "
                          f"client's own test data in memory, and {name!r} {WHY}; set "
                          "eval.personal = false")


def check_population_task(where: str, dataset: str) -> None:
    """A multi-task run's task: never a population (``where``: e.g. ``tasks[0].``)."""
    if is_population(dataset):
        raise ConfigError(f"{where}data.dataset: a multi-task run splits each task's dataset "
                          f"once, whole, and {dataset!r} {WHY}; run it as a single-task run")


def refuse_population(dataset: str, what: str) -> None:
    """``what`` (e.g. the Flower bridge) reads the whole partition: refuse a population."""
    if is_population(dataset):
        raise ConfigError(f"data.dataset: {what} reads the whole partition, and {dataset!r} "
                          f"{WHY}; run it with `fedforge run`")
