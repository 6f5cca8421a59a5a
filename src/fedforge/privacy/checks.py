"""Config-time refusals: where differential privacy is ill-defined or not served.

No ``dp-accounting`` import here, so a config is checked without the ``privacy`` extra.
"""

from __future__ import annotations

import importlib.util
import warnings

import torch

from fedforge.core.tree import Params
from fedforge.errors import ConfigError
from fedforge.privacy.config import PrivacyConfig
from fedforge.protocol.algorithm import NEEDS, Algorithm

WEAK_SIGMA = 0.3  # below this a noise multiplier gives a guarantee that means little


class PrivacyWarning(UserWarning):
    """A private run whose guarantee is formally valid but means little."""


# what each mode cannot protect: values the server would use without noise
REFUSED = {
    "central": frozenset({"uploads", "codec", "prepare", "full_participation"}),
    "local": frozenset({"uploads", "codec", "prepare", "full_participation"}),
    "sample": frozenset({"prepare", "full_participation"}),
}


def check_algorithm(algorithm: Algorithm, template: Params | None, cfg: PrivacyConfig
                    ) -> None:
    """Refuse, in one line naming the algorithm and the field, what DP cannot protect.
    ``template`` None: the model is not known yet (a config being loaded), so what depends
    on its parameters is left to the check when the run is built."""
    personal = algorithm.personal
    if cfg.mode == "sample" and personal is not None and not personal.covered_by_dp_sgd():
        raise ValueError(f"privacy.mode: 'sample' is ill-defined for algorithm "
                         f"{algorithm.name!r}: its shared model trains on gradients DP-SGD "
                         f"does not noise or after personal passes the accountant does not "
                         f"charge; use mode 'central' or 'local'")
    if cfg.mode == "sample" and algorithm.objective is not None:
        raise ValueError(f"privacy.mode: 'sample' is ill-defined for algorithm "
                         f"{algorithm.name!r}: its local loss is its own, whose gradient "
                         f"DP-SGD does not clip or noise; use mode 'central' or 'local'")
    if template is None:
        return
    refused = sorted(algorithm.needs(template) & REFUSED[cfg.mode])
    if refused:
        what = ", ".join(NEEDS.get(n, n) for n in refused)
        raise ValueError(f"privacy.mode: {cfg.mode!r} is ill-defined for algorithm "
                         f"{algorithm.name!r}: it needs {what}, which the server would use "
                         f"without noise")


def warn_weak(cfg: PrivacyConfig, num_clients: int) -> None:
    """Warn, in one line naming the field, where the settings make ε(δ) meaningless: δ of
    1/N or more allows releasing one of the N clients' data outright, and σ far below 0.3
    makes ε explode within a few rounds."""
    if cfg.delta >= 1.0 / num_clients:
        _warn(f"privacy.delta: {cfg.delta} is at least 1/num_clients = 1/{num_clients}, so "
              f"the guarantee means little (a mechanism may reveal a whole client with "
              f"probability δ); use δ well below 1/{num_clients}")
    if cfg.noise_multiplier is not None and cfg.noise_multiplier < WEAK_SIGMA:
        _warn(f"privacy.noise_multiplier: {cfg.noise_multiplier} is below {WEAK_SIGMA}, so "
              f"the guarantee means little (ε grows past any useful value within a few "
              f"rounds)")


def _warn(message: str) -> None:
    """One line on stderr ("fedforge:0: PrivacyWarning: ..."), without Python's echo of a
    source line, which would name this file rather than the config."""
    warnings.warn_explicit(message, PrivacyWarning, "fedforge", 0)


def check_run(run) -> None:
    """Config-time refusals that involve other sections (``run`` is a RunConfig)."""
    p = run.privacy
    if not p.on:
        return
    if p.mode in ("central", "local") and run.server.aggregator != "mean":
        raise ValueError(f"server.aggregator: {run.server.aggregator!r} is not the mean; "
                         f"privacy mode {p.mode!r} bounds only the mean's sensitivity")
    if run.divergence == "rollback":
        raise ValueError("divergence: 'rollback' re-runs rounds, which spends privacy budget "
                         "twice; use 'stop' or 'skip_client' with privacy")
    if p.mode == "central" and run.divergence != "stop":
        raise ValueError(f"divergence: {run.divergence!r} reweights the remaining clients, "
                         f"which breaks central DP's fixed 1/(qN) weights; use 'stop'")
    if p.mode == "sample" and run.client.local_epochs is None:
        raise ValueError("privacy.mode: 'sample' needs client.local_epochs (with local_steps "
                         "a small client's examples repeat within a batch)")
    if run.engine.name == "distributed":
        raise ValueError("engine.name: privacy runs on the loop and vmap engines only")


def check_privacy(run, algorithm: Algorithm) -> None:
    """Every privacy refusal for RunConfig ``run`` whose algorithm is ``algorithm``, raised
    as the config's one-line error."""
    if not run.privacy.on:
        return
    try:
        if importlib.util.find_spec("dp_accounting") is None:
            raise ValueError("privacy: needs the dp-accounting package; pip install "
                             "'fedforge[privacy]'")
        check_run(run)
        # a personalised method's client state depends on the model's head, not known
        # here (and none of them sends more than its delta): checked again when built
        template = (None if algorithm.personal is not None
                    else {"weight": torch.zeros(2, 2), "bias": torch.zeros(2)})
        check_algorithm(algorithm, template, run.privacy)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
