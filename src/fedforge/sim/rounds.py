"""Straggler-aware time of synchronous rounds, for the single-task synchronous runner.

Each round the sampled clients get one request each on the shared event clock (FCFS: a
client still busy with an earlier, discarded request starts late). The round ends when the
k-th kept update arrives (``k=None``: the last one); stragglers beyond k are discarded and
stay busy. Delays come from a :mod:`fedforge.sim.delays` law and the client speed classes.
Randomness is drawn from ``(seed, round)`` so a resumed run draws what an uninterrupted one
draws; the clients' queue tails are the only carried state (``state_dict``).
"""

from __future__ import annotations

import numpy as np

from fedforge.engine.draw import RoundDraw
from fedforge.sim.clock import EventClock, kth_arrival_round
from fedforge.sim.delays import DelayLaw, ShiftedExponential
from fedforge.sim.population import Population


class SyncRoundClock:
    def __init__(self, population: Population, delay: DelayLaw | None = None,
                 k: int | None = None, step_time: float = 1.0, seed: int = 0) -> None:
        if k is not None and k < 1:
            raise ValueError(f"sim.straggler_k: expected >= 1 or none, got {k}")
        self.pop, self.delay = population, delay or ShiftedExponential()
        self.k, self.step_time, self.seed = k, step_time, seed
        self.clock = EventClock(population.num_clients)

    def round(self, round_: int, client_ids, local_steps: int) -> tuple[np.ndarray, float]:
        """Dispatch the round's clients; -> (kept positions into ``client_ids``, round seconds).

        The clock moves to the round's end; the caller aggregates only the kept clients
        (or all of them, to keep the round's maths unchanged and only account time).
        """
        rng = np.random.default_rng(np.random.SeedSequence([self.seed, 31, round_]))
        ids = np.asarray(client_ids, dtype=np.int64)
        durs = np.array([self.delay.sample(rng, int(c), float(self.pop.speed[c]), local_steps,
                                           self.step_time) for c in ids])
        start = self.clock.now
        keep, end = kth_arrival_round(self.clock, ids, durs, self.k, 0, round_)
        self.clock.advance_to(end)
        return keep, end - start

    def round_from_base(self, round_: int, client_ids, base_seconds) -> tuple[np.ndarray, float]:
        """Like :meth:`round`, with each client's nominal seconds given (e.g. the cost model's
        download + steps x step time + upload): duration = law(tau=1, e=base_i, speed_i)."""
        rng = np.random.default_rng(np.random.SeedSequence([self.seed, 31, round_]))
        ids = np.asarray(client_ids, dtype=np.int64)
        base = np.broadcast_to(np.asarray(base_seconds, dtype=np.float64), ids.shape)
        durs = np.array([self.delay.sample(rng, int(c), float(self.pop.speed[c]), 1, float(b))
                         for c, b in zip(ids, base)])
        self.last_durations = durs  # each client's seconds, for a sampler (fedforge.sim.oort)
        start = self.clock.now
        keep, end = kth_arrival_round(self.clock, ids, durs, self.k, 0, round_)
        self.clock.advance_to(end)
        return keep, end - start

    @property
    def now(self) -> float:
        return self.clock.now

    def state_dict(self) -> dict:
        return {"now": self.clock.now, "busy_until": self.clock.busy_until.tolist()}

    def load_state_dict(self, state: dict) -> None:
        self.clock.now = float(state["now"])
        self.clock.busy_until = np.asarray(state["busy_until"], dtype=np.float64)


def straggler_clock(sim, num_clients: int, seed: int,
                    state: dict | None = None) -> SyncRoundClock | None:
    """The runner's straggler clock from the ``sim`` config section (None unless
    ``sim.stragglers``); with ``state``, the queue tails a checkpoint saved."""
    if not getattr(sim, "stragglers", False):
        return None
    from fedforge.sim.delays import delay_from

    pop = Population.build(num_clients, [tuple(c) for c in sim.speed_classes], sim.speed_seed)
    clock = SyncRoundClock(pop, delay_from(sim), sim.straggler_k, seed=seed)
    if state:
        clock.load_state_dict(state)
    return clock


def straggler_round(clock: SyncRoundClock, draw: RoundDraw, cost, down_bytes: float,
                    up_bytes: float) -> tuple[np.ndarray, float]:
    """-> (kept positions into the draw, for :meth:`RoundDraw.keep`; round seconds): nominal
    client time from the cost model (download + steps x step time + upload), scaled by the
    client's speed class and the delay law."""
    steps = (draw.weights.sum(-1) > 0).sum(-1).cpu().numpy()  # [C] steps each really takes
    base = [cost.client_seconds(float(s), down_bytes, up_bytes) for s in steps]
    return clock.round_from_base(draw.round, draw.client_ids.cpu().numpy(), base)
