"""Client selection: which of a round's candidates train (``server.sampler``).

A sampler is the part of a run that picks the cohort. It sees the pool of clients that may
train (their sample counts and their expected seconds on the simulated clock), can ask for
the current global model's loss on any of them, and after the round is told what the
participants reported (their training loss, their loss statistics at the round's start, the
samples they trained on and their seconds on the clock). It never touches weights, so it
composes with every algorithm. ``uniform`` (the default) is no sampler at all: the round
draws its cohort as it always has.

Every random draw comes from a generator seeded by ``(seed, round)``, and everything a
sampler learns is in :meth:`Sampler.state_dict` (tensors of the checkpoint), so a resumed
run selects exactly what an uninterrupted one selects.

* :class:`PowerOfChoice` (Cho, Wang & Joshi 2022): ``d`` candidates drawn without
  replacement with probability ``n_k / n``; the ``m`` of highest local loss train. Its
  variants differ only in the loss they rank by: ``pow-d`` the global model's loss on each
  candidate's whole data, ``cpow-d`` on a mini-batch of ``batch`` samples, ``rpow-d`` the
  training loss the client last reported (never seen: +inf, so it is tried first).
* :class:`fedforge.sim.oort.Oort` (Lai et al. 2021): in its own module.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

from fedforge.algorithms.defaults import SAMPLER_DEFAULTS, defaults_from

LossFn = Callable[[np.ndarray, "int | None", np.random.Generator], np.ndarray]
"""``(client ids, batch or None, rng) -> [len(ids)]`` mean loss of the current global model on
each client's data (``batch``: on that many of its samples, drawn with ``rng``)."""


@dataclass(frozen=True)
class Pool:
    """What a sampler may look at when it selects: every client that may train this round.

    ``sizes[i]``: client i's training samples; ``samples[i]``: how many of them it trains on
    in a round (Oort's ``|B_i|``); ``durations[i]``: its expected seconds on the simulated
    clock; ``losses``: the current global model's loss on clients."""

    sizes: np.ndarray
    samples: np.ndarray
    durations: np.ndarray
    losses: LossFn


@dataclass(frozen=True)
class Feedback:
    """What a round's participants reported, one entry per client in ``ids``.

    ``train_loss``: the mean loss over their local steps; ``rms_loss``: sqrt of the mean
    squared per-sample loss of the round's starting model on the samples they trained on;
    ``samples``: how many samples they trained on (at most their data); ``durations``:
    their seconds on the clock."""

    ids: np.ndarray
    train_loss: np.ndarray
    rms_loss: np.ndarray
    samples: np.ndarray
    durations: np.ndarray


class Sampler(Protocol):
    """Picks each round's cohort; learns from what the round reports."""

    name: str
    needs_rms_loss: bool  # Feedback.rms_loss is computed only for samplers that read it

    def select(self, round_: int, m: int, pool: Pool, rng: np.random.Generator) -> np.ndarray:
        """The ``m`` client ids that train in round ``round_`` (sorted)."""

    def observe(self, round_: int, feedback: Feedback) -> None:
        """Take in what round ``round_``'s participants reported."""

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Everything learnt so far, as tensors (the checkpoint's ``sampler/...``)."""

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Continue from :meth:`state_dict`'s tensors (a key missing: one-line error)."""

    def metrics(self) -> dict[str, float]:
        """Diagnostics logged on evaluated rounds."""


def selection_rng(seed: int, round_: int) -> np.random.Generator:
    """The round's selection draws: independent of the cohort's batches and of earlier rounds."""
    return np.random.default_rng(np.random.SeedSequence([seed, 0x5E1EC7, round_]))


def draw_by_size(sizes: np.ndarray, d: int, rng: np.random.Generator) -> np.ndarray:
    """``d`` distinct clients drawn with probability ``n_k / n`` (clients without data never;
    all of those with data when ``d`` reaches their count), in draw order."""
    has = np.flatnonzero(sizes > 0)
    if d >= len(has):
        return rng.permutation(has)
    return rng.choice(has, size=d, replace=False, p=sizes[has] / sizes[has].sum())


def top_by(values: np.ndarray, ids: np.ndarray, m: int) -> np.ndarray:
    """The ``m`` of ``ids`` with the highest ``values``, ties to the lower id; sorted."""
    order = np.lexsort((ids, -values))  # last key first: value descending, then id
    return np.sort(ids[order[:m]])


def restore(state: dict[str, torch.Tensor], key: str, name: str) -> np.ndarray:
    """One array of a sampler's checkpoint state; a missing key is refused in one line."""
    if key not in state:
        raise ValueError(f"checkpoint: sampler {name!r} state has no {key!r} (written by "
                         "another sampler?); choose another --out or pass --overwrite")
    return state[key].detach().cpu().numpy().copy()


VARIANTS = ("pow-d", "cpow-d", "rpow-d")


class PowerOfChoice:
    """Power-of-Choice: the m highest-loss clients of d candidates drawn by data size."""

    name = "power_of_choice"
    needs_rms_loss = False

    def __init__(self, num_clients: int, clients_per_round: int, *, d: int | None,
                 variant: str, batch: int | None, batch_size: int) -> None:
        if variant not in VARIANTS:
            raise ValueError(f"server.sampler_options.variant: expected one of {VARIANTS}, "
                             f"got {variant!r}")
        d = 2 * clients_per_round if d is None else d
        if not isinstance(d, int) or d < clients_per_round:
            raise ValueError(f"server.sampler_options.d: expected an integer >= "
                             f"server.clients_per_round ({clients_per_round}), got {d!r}")
        if batch is not None and (not isinstance(batch, int) or batch < 1):
            raise ValueError(f"server.sampler_options.batch: expected an integer >= 1, got "
                             f"{batch!r}")
        self.d, self.variant = d, variant
        self.batch = (batch or batch_size) if variant == "cpow-d" else None
        self.last_loss = np.full(num_clients, np.inf)  # rpow-d: what each client last reported

    def select(self, round_: int, m: int, pool: Pool, rng: np.random.Generator) -> np.ndarray:
        candidates = draw_by_size(pool.sizes, self.d, rng)
        if self.variant == "rpow-d":
            loss = self.last_loss[candidates]
        else:
            loss = pool.losses(candidates, self.batch, rng)
        return top_by(loss, candidates, m)

    def observe(self, round_: int, feedback: Feedback) -> None:
        self.last_loss[feedback.ids] = feedback.train_loss

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {"last_loss": torch.from_numpy(self.last_loss.copy())}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        self.last_loss = restore(state, "last_loss", self.name)

    def metrics(self) -> dict[str, float]:
        return {}


Factory = Callable[[int, int, int], Sampler]
"""``(trainable clients, server.clients_per_round, client.batch_size) -> sampler``."""


@defaults_from("power_of_choice", SAMPLER_DEFAULTS)
def power_of_choice(*, d, variant, batch) -> Factory:
    return lambda n, m, b: PowerOfChoice(n, m, d=d, variant=variant, batch=batch, batch_size=b)
