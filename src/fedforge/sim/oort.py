"""Oort's training selector (Lai et al., OSDI 2021), as its official code runs it.

Each client is an arm with a reward, a duration, the round it last reported and a count.
A client starts with reward ``|B_i|`` (the samples it would train on) and its expected
seconds on the clock; once it has trained, its reward is its statistical utility
``|B_i| sqrt(mean_k loss_k²)`` and its duration the seconds it took. Each round
(``SymbioticLab/Oort`` ``oort/oort.py``, ``_training_selector.getTopK``):

1. the pacer: every ``pacer_step`` rounds it compares the exploited clients' summed utility
   of the last ``pacer_step`` rounds with the ``pacer_step`` before; flat (within 10 %)
   relaxes the preferred duration's percentile by ``pacer_delta``, a jump (5x) tightens it;
2. ``T`` = that percentile of every client's duration (infinite at 100);
3. an explored client scores ``(min(r_i, clip) - r_min) / range + sqrt(0.1 ln t / t_i)``
   (rewards normalised over the pool, clipped at their ``clip_bound`` quantile; ``t_i`` the
   round it last reported), times ``(T / d_i)^round_penalty`` when ``d_i > T``;
4. ε decays (``max(ε decay, ε_min)``); ``int(m (1 - ε))`` clients are drawn, in proportion
   to their score, among those scoring at least ``cut_off_util`` times the score just past
   the cut;
5. the rest are explored: unexplored clients ranked by reward times the same speed penalty,
   ``m_explore`` drawn in proportion from the top ``sample_window x m_explore``; the cohort
   is filled up uniformly if clients are still missing.

The draws use a generator of ``(seed, round)`` instead of the code's global NumPy and Python
generators (same distributions); the code's blacklist (off by default) is not implemented.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from fedforge.algorithms.defaults import SAMPLER_DEFAULTS, defaults_from
from fedforge.sim.selection import Factory, Feedback, Pool, restore

_ARRAYS = ("reward", "duration", "last_round", "count", "successful", "exploit_history",
           "explore_history", "exploit_clients", "explore_clients")
_SCALARS = ("exploration", "exploration_min", "round_threshold", "registered")


def normalise(values: np.ndarray, clip_bound: float) -> tuple[float, float, float]:
    """``(clip value, min, range)`` of ``values`` as the code's ``get_norm`` computes them."""
    if values.size == 0:
        return 0.0, 0.0, 1.0
    a = np.sort(values)
    clip = float(a[min(int(len(a) * clip_bound), len(a) - 1)])
    low = float(a[0]) * 0.999
    return clip, low, max(float(a[-1]) - low, 1e-4)


def speed_penalty(durations: np.ndarray, preferred: float, alpha: float) -> np.ndarray:
    """``(T / d_i)^α`` where a client is slower than ``T``, else 1 (``d_i`` at least 1e-4 s,
    as the code guards it)."""
    return np.where(durations > preferred,
                    (preferred / np.maximum(1e-4, durations)) ** alpha, 1.0)


def weighted_draw(ids: np.ndarray, weights: np.ndarray, k: int,
                  rng: np.random.Generator) -> np.ndarray:
    """``k`` of ``ids`` without replacement, with probability ``w / sum w`` (the code's
    ``np.random.choice``); when at most ``k`` have a weight, those, then the others in order."""
    positive = np.flatnonzero(weights > 0)
    if len(positive) <= k:
        rest = np.flatnonzero(weights <= 0)
        return ids[np.concatenate([positive, rest])[:k]]
    return rng.choice(ids, size=k, replace=False, p=weights / weights.sum())


class Oort:
    """Oort's selector; its state is the arms' table plus the pacer's history."""

    name = "oort"
    needs_rms_loss = True

    def __init__(self, num_clients: int, **options: float) -> None:
        self.opt = options
        for key in ("exploration_factor", "exploration_decay", "exploration_min",
                    "cut_off_util", "clip_bound"):
            if not 0 <= options[key] <= 1:
                raise ValueError(f"server.sampler_options.{key}: expected a number in [0, 1], "
                                 f"got {options[key]!r}")
        for key in ("round_threshold", "pacer_delta", "sample_window", "round_penalty"):
            if not options[key] >= 0:
                raise ValueError(f"server.sampler_options.{key}: expected >= 0, got "
                                 f"{options[key]!r}")
        if not (isinstance(options["pacer_step"], int) and options["pacer_step"] >= 1):
            raise ValueError(f"server.sampler_options.pacer_step: expected an integer >= 1, "
                             f"got {options['pacer_step']!r}")
        n = num_clients
        self.reward, self.duration = np.zeros(n), np.zeros(n)
        self.last_round, self.count = np.zeros(n, np.int64), np.zeros(n, np.int64)
        self.successful = np.zeros(n, bool)  # reported since the last pacer call
        self.exploit_history, self.explore_history = np.zeros(0), np.zeros(0)
        self.exploit_clients = self.explore_clients = np.zeros(0, np.int64)
        self.exploration = float(options["exploration_factor"])
        self.exploration_min = float(options["exploration_min"])
        self.round_threshold = float(options["round_threshold"])
        self.registered = 0.0
        self.preferred = math.inf

    def _register(self, pool: Pool) -> None:
        """The code's ``register_client``: reward = samples, duration = expected seconds."""
        self.reward[:], self.duration[:] = pool.samples, pool.durations
        self.registered = 1.0

    def _mean_util(self, clients: np.ndarray) -> float:
        ok = clients[self.successful[clients]]
        return float(self.reward[ok].sum()) / (1e-4 + len(ok))

    def pacer(self, round_: int) -> None:
        """Record last round's utilities; every ``pacer_step`` rounds move the percentile."""
        self.explore_history = np.append(self.explore_history,
                                         self._mean_util(self.explore_clients))
        self.exploit_history = np.append(self.exploit_history,
                                         self._mean_util(self.exploit_clients))
        self.successful[:] = False
        step, delta = self.opt["pacer_step"], self.opt["pacer_delta"]
        if round_ >= 2 * step and round_ % step == 0:
            last = float(self.exploit_history[-2 * step:-step].sum())
            now = float(self.exploit_history[-step:].sum())
            if abs(now - last) <= last * 0.1:  # utility flat: admit slower clients
                self.round_threshold = min(100.0, self.round_threshold + delta)
            elif abs(now - last) >= last * 5:
                self.round_threshold = max(delta, self.round_threshold - delta)

    def scores(self, round_: int, feasible: np.ndarray) -> np.ndarray:
        """The explored clients' scores (NaN for the others), for the pool ``feasible``."""
        rewarded = feasible[self.reward[feasible] > 0]
        clip, low, span = normalise(self.reward[rewarded], self.opt["clip_bound"])
        explored = feasible[self.count[feasible] > 0]
        out = np.full(len(self.reward), np.nan)
        r = np.minimum(self.reward[explored], clip)
        sc = (r - low) / span + np.sqrt(0.1 * math.log(round_) / self.last_round[explored])
        sc *= speed_penalty(self.duration[explored], self.preferred, self.opt["round_penalty"])
        out[explored] = sc
        return out

    def select(self, round_: int, m: int, pool: Pool, rng: np.random.Generator) -> np.ndarray:
        if not self.registered:
            self._register(pool)
        feasible = np.arange(len(pool.sizes))
        self.pacer(round_)
        if self.round_threshold < 100.0:  # T: a percentile of every client's duration
            d = np.sort(self.duration)
            self.preferred = float(d[int(len(d) * self.round_threshold / 100.0)])
        else:
            self.preferred = math.inf
        score = self.scores(round_, feasible)
        scored = feasible[~np.isnan(score[feasible])]
        self.exploration = max(self.exploration * self.opt["exploration_decay"],
                               self.exploration_min)
        exploit_len = min(int(m * (1.0 - self.exploration)), len(scored))
        exploit = self._exploit(scored, score, exploit_len, rng)
        explore = self._explore(feasible, m - len(exploit), rng)
        self.exploit_clients, self.explore_clients = exploit, explore
        chosen = np.concatenate([exploit, explore])
        rest = np.setdiff1d(feasible, chosen)  # too few of either kind: fill uniformly
        return np.sort(np.concatenate([chosen, rng.permutation(rest)[:m - len(chosen)]]))

    def _exploit(self, scored: np.ndarray, score: np.ndarray, k: int,
                 rng: np.random.Generator) -> np.ndarray:
        """``k`` drawn ∝ score among those scoring at least ``cut_off_util`` x the score of
        the ``k``-th best's successor (the last one's when all are taken)."""
        if k == 0:
            return scored[:0]
        ranked = scored[np.lexsort((scored, -score[scored]))]
        cut = score[ranked[min(k, len(ranked) - 1)]] * self.opt["cut_off_util"]
        above = ranked[score[ranked] >= cut]
        return weighted_draw(above, score[above], k, rng)

    def _explore(self, feasible: np.ndarray, room: int, rng: np.random.Generator) -> np.ndarray:
        unexplored = feasible[self.count[feasible] == 0]
        if len(unexplored) == 0:  # nothing left to explore: exploit only from now on
            self.exploration_min = self.exploration = 0.0
            return unexplored
        init = self.reward[unexplored] * speed_penalty(self.duration[unexplored],
                                                       self.preferred, self.opt["round_penalty"])
        n = min(len(unexplored), room)
        top = np.lexsort((unexplored, -init))[:int(self.opt["sample_window"] * n)]
        return weighted_draw(unexplored[top], init[top], n, rng)

    def observe(self, round_: int, feedback: Feedback) -> None:
        ids = feedback.ids
        self.reward[ids] = feedback.rms_loss * feedback.samples
        self.duration[ids] = feedback.durations
        self.last_round[ids] = round_
        self.count[ids] += 1
        self.successful[ids] = True

    def state_dict(self) -> dict[str, torch.Tensor]:
        state = {k: torch.from_numpy(np.array(getattr(self, k))) for k in _ARRAYS}
        state.update({k: torch.tensor(float(getattr(self, k)), dtype=torch.float64)
                      for k in _SCALARS})
        return state

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        for k in _ARRAYS:
            setattr(self, k, restore(state, k, self.name))
        for k in _SCALARS:
            setattr(self, k, float(restore(state, k, self.name)))

    def metrics(self) -> dict[str, float]:
        out = {"oort_exploration": self.exploration,
               "oort_round_threshold": self.round_threshold,
               "oort_explored_clients": float((self.count > 0).sum())}
        if math.isfinite(self.preferred):
            out["oort_preferred_duration_s"] = self.preferred
        return out


@defaults_from("oort", SAMPLER_DEFAULTS)
def oort(*, exploration_factor, exploration_decay, exploration_min, round_threshold,
         round_penalty, pacer_step, pacer_delta, cut_off_util, sample_window,
         clip_bound) -> Factory:
    options = dict(exploration_factor=exploration_factor, exploration_decay=exploration_decay,
                   exploration_min=exploration_min, round_threshold=round_threshold,
                   round_penalty=round_penalty, pacer_step=pacer_step, pacer_delta=pacer_delta,
                   cut_off_util=cut_off_util, sample_window=sample_window, clip_bound=clip_bound)
    return lambda n, m, b: Oort(n, **options)  # m and |B_i| come from each round's pool
