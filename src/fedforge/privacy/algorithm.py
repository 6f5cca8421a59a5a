"""A differentially private algorithm: any algorithm plus one server stage and client hooks.

:func:`privatize` wraps a built :class:`~fedforge.protocol.algorithm.Algorithm` in
:class:`PrivateAlgorithm`, which carries the run's :class:`Mechanism`. The engine's pure
local round asks it for DP-SGD gradients and for the clipped (and, locally, noised) delta;
the round weights clipped deltas by ``1/(qN)`` (central); the server chain gains a first
stage, ``privacy``, which adds the central noise to the aggregate before the server
optimizer, updates an adaptive clip, and counts rounds for the accountant.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from functools import cached_property
from pathlib import Path

import numpy as np
import torch

from fedforge.core.tree import Params
from fedforge.engine.base import CohortOutput
from fedforge.engine.draw import CohortMetrics
from fedforge.engine.round import RoundResult
from fedforge.privacy.accountant import (
    SIGMA_MAX,
    RunEvents,
    calibrate_sigma,
    delta_multiplier,
    epsilon,
    rounds_within,
    spent_epsilon,
)
from fedforge.privacy.checks import check_algorithm, warn_weak
from fedforge.privacy.config import PrivacyConfig
from fedforge.privacy.ledger import (
    Ledger,
    Span,
    append,
    check_rerun,
    check_spent,
    from_meta,
    last_epsilon,
    ledger_rounds,
    to_meta,
    truncate,
)
from fedforge.privacy.mechanisms import add_noise, clip_tree, dp_sgd_grad
from fedforge.protocol.algorithm import Algorithm
from fedforge.server.chain import Aggregate, ServerChain, ServerTransform

KEY = "privacy_key"  # per-client round input: the key of that client's noise


@dataclass(frozen=True)
class Mechanism:
    """The resolved privacy settings of one run (σ chosen, q known)."""

    cfg: PrivacyConfig
    sigma: float  # the noise multiplier the accountant is charged
    rate: float  # q = clients_per_round / population (Poisson client sampling)
    num_clients: int  # N
    events: RunEvents
    seed: int = 0
    spent: Ledger = ()  # the rounds already run (a resumed checkpoint's ledger), each its own σ

    @property
    def mode(self) -> str:
        return self.cfg.mode

    @property
    def expected_cohort(self) -> float:
        return self.rate * self.num_clients

    @property
    def count_noise(self) -> float:
        """σ_b of the adaptive clip's unclipped count (Andrew et al.: expected cohort / 20)."""
        return self.cfg.count_noise or self.expected_cohort / 20.0

    @property
    def delta_sigma(self) -> float:
        """The multiplier of the noise on the delta sum (σ, or σ_Δ with adaptive clipping)."""
        if self.cfg.adaptive:
            return delta_multiplier(self.sigma, self.count_noise)
        return self.sigma

    def ledger(self, rounds: int) -> Ledger:
        """What rounds ``1..rounds`` spend: the checkpoint's spans, then this run's σ."""
        done = ledger_rounds(self.spent)
        ours = Span(done + 1, rounds, self.mode, self.sigma, self.events.rate,
                    self.events.steps_per_round)
        return append(truncate(self.spent, rounds), ours)

    def ledger_meta(self, rounds: int) -> dict:
        """The checkpoint meta's ``privacy`` table after ``rounds`` rounds."""
        return to_meta(self.ledger(rounds))

    def epsilon(self, rounds: int) -> float:
        """ε(δ) after ``rounds`` rounds: the composition of the mechanism of every round."""
        return spent_epsilon(self.ledger(rounds), self.cfg.delta, self.cfg.accountant)

    def last_round(self, rounds: int) -> int:
        """With both σ and ``target_epsilon``: the last round whose ε stays within the target
        (the run stops there); otherwise ``rounds``. Refused when not one more round fits,
        rather than a run of no rounds."""
        cfg = self.cfg
        if cfg.target_epsilon is None or cfg.noise_multiplier is None:
            return rounds
        done = ledger_rounds(self.spent)
        last = rounds_within(self.events, self.sigma, rounds, cfg.delta, cfg.target_epsilon,
                             cfg.accountant, self.spent)
        if last <= done < rounds:
            spent = (f"ε = {self.epsilon(done):.4f} is already spent in rounds 1-{done}, and "
                     if done else "")
            raise ValueError(f"privacy.target_epsilon: {spent}round {done + 1} at "
                             f"noise_multiplier {self.sigma} would spend ε = "
                             f"{self.epsilon(done + 1):.4f} > {cfg.target_epsilon}")
        return last

    def continued(self, spent: Ledger, rounds: int, source: str) -> Mechanism:
        """This mechanism resumed after the checkpoint ledger ``spent`` (read from
        ``source``), for a run of ``rounds`` rounds in all. With ``target_epsilon`` alone, σ
        stays the last span's while the remaining rounds fit within the target, and is
        re-calibrated for them (ledger included) otherwise; refused when nothing fits."""
        cfg, done = self.cfg, ledger_rounds(spent)
        mech = replace(self, spent=spent)
        if cfg.noise_multiplier is not None or not spent:
            return mech  # a fixed σ: last_round stops the run within the target
        left, target = rounds - done, cfg.target_epsilon
        kept = replace(mech, sigma=spent[-1].sigma)  # an unbroken run's σ, while it fits
        if left <= 0 or kept.epsilon(rounds) <= target:
            return kept
        if epsilon(self.events, SIGMA_MAX, left, cfg.delta, cfg.accountant, spent) > target:
            raise ValueError(f"{source}: ε = {mech.epsilon(done):.4f} is already spent in "
                             f"rounds 1-{done}; {left} more rounds would exceed "
                             f"privacy.target_epsilon = {target} even at noise_multiplier "
                             f"{SIGMA_MAX:g}")
        sigma = calibrate_sigma(self.events, left, cfg.delta, target, cfg.accountant, spent)
        return replace(mech, sigma=sigma)

    # --- sampling and weights -------------------------------------------------------
    def sample_cohort(self, generator: torch.Generator) -> torch.Tensor:
        """Poisson sampling: each client independently with probability q (sorted ids)."""
        keep = torch.rand(self.num_clients, generator=generator) < self.rate
        return torch.nonzero(keep).flatten()

    def aggregation_weights(self, weights: torch.Tensor) -> torch.Tensor:
        """Central DP: every clipped delta weighs ``1/(qN)`` (the expected cohort), so one
        client moves the mean by at most ``C/(qN)`` whatever the cohort drawn."""
        if self.mode != "central":
            return weights
        return torch.full_like(weights, 1.0 / self.expected_cohort)

    def empty_round(self, algorithm: Algorithm, params: Params, server_state, num_clients: int,
                    round_: int):
        """A round whose Poisson cohort is empty: no client trains, but the server step still
        runs on a zero sum (central DP releases the noise; the accountant counts the round)."""
        zeros = {k: torch.zeros_like(v) for k, v in params.items()}
        empty = torch.zeros(0, dtype=next(iter(params.values())).dtype)
        uploads = ({"privacy": {"unclipped": empty.new_zeros(())}} if self.cfg.adaptive
                   else {})
        new_params, new_state = algorithm.server_step(
            params, server_state, Aggregate(zeros, uploads, 0, num_clients, round_))
        cohort = CohortOutput(zeros, {}, {}, CohortMetrics.empty(empty), None)
        return RoundResult(new_params, new_state, cohort)

    # --- client side (inside the pure local round) --------------------------------------
    def step_grad(self, grad_and_loss: Callable, loss_fn: Callable, info: dict) -> Callable:
        """``(params, x, y, w, step) -> (grads, loss)``: DP-SGD in mode ``sample``."""
        if self.mode != "sample":
            return lambda params, x, y, w, step: grad_and_loss(params, x, y, w)
        dp_grad = dp_sgd_grad(loss_fn, self.cfg.clip, self.sigma)
        return lambda params, x, y, w, step: dp_grad(params, x, y, w, info[KEY], step)

    def client_delta(self, delta: Params, broadcast: dict, info: dict) -> tuple[Params, dict]:
        """The delta a client uploads, and its privacy uploads (the adaptive clip's bit)."""
        if self.mode not in ("central", "local"):
            return delta, {}
        clip = broadcast["privacy"]["clip"]
        clipped, norm = clip_tree(delta, clip)
        if self.mode == "local":
            clipped = add_noise(clipped, self.sigma * clip, info[KEY], -1)
        unclipped = (norm <= clip).to(norm.dtype)
        return clipped, ({"privacy": {"unclipped": unclipped}} if self.cfg.adaptive else {})

    # --- server side ----------------------------------------------------------------------
    def stage(self, kept: Callable[[Params], frozenset[str]] | None = None) -> ServerTransform:
        """The server stage: central noise on the aggregate, adaptive clip, round count.
        ``kept(params)`` names leaves no client ever sends (a personalised method's own
        leaves, zero in every delta): they carry no data, so they get no noise."""

        def init(params: Params) -> dict:
            dtype = next(iter(params.values())).dtype
            device = next(iter(params.values())).device
            return {"clip": torch.tensor(self.cfg.clip, dtype=dtype, device=device),
                    "rounds": torch.zeros((), dtype=torch.int64, device=device)}

        def update(params: Params, agg: Aggregate, state: dict):
            clip = state["clip"]
            new = {"clip": clip, "rounds": state["rounds"] + 1}
            if self.mode != "central":
                return params, agg, new
            gen = self._generator(agg.round)
            m = self.expected_cohort
            std = self.delta_sigma * clip / m  # N(0, σ²C²) on the sum -> σC/(qN) on the mean
            skip = kept(agg.delta) if kept is not None else frozenset()
            delta = {}
            for k, v in agg.delta.items():  # every leaf draws, so the stream stays the same
                noise = _randn(v, gen)
                delta[k] = v if k in skip else v + std * noise
            if self.cfg.adaptive:  # Andrew et al. 2021: geometric update toward the quantile
                count = agg.uploads["privacy"]["unclipped"] * agg.num_sampled
                noisy = (count + self.count_noise * _randn(count, gen)) / m
                new["clip"] = clip * torch.exp(-self.cfg.clip_lr
                                               * (noisy - self.cfg.target_quantile))
            return params, agg._replace(delta=delta), new

        return ServerTransform("privacy", init, update)

    def _generator(self, round_: int) -> torch.Generator:
        state = np.random.SeedSequence([self.seed, round_, 0x5EC]).generate_state(1)[0]
        return torch.Generator().manual_seed(int(state))


def _randn(like: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """Server noise, drawn on the CPU from the round's generator (device independent)."""
    return torch.randn(like.shape, generator=gen, dtype=like.dtype).to(like.device)


@dataclass(frozen=True)
class PrivateAlgorithm(Algorithm):
    """``algorithm`` under a privacy :class:`Mechanism` (same parts, one more server stage)."""

    privacy: Mechanism | None = None  # Algorithm.privacy, narrowed to this package's type

    @cached_property
    def server(self) -> ServerChain:
        inner = Algorithm.server.func(self)  # type: ignore[attr-defined]
        kept = None if self.personal is None else self.personal.kept_names
        return ServerChain((self.privacy.stage(kept), *inner.stages))

    def broadcast(self, server_state) -> dict:
        return {**super().broadcast(server_state),
                "privacy": {"clip": server_state["privacy"]["clip"]}}

    def round_info(self, num_sampled: int, generator: torch.Generator) -> dict:
        info = super().round_info(num_sampled, generator)
        info[KEY] = torch.randint(0, 2**31 - 1, (num_sampled,), generator=generator)
        return info

    def server_metrics(self, server_state, client_states: dict) -> dict:
        out = super().server_metrics(server_state, client_states)
        rounds = int(server_state["privacy"]["rounds"])
        out.update({"dp_epsilon": self.privacy.epsilon(rounds),
                    "dp_noise_multiplier": self.privacy.sigma,
                    "dp_clip": float(server_state["privacy"]["clip"])})
        return out


def resolve(cfg: PrivacyConfig, rounds: int, clients_per_round: int, num_clients: int,
            local_epochs: int | None, seed: int = 0) -> Mechanism:
    """The run's mechanism: q, the accountant's events, and σ (given, or calibrated to
    ``target_epsilon`` over ``rounds`` rounds)."""
    rate = min(1.0, clients_per_round / num_clients)
    events = RunEvents(cfg.mode, rate if cfg.mode == "central" else 1.0, local_epochs or 1)
    sigma = cfg.noise_multiplier
    if sigma is None:
        sigma = calibrate_sigma(events, rounds, cfg.delta, cfg.target_epsilon, cfg.accountant)
    mech = Mechanism(cfg, float(sigma), rate, num_clients, events, seed)
    mech.delta_sigma  # noqa: B018 (refuses a count_noise too small for σ now, not mid-run)
    warn_weak(cfg, num_clients)
    return mech


def resume(algorithm: PrivateAlgorithm, source: Path | str, meta: dict,
           rounds: int) -> PrivateAlgorithm:
    """``algorithm`` continuing the ledger of the checkpoint ``meta`` (read from ``source``)
    in a run of ``rounds`` rounds in all: earlier rounds are charged at the σ they ran
    with, and σ for the rest is chosen so that the whole run stays within the target."""
    spent, metrics = from_meta(meta, source), Path(source).parent.parent / "metrics.jsonl"
    run = algorithm.privacy
    # the ledger is checked, not trusted: a received folder may have been edited
    fixed = {} if run.cfg.noise_multiplier is None else {"sigma": run.sigma}
    check_spent(spent, {"mode": run.mode, "rate": run.events.rate,
                        "steps": run.events.steps_per_round, **fixed}, source, metrics)
    mech = run.continued(spent, rounds, str(source))
    mech.delta_sigma  # noqa: B018 (a re-calibrated σ may need a larger count_noise)
    check_rerun(spent, mech.sigma, metrics)
    _check_epsilon_kept(mech, source, metrics)
    return replace(algorithm, privacy=mech)


def _check_epsilon_kept(mech: Mechanism, source: Path | str, metrics: Path) -> None:
    """Refuse a resume that would report a smaller ε for a round than ``metrics`` already
    reported: the earlier rounds were released at that ε, so a lower one means the
    checkpoint's ledger is not what they spent."""
    last = last_epsilon(metrics)
    if last is None:
        return
    t, reported = last
    now = mech.epsilon(t)
    if now < reported * (1 - 1e-6):  # the same events compose to the same ε
        raise ValueError(f"{source}: checkpoint field 'privacy.ledger' gives ε = {now:.4f} "
                         f"after round {t}, below the ε = {reported:.4f} that {metrics} "
                         f"recorded; a resume never lowers the reported ε")


def privatize(algorithm: Algorithm, mechanism: Mechanism, template: Params) -> PrivateAlgorithm:
    """``algorithm`` with ``mechanism`` (refused when DP is ill-defined for it)."""
    check_algorithm(algorithm, template, mechanism.cfg)
    kwargs = {f.name: getattr(algorithm, f.name) for f in fields(algorithm)}
    return PrivateAlgorithm(**{**kwargs, "privacy": mechanism})


def for_run(run, algorithm: Algorithm, num_clients: int, template: Params) -> PrivateAlgorithm:
    """The private algorithm of RunConfig ``run`` on a population of ``num_clients``."""
    mech = resolve(run.privacy, run.rounds, run.server.clients_per_round, num_clients,
                   run.client.local_epochs, run.seed)
    return privatize(algorithm, mech, template)
