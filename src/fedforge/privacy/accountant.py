"""ε(δ) of a run from ``dp-accounting`` (RDP or PLD), and σ chosen for a target ε.

Each mode is one :class:`dp_accounting.DpEvent` per round (see ``docs/privacy.md``):

* ``central``: clients are Poisson-sampled with rate ``q``; a round is a Poisson-subsampled
  Gaussian mechanism with multiplier σ on the sum of deltas clipped to C (add/remove one
  client). With adaptive clipping the delta sum gets the larger multiplier
  :func:`delta_multiplier`, so the two Gaussian queries together cost exactly σ.
* ``local``: each upload is a Gaussian mechanism on one client's clipped delta. Any two
  deltas of a client differ by up to 2C, so its multiplier is σ/2; the server sees who
  sent, so no amplification by sampling is claimed and a client is assumed to take part in
  every round (worst case).
* ``sample``: DP-SGD steps. An example is in exactly one batch per local epoch, so per round
  it meets ``local_epochs`` Gaussian mechanisms with multiplier σ (one example replaced by an
  example of zero gradient); shuffled batches are not Poisson samples, so no amplification
  by subsampling is claimed, and its client is assumed to take part in every round.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

try:
    import dp_accounting
    from dp_accounting import mechanism_calibration
    from dp_accounting.pld import pld_privacy_accountant
    from dp_accounting.rdp import rdp_privacy_accountant
except ImportError as e:  # pragma: no cover - optional extra
    raise ImportError("privacy: needs the dp-accounting package; "
                      "pip install 'fedforge[privacy]'") from e

from fedforge.privacy.ledger import Ledger, ledger_rounds

ACCOUNTANTS = ("rdp", "pld")
SIGMA_MIN = 0.1  # below this the PLD discretisation explodes; such σ give no useful privacy
SIGMA_MAX = 1000.0  # a resume needing more noise than this is refused (the model is noise)


def make_accountant(kind: str) -> dp_accounting.PrivacyAccountant:
    """A fresh ``dp-accounting`` accountant (add/remove-one neighbouring). PLD losses are
    discretised to 1e-3 (pessimistically, so ε is an upper bound): at the default 1e-4 a
    σ search takes minutes, and ε moves by under 0.1 %."""
    if kind == "rdp":
        return rdp_privacy_accountant.RdpAccountant()
    if kind == "pld":
        return pld_privacy_accountant.PLDAccountant(value_discretization_interval=1e-3)
    raise ValueError(f"privacy.accountant: expected one of {ACCOUNTANTS}, got {kind!r}")


def delta_multiplier(sigma: float, count_noise: float) -> float:
    """σ_Δ of the delta sum when the unclipped count (sensitivity ½ after centring, noise std
    σ_b) shares the budget: ``σ_Δ = (σ⁻² − (2σ_b)⁻²)^(-1/2)`` (Andrew et al. 2021, Thm 1)."""
    if sigma <= 0:
        return 0.0
    rest = sigma ** -2 - (2.0 * count_noise) ** -2
    if rest <= 0:
        raise ValueError(f"privacy.count_noise: {count_noise} is too small for noise_multiplier "
                         f"{sigma} (need count_noise > noise_multiplier / 2)")
    return rest ** -0.5


@dataclass(frozen=True)
class RunEvents:
    """How one round of a run spends privacy (the accountant's view of a mode)."""

    mode: str  # central | local | sample
    rate: float  # q, Poisson client sampling rate (central); 1 otherwise
    steps_per_round: int  # Gaussian mechanisms per round per protected unit

    def round_event(self, sigma: float) -> dp_accounting.DpEvent:
        if self.mode == "central":
            return dp_accounting.PoissonSampledDpEvent(self.rate,
                                                       dp_accounting.GaussianDpEvent(sigma))
        if self.mode == "local":
            return dp_accounting.GaussianDpEvent(sigma / 2.0)
        if self.mode == "sample":
            return dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(sigma),
                                                     self.steps_per_round)
        raise ValueError(f"privacy.mode: no accountant for mode {self.mode!r}")

    def event(self, sigma: float, rounds: int) -> dp_accounting.DpEvent:
        return dp_accounting.SelfComposedDpEvent(self.round_event(sigma), rounds)


def ledger_event(ledger: Ledger) -> dp_accounting.DpEvent:
    """The composition of every span of ``ledger``, each with its own σ, q and steps."""
    return dp_accounting.ComposedDpEvent([
        RunEvents(s.mode, s.rate, s.steps).event(s.sigma, s.rounds) for s in ledger])


def spent_epsilon(ledger: Ledger, delta: float, kind: str) -> float:
    """ε(δ) of the rounds in ``ledger`` (inf where a span had no noise)."""
    if not ledger:
        return 0.0
    if any(s.sigma <= 0 for s in ledger):
        return math.inf
    acc = make_accountant(kind)
    acc.compose(ledger_event(ledger))
    return float(acc.get_epsilon(delta))


def epsilon(events: RunEvents, sigma: float, rounds: int, delta: float, kind: str,
            spent: Ledger = ()) -> float:
    """ε(δ) after the rounds of ``spent`` and then ``rounds`` rounds with noise multiplier σ
    (inf without noise)."""
    if rounds <= 0:
        return spent_epsilon(spent, delta, kind)
    if sigma <= 0 or any(s.sigma <= 0 for s in spent):
        return math.inf
    acc = make_accountant(kind)
    if spent:
        acc.compose(ledger_event(spent))
    acc.compose(events.event(sigma, rounds))
    return float(acc.get_epsilon(delta))


def calibrate_sigma(events: RunEvents, rounds: int, delta: float, target: float,
                    kind: str, spent: Ledger = ()) -> float:
    """The smallest σ (to 1e-3) whose ε(δ) after the rounds of ``spent`` and ``rounds`` more
    is at most ``target`` (``dp-accounting``'s Brent search, from σ = 0.1 up)."""
    if epsilon(events, SIGMA_MIN, rounds, delta, kind, spent) <= target:
        raise ValueError(f"privacy.target_epsilon: {target} is reached with noise_multiplier "
                         f"below {SIGMA_MIN}; set privacy.noise_multiplier instead")
    prior = [ledger_event(spent)] if spent else []
    make_event: Callable = lambda s: dp_accounting.ComposedDpEvent(  # noqa: E731
        [*prior, events.event(s, rounds)])
    sigma = mechanism_calibration.calibrate_dp_mechanism(
        lambda: make_accountant(kind), make_event, target, delta,
        bracket_interval=mechanism_calibration.LowerEndpointAndGuess(SIGMA_MIN, 1.0),
        tol=1e-3)
    return float(sigma)


def rounds_within(events: RunEvents, sigma: float, rounds: int, delta: float, target: float,
                  kind: str, spent: Ledger = ()) -> int:
    """The last round ``t <= rounds`` with ε(δ) after t rounds at most ``target``: the rounds
    of ``spent`` first, then σ (ε grows with t, so a bisection). The ledger's own rounds
    are never undone: at least ``ledger_rounds(spent)``."""
    done = ledger_rounds(spent)
    if epsilon(events, sigma, rounds - done, delta, kind, spent) <= target:
        return rounds
    lo, hi = done, rounds  # eps(lo) <= target < eps(hi), or lo is the ledger's end
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if epsilon(events, sigma, mid - done, delta, kind, spent) <= target:
            lo = mid
        else:
            hi = mid
    return lo
