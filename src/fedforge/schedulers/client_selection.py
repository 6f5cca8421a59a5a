"""A run's client sampler (``server.sampler``) fed from the round driver.

The sampler (:mod:`fedforge.sim.selection`) never sees the model or the data; this module
gives it what it may look at: each client's sample count, its expected seconds on the
simulated clock (the cost model's download + steps x step time + upload, times its speed
class and the delay law's mean factor when ``sim.stragglers`` simulates device speeds), the
global model's loss on any client, and after each round what the participants reported.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from fedforge.core.tree import Params, upcast
from fedforge.data.loaders import is_population
from fedforge.engine.evaluate import predict
from fedforge.errors import ConfigError
from fedforge.sim.cost import CostModel
from fedforge.sim.rounds import SyncRoundClock
from fedforge.sim.samplers import build_sampler
from fedforge.sim.selection import Feedback, Pool, Sampler, selection_rng


def check_sampler(cfg) -> None:
    """``server.sampler`` and its options, and what a sampler cannot be combined with, when
    the config loads, in one line each (ConfigError)."""
    name = cfg.server.sampler
    try:  # the options checked as the run will build them
        build_sampler(name, dict(cfg.server.sampler_options), num_clients=1,
                      clients_per_round=cfg.server.clients_per_round,
                      batch_size=cfg.client.batch_size)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    if name == "uniform":
        return
    if cfg.privacy.on:
        raise ConfigError(f"server.sampler: {name!r} picks clients by what they report, which "
                          "differential privacy's Poisson sampling and its accounting do not "
                          "allow; use 'uniform'")
    if is_population(cfg.data.dataset):
        raise ConfigError(f"server.sampler: {name!r} keeps a record per client, and "
                          f"{cfg.data.dataset!r} generates each client's data when the client "
                          "is drawn; use 'uniform'")


class Selection:
    """The run's sampler with its view of the clients; held by the round driver."""

    def __init__(self, sampler: Sampler, exp, cost: CostModel,
                 clock: SyncRoundClock | None) -> None:
        self.sampler, self.exp, self.cost, self.clock = sampler, exp, cost, clock
        cfg, n = exp.cfg, trainable(exp)
        sizes = exp.client_sizes[:n].numpy().astype(np.int64)
        b, steps = cfg.client.batch_size, cfg.client.local_steps
        self.steps = (np.full(n, steps, dtype=np.float64) if steps is not None
                      else cfg.client.local_epochs * np.ceil(sizes / b))
        self.sizes = sizes
        self.samples = np.minimum(sizes, self.steps * b).astype(np.float64)
        if clock is None:
            self.speed, self.mean_factor = np.ones(n), 1.0
        else:  # the straggler clock's speed classes and its delay law's mean
            self.speed = np.asarray(clock.pop.speed[:n], dtype=np.float64)
            self.mean_factor = 1.0 + float(getattr(clock.delay, "shift", 0.0))

    @classmethod
    def build(cls, exp, cost: CostModel, clock: SyncRoundClock | None) -> Selection | None:
        cfg = exp.cfg
        sampler = build_sampler(cfg.server.sampler, dict(cfg.server.sampler_options),
                                num_clients=trainable(exp),
                                clients_per_round=cfg.server.clients_per_round,
                                batch_size=cfg.client.batch_size)
        return None if sampler is None else cls(sampler, exp, cost, clock)

    def expected_seconds(self, down: float, up: float) -> np.ndarray:
        """Each client's expected seconds on the clock this round."""
        base = np.array([self.cost.client_seconds(float(s), down, up) for s in self.steps])
        return base * self.speed * self.mean_factor

    def choose(self, round_: int, params: Params, down: float, up: float) -> torch.Tensor:
        """The round's cohort, sorted (int64, on the CPU like the uniform draw)."""
        m = min(self.exp.cfg.server.clients_per_round, len(self.sizes))
        pool = Pool(self.sizes, self.samples, self.expected_seconds(down, up),
                    lambda ids, batch, rng: self.losses(params, ids, batch, rng)[0])
        ids = self.sampler.select(round_, m, pool, selection_rng(self.exp.cfg.seed, round_))
        return torch.as_tensor(np.asarray(ids, dtype=np.int64))

    def losses(self, params: Params, ids: np.ndarray, batch: int | None = None,
               rng: np.random.Generator | None = None,
               indices: list[torch.Tensor] | None = None) -> tuple[np.ndarray, np.ndarray]:
        """``(mean loss, sqrt mean loss²)`` of ``params`` on each client's samples: all of
        them, ``batch`` drawn with ``rng``, or the given ``indices``."""
        data = self.exp.data
        rows = []
        for j, c in enumerate(np.asarray(ids, dtype=np.int64)):
            idx = data.client_indices[int(c)] if indices is None else indices[j]
            if batch is not None and len(idx) > batch:
                keep = np.sort(rng.choice(len(idx), size=batch, replace=False))
                idx = idx[torch.as_tensor(keep, device=idx.device)]
            rows.append(idx.to(data.train_x.device))
        counts = [len(r) for r in rows]
        flat = torch.cat(rows)  # a sampler always asks about at least one client
        logits = predict(self.exp.network, params, data.train_x[flat],
                         self.exp.cfg.eval.batch_size)
        loss = F.cross_entropy(upcast(logits), data.train_y[flat], reduction="none")
        loss = loss.double().cpu().split(counts)
        mean = np.array([float(v.mean()) if len(v) else 0.0 for v in loss])
        rms = np.array([float(v.square().mean().sqrt()) if len(v) else 0.0 for v in loss])
        return mean, rms

    def observe(self, round_: int, params: Params, client_ids: torch.Tensor,
                sample_idx: torch.Tensor, weights: torch.Tensor, train_loss: torch.Tensor,
                durations: np.ndarray) -> None:
        """Tell the sampler what round ``round_``'s participants reported; ``params``: the
        round's starting model, ``sample_idx``/``weights``: the samples they trained on."""
        ids = client_ids.cpu().numpy().astype(np.int64)
        visited = [sample_idx[j][weights[j] > 0].unique() for j in range(len(ids))]
        rms = (self.losses(params, ids, indices=visited)[1] if self.sampler.needs_rms_loss
               else np.zeros(len(ids)))
        self.sampler.observe(round_, Feedback(
            ids, train_loss.double().cpu().numpy(), rms,
            np.array([len(v) for v in visited], dtype=np.float64), np.asarray(durations)))

    def client_seconds(self, client_ids: torch.Tensor, weights: torch.Tensor, down: float,
                       up: float) -> np.ndarray:
        """The participants' seconds on a clock without device speeds (the cost model's)."""
        steps = (weights.sum(-1) > 0).sum(-1).cpu().numpy()
        return np.array([self.cost.client_seconds(float(s), down, up) for s in steps])


def trainable(exp) -> int:
    """Clients ``0 .. n - 1`` may be selected (the ``eval.held_out`` highest ids never)."""
    return exp.data.num_clients - exp.cfg.eval.held_out
